"""The accepting commands' checks, at the edge: every option and input checked before any work
(a usage error exits 3 before the engine, a registry or the image is asked anything), the
outputs the options ask for built, the driver they name made. The use case (imagegate.usecases.accept)
gets checked, typed values (accept.Request) and checks nothing of the command line."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from imagegate.errors import UsageError

if TYPE_CHECKING:  # imported where used: `--help` never loads the use case, the drivers or keys
    from imagegate.attest import keys
    from imagegate.drivers.interface import Driver
    from imagegate.drivers.select import DriverName, DriverOptions
    from imagegate.usecases.accept import Outputs
    from imagegate.usecases.runner import Notify, Prepared


def _silent(_m: str) -> None:
    pass


def outputs(
    reports: Sequence[str] = (),
    *,
    key: str | None = None,
    no_sign: bool = False,
    attach: bool = False,
    insecure: bool = False,
    require_complete: bool = False,
    reference: str | None = None,
    statement_on_stdout: bool = False,
    notify: Notify = _silent,
    warn: Notify = _silent,
    attach_later: bool = False,
) -> Outputs:
    """The outputs the options ask for, checked before the work: a bad report path, key or
    passphrase fails first, not after the run. `statement_on_stdout` (--format json): no report
    may go there too. `attach_later`: --attach to an image known only later (complete: the
    earlier attempt's), which needs a key as `attach` does."""
    from imagegate.report import formats
    from imagegate.usecases.accept import Outputs, check_outputs

    check_outputs(Outputs(attach=attach), reference, no_sign=no_sign, keyed=False)  # the key: below
    specs = formats.parse_specs(list(reports))
    if statement_on_stdout and any(p == formats.STDOUT for _, p in specs):
        raise UsageError(
            "--format json and --report FORMAT=- both want stdout", hint="write the report to a file"
        )
    key_ = None if no_sign else _signing_key(key, notify, warn, attaching=attach or attach_later)
    return Outputs(key_, attach, insecure, specs, require_complete, formats.writer(specs))


def alert(message: str) -> None:
    """A use case's line that goes with its exit code, even when quiet."""
    print(f"imagegate: {message}", file=sys.stderr)


def _signing_key(key: str | None, notify: Notify, warn: Notify, *, attaching: bool) -> keys.SigningKey | None:
    """With no key named and no default key possible (a read-only home), the run goes on
    unsigned and says so (`warn`): the verdict and its evidence are still written. Not with
    --attach, whose statements could be neither signed nor attached: refused before the run."""
    from imagegate.attest import keys

    try:
        found = keys.resolve_signing_key(key, notify=notify)
    except keys.DefaultKeyUnavailable as e:
        if attaching:
            raise UsageError(
                f"--attach pushes signed statements, and nothing can sign them: {e}",
                hint=f"pass --key PATH or set {keys.KEY_ENV} (without --attach the run goes on unsigned)",
            ) from e
        warn(f"the attempt will not be signed: {e}\n  hint: {e.hint}")
        return None
    _non_dumpable()
    return found


def _non_dumpable() -> None:
    """While this process holds a private key, a process of the same user (a probe, whatever it
    started) cannot read its memory, descriptors or environment through /proc, nor ptrace it:
    prctl(PR_SET_DUMPABLE, 0). Linux only; elsewhere, or without ctypes, nothing is done."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def check_timeout(seconds: float | None) -> None:
    from imagegate.pipeline.spec import check_duration

    try:
        if seconds is not None:
            check_duration(seconds)
    except ValueError as e:
        raise UsageError(f"--timeout: {e}", hint="give seconds, e.g. --timeout 1800") from e


def check_run_input(
    image: str | None,
    name: DriverName | None,
    jobs: int | None,
    timeout: float | None,
    memory: str = "8g",
    expect_config: str | None = None,
) -> None:
    """`run`'s IMAGE, DOCKER_HOST and options are checked before the engine is asked anything."""
    from imagegate._support.sizes import parse_memory
    from imagegate.drivers.select import DriverName, needs_engine

    if name is not DriverName.here and image is None:
        raise UsageError(
            "no IMAGE given", hint="imagegate run IMAGE -p PIPELINE, or --here for this environment"
        )
    if needs_engine(name):
        from imagegate._support.enginehost import check_docker_host
        from imagegate.oci.reference import check_image

        assert image is not None
        _check_not_transport(image, name)
        check_image(image)
        check_docker_host(os.environ)
    check_timeout(timeout)
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs {jobs}: must be 1 or more")
    parse_memory(memory)
    check_expect_config(expect_config)


TRANSPORTS = ("docker://", "docker-daemon:", "docker-archive:", "oci:", "oci-archive:")


def _check_not_transport(image: str, name: DriverName | None) -> None:
    """`docker://x` to an engine driver: the user meant the rootfs driver (or the bare name)."""
    transport = next((t for t in TRANSPORTS if image.startswith(t)), None)
    if transport is None:
        return
    driver = f"--driver {name.value}" if name else "the docker driver (the default)"
    bare = image[len(transport) :]
    also = f", or name it to the engine as {bare}" if transport in ("docker://", "docker-daemon:") else ""
    raise UsageError(
        f"IMAGE {image!r}: a {transport.rstrip(':/')} transport reference, which {driver} does not read",
        hint=f"pass --driver rootfs to read it from its transport{also}",
    )


def check_rootfs_reference(image: str | None, name: DriverName | None) -> None:
    """`run --driver rootfs NAME`: a bare NAME only the local engine holds is named before any
    registry is asked (after the options' own contradictions, which the driver checks)."""
    from imagegate.drivers.select import DriverName

    if name is DriverName.rootfs and image is not None:
        _check_not_local_only(image)


def _check_not_local_only(image: str) -> None:
    """--driver rootfs reads a name without a registry host from Docker Hub: a name that only the
    local engine holds (built here, never pushed) would cost retries against Docker Hub before
    failing. Asked of the engine cheaply, only for such names; no engine, no check."""
    if image.startswith(TRANSPORTS):
        return
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return  # a registry host: the registry it names is the one to ask
    from imagegate.oci import engineapi

    try:  # the same bounded, typed engine reads as the docker driver's
        client = engineapi.connect(None, timeout=3)
        try:
            attrs = engineapi.inspect_image(client, image)
        finally:
            client.close()
    except Exception:
        return
    wanted = _hub_repository(image)
    if (
        isinstance(attrs, dict)
        and wanted is not None
        and wanted not in {_hub_repository(d) for d in attrs.get("RepoDigests") or () if isinstance(d, str)}
    ):  # pushed elsewhere (another registry) is not on Docker Hub either
        raise UsageError(
            f"IMAGE {image!r}: --driver rootfs reads it from Docker Hub, but only the local engine has it "
            "(built here, never pushed)",
            hint=f"read it from the engine: imagegate run --driver rootfs docker-daemon:{image}",
        )


def _hub_repository(name: str) -> tuple[str, str] | None:
    """The registry and repository a name stands for, as references are parsed everywhere
    (`python`, `docker.io/library/python:3` and `python@sha256:…` are one); None: not a reference."""
    from imagegate.oci.reference import BadReference, parse_reference

    try:
        ref = parse_reference(name)
    except BadReference:
        return None
    return ref.registry, ref.repository


def check_expect_config(expect_config: str | None) -> None:
    if expect_config is not None:
        from imagegate.domain.digest import check_digest

        check_digest(expect_config, what="--expect-config")


def check_stage_inputs(prep: Prepared, expect_config: str | None, *, rootfs: bool = False) -> None:
    """--expect-config is checked by the layers stage, or by the rootfs driver while unpacking:
    given to a run that has neither, it would be silently ignored."""
    check_expect_config(expect_config)
    if expect_config is None or rootfs:
        return
    if any(s.probe == "layers" and not s.skipped for s in prep.plan.stages):
        return
    raise UsageError(
        f"--expect-config given, but pipeline {prep.plan.pipeline.name!r} runs no layers stage: "
        "nothing would check it",
        hint="use a pipeline with a layers stage (e.g. -p vllm), --driver rootfs (it checks the "
        "config while unpacking), or drop --expect-config",
    )


def make_driver(name: DriverName | None, opts: DriverOptions, key: keys.SigningKey | None) -> Driver:
    """The driver the options name (drivers/select.py), under the command's deadline (an engine
    driver asks the engine now). `key`: the key that will sign (Outputs.key), which --here hides
    from the probes, or refuses to expose to them unless opts.sign_unisolated."""
    import dataclasses

    from imagegate._support import deadline
    from imagegate.drivers import select

    signing = dataclasses.replace(opts, signing=key is not None, signing_key=key.secret_file if key else None)
    with deadline.armed():
        return select.make_driver(name, signing)
