"""The acceptance use case, whatever ran the probes: prepare → observe → conclude → sign →
attach → reports. One statement value flows from the runner to the signer to the reports; the
commands (`run`, `pod run`, `pod collect`, `complete`) only parse options and render the result."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from imagegate import deadline
from imagegate.attest import keys
from imagegate.attest.sign import Signed, sign_attempt
from imagegate.drivers.interface import Driver
from imagegate.drivers.select import DriverName, DriverOptions, make_driver, needs_engine
from imagegate.errors import UsageError
from imagegate.evidence import Attempt
from imagegate.gpus import GpuRequest
from imagegate.model import EXIT_ACCEPTED, EXIT_REJECTED, ImageFacts, RunRecord, exit_code
from imagegate.runner import Notify, Observation, Prepared, conclude, new_attempt

if TYPE_CHECKING:
    from imagegate.report.provenance import Provenance

NOTHING_LEFT = (
    "nothing was left running"  # cli/_accept.py says it too, for interrupts before this is imported
)


def _silent(_m: str) -> None:
    pass


class Observer(Protocol):
    """A way to run the probes and see what happened: a driver (docker, local), a Pod, a Pod
    that already ran, an earlier attempt's deferred stages."""

    # The image reference the user named (what --attach pushes to); None: no image (run --here).
    reference: str | None

    def subject(self, prep: Prepared) -> ImageFacts:
        """The image (or environment) judged; raise UsageError when it is not there."""
        ...

    def observe(self, prep: Prepared, attempt: Attempt) -> Observation: ...

    def left_behind(self) -> str | None:
        """After an interrupt: what may still be there and how to remove it; None: nothing."""
        ...


class Interrupted(KeyboardInterrupt):
    """SIGINT (or SIGTERM, through the entry point's handlers) during the work, with what the
    observer says it may have left behind."""

    def __init__(self, left: str | None) -> None:
        self.left = left or NOTHING_LEFT
        super().__init__(self.left)


@dataclass(frozen=True)
class Outputs:
    """What happens after the verdict: signing, attaching, reports (FORMAT, PATH; `-` is stdout),
    and whether a deferred verdict is rejected (--require-complete)."""

    key: keys.SigningKey | None = None
    attach: bool = False
    insecure: bool = False  # --attach over plain HTTP
    reports: Sequence[tuple[str, Path]] = ()
    require_complete: bool = False


@dataclass(frozen=True)
class Accepted:
    record: RunRecord
    statement: dict[str, Any]  # the one written beside the evidence, signed and reported
    signed: Signed | None
    used_stdout: bool  # a report went to stdout: nothing else may
    exit_code: int  # 0 accepted, 1 rejected, 2 could not decide
    rejected_by: str | None  # what rejected a verdict that is accepted by itself (--require-complete)


def check_outputs(outputs: Outputs, reference: str | None, *, no_sign: bool = False) -> None:
    """Before any work (the key too): what cannot be done at the end is refused at the start."""
    if outputs.attach and no_sign:
        raise UsageError("--attach needs a signed attestation", hint="drop --no-sign")
    if outputs.attach and reference is None:
        raise UsageError(
            "--attach pushes the attestation to IMAGE's repository, and no IMAGE was given",
            hint="name the image the environment was built from: imagegate run --here IMAGE --attach",
        )


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
) -> Outputs:
    """The outputs the options ask for, checked before the work: a bad report path, key or
    passphrase fails first, not after the run. `statement_on_stdout` (--format json): no report
    may go there too."""
    from imagegate.report import formats

    check_outputs(Outputs(attach=attach), reference, no_sign=no_sign)
    specs = formats.parse_specs(list(reports))
    if statement_on_stdout and any(p == formats.STDOUT for _, p in specs):
        raise UsageError(
            "--format json and --report FORMAT=- both want stdout", hint="write the report to a file"
        )
    key_ = None if no_sign else _signing_key(key, notify, warn)
    return Outputs(key_, attach, insecure, specs, require_complete)


def _signing_key(key: str | None, notify: Notify, warn: Notify) -> keys.SigningKey | None:
    """With no key named and no default key possible (a read-only home), the run goes on
    unsigned and says so (`warn`): the verdict and its evidence are still written."""
    try:
        found = keys.resolve_signing_key(key, notify=notify)
    except keys.DefaultKeyUnavailable as e:
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
    from imagegate.pipeline.model import check_duration

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
    from imagegate.sizes import parse_memory

    if name is not DriverName.here and image is None:
        raise UsageError(
            "no IMAGE given", hint="imagegate run IMAGE -p PIPELINE, or --here for this environment"
        )
    if needs_engine(name):
        from imagegate.enginehost import check_docker_host
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
    if isinstance(attrs, dict) and not attrs.get("RepoDigests"):
        raise UsageError(
            f"IMAGE {image!r}: --driver rootfs reads it from Docker Hub, but only the local engine has it "
            "(built here, never pushed)",
            hint=f"read it from the engine: imagegate run --driver rootfs docker-daemon:{image}",
        )


def check_expect_config(expect_config: str | None) -> None:
    if expect_config is not None:
        from imagegate.oci.digest import check_digest

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


def accept(
    prep: Prepared, observer: Observer, out: Path, outputs: Outputs, notify: Notify = _silent
) -> Accepted:
    """Raises Interrupted (a KeyboardInterrupt) on an interrupt, saying what may be left."""
    check_outputs(outputs, observer.reference)
    try:
        return _accept(prep, observer, out, outputs, notify)
    except KeyboardInterrupt:
        raise Interrupted(observer.left_behind()) from None


@contextlib.contextmanager
def within(prep: Prepared, timeout: float | None) -> Iterator[None]:
    """The whole command under one deadline (Prepared.overall): making the driver, getting the
    image, the stages; a wait past it ends with DeadlineReached naming what it waited for."""
    with deadline.covering(prep.overall(timeout), explicit=timeout is not None):
        yield


def _accept(prep: Prepared, observer: Observer, out: Path, outputs: Outputs, notify: Notify) -> Accepted:
    with deadline.armed():  # pulling, unpacking: a stalled engine or registry is cut at the deadline
        image = observer.subject(prep)
    attempt = new_attempt(prep, image, out)
    notify(f"attempt {attempt.dir}")
    concluded = conclude(prep, observer.observe(prep, attempt), attempt, notify)
    record, statement = concluded.record, concluded.statement
    signed = None
    if outputs.key is not None:
        signed = sign_attempt(attempt.dir, statement, outputs.key)
        notify(f"signed {signed.dsse_path} with key {signed.fingerprint}")
    left = None
    if signed is not None and outputs.attach and observer.reference is not None:
        left = _attach(signed, observer.reference, image, outputs.insecure, notify)
    from imagegate.report import formats

    provenance = _provenance(attempt.dir, outputs.key) if outputs.reports else None
    try:
        used_stdout = formats.write_reports(
            record, list(outputs.reports), statement=statement, provenance=provenance
        )
    except OSError as e:
        raise UsageError(f"writing a report: {e}", hint="check the --report paths") from e
    code = exit_code(record.verdict, require_complete=outputs.require_complete)
    rejected_by = "--require-complete" if code != exit_code(record.verdict) else None
    if left is not None and code == EXIT_ACCEPTED:
        # Attached, but beside earlier statements a controller still reads: not admitted as it is.
        code, rejected_by = EXIT_REJECTED, "--attach left earlier statements (named above)"
    return Accepted(record, statement, signed, used_stdout, code, rejected_by)


def _provenance(folder: Path, key: keys.SigningKey | None) -> Provenance:
    """What vouches for the attempt the reports show, as `imagegate report --key` would say it:
    the envelope just written, read back and checked with the signing key's public half."""
    from imagegate.report import load

    return load.read_attempt(folder, key.public if key is not None else None).provenance


def driver_for(
    *,
    here: bool,
    name: DriverName | None = None,
    python: str | None = None,
    memory: str = "8g",
    pull: str = "missing",
    gpus: GpuRequest | None = None,
    notify: Notify = _silent,
    expect_config: str | None = None,
    insecure: bool = False,
    key: keys.SigningKey | None = None,
    sign_unisolated: bool = False,
    cache_dir: str | None = None,
    model: Path | None = None,
) -> Driver:
    """The driver the options name (drivers/select.py): --here is the local driver; the default
    an engine (docker). `key`: the key that will sign (Outputs.key), which --here hides from the
    probes, or refuses to expose to them unless `sign_unisolated`."""
    chosen = DriverName.here if here else name
    opts = DriverOptions(
        memory,
        pull,
        notify,
        gpus,
        python,
        expect_config,
        insecure=insecure,
        signing=key is not None,
        signing_key=key.path if key else None,
        sign_unisolated=sign_unisolated,
        cache_dir=cache_dir,
        model=model,
    )
    with deadline.armed():  # an engine driver asks the engine now
        return make_driver(chosen, opts)


def _attach(signed: Signed, reference: str, image: ImageFacts, insecure: bool, notify: Notify) -> str | None:
    """Attach the acceptance, the VSA and the test-result; each replaces the earlier ones of its
    type and pipeline. Returns what a registry refused to delete, as a message; None otherwise."""
    from imagegate.attest import attach, referrers
    from imagegate.report import console_attest

    ref = attach.parse_image(reference)
    if image.index_digest and image.manifest_digest and image.repository:
        # The reference names an index: the statements are about the platform's manifest that
        # ran, and attach to it (the index is no subject of theirs).
        ran = attach.parse_image(image.repository)
        if (ran.registry, ran.repository) == (ref.registry, ref.repository):
            ref = ref.with_digest(image.manifest_digest)
    with attach.client_for(ref, insecure=insecure) as client:
        # The standard statements too: admission policies are written against them.
        pairs = [
            referrers.attach_and_refer(client, ref, envelope, signed.material)
            for envelope in (signed.envelope, *signed.standard)
        ]
    done, referred = pairs[-1]
    notify(
        f"attached to {done.reference} ({done.tag}, {done.layers} attestation(s); referrers via {referred.via})"
    )
    gone = [g.describe() for d, r in pairs for g in (*d.replaced, *r.replaced)]
    if gone:
        notify(f"replaced {', '.join(gone)}: {console_attest.REPLACED_KEPT}")
    left = console_attest.remaining(pairs, ref.repository)
    if left is not None:
        print(f"imagegate: {left}", file=sys.stderr)
    return left
