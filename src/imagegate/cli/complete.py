"""Command: complete."""

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from imagegate._support.sizes import parse_memory
from imagegate.cli import _accept as o
from imagegate.cli._app import EVIDENCE_HELP, INSECURE, TRUST, TRUSTED_KEYS, Format, Option, app
from imagegate.cli._identity import Identity
from imagegate.domain import servemodel as modelpath
from imagegate.domain.gpus import parse as gpus_parse
from imagegate.errors import UsageError

if TYPE_CHECKING:  # imported where used: `complete --help` loads none of the layers below
    from imagegate._support.jsontypes import JsonMapping
    from imagegate.attest import keys
    from imagegate.domain.gpus import GpuRequest
    from imagegate.drivers.interface import Driver
    from imagegate.drivers.select import DriverName
    from imagegate.usecases import accept
    from imagegate.usecases.complete import Earlier


@dataclasses.dataclass(frozen=True)
class Completing:
    """complete's request: its options, checked before anything is verified or run."""

    gpus: str | None = o.GPUS
    here: bool = Option(False, "--here", help="Run in this environment: the same as --driver here.")
    driver: str | None = o.DRIVER
    python: str | None = o.PYTHON
    sign_unisolated: bool = o.SIGN_UNISOLATED
    out: Path | None = Option(None, "--out", "-o", metavar="FOLDER", help=EVIDENCE_HELP)
    timeout: float | None = o.TIMEOUT
    memory: str = o.MEMORY
    pull: str | None = Option(None, "--pull", help=o.PULL_HELP)
    require_complete: bool = o.REQUIRE_COMPLETE
    key: list[str] = o.KEY
    trust: list[Path] = TRUST
    trusted_keys: list[Path] = TRUSTED_KEYS
    no_sign: bool = o.NO_SIGN
    attach: bool = o.ATTACH
    insecure: bool = INSECURE
    fmt: Format = o.FORMAT
    report: list[str] = o.REPORT
    quiet: bool = o.QUIET
    model: Path | None = o.MODEL

    def outputs(self, notify: o.Notify) -> "accept.Outputs":
        from imagegate.cli import _checks

        _checks.check_timeout(self.timeout)
        parse_memory(self.memory)
        return _checks.outputs(
            self.report,
            statement_on_stdout=self.fmt is Format.json,
            key=o.signing_key(self.key),
            no_sign=self.no_sign,
            require_complete=self.require_complete,
            notify=notify,
            warn=o.warn,
            attach_later=self.attach,  # to the earlier attempt's image, known once it is read
        )

    def make_driver(
        self,
        earlier: "Earlier",
        outputs: "accept.Outputs",
        name: "DriverName | None",
        gpu: "GpuRequest | None",
        mounted: Path | None,
        notify: o.Notify,
    ) -> "Driver":
        """The driver of the deferred stages: the rootfs one reads the transport the earlier attempt
        judged (no engine), and unpacks the root only when its config digest is the one judged."""
        from imagegate.cli import _checks
        from imagegate.drivers.select import DriverName, DriverOptions

        rootfs = name is DriverName.rootfs
        was = earlier.acceptance.image
        opts = DriverOptions(
            self.memory,
            self.pull or ("missing" if rootfs else "never"),
            notify,
            gpu,
            self.python,
            expect_config=was.config_digest if rootfs else None,
            sign_unisolated=self.sign_unisolated,
            model=mounted,  # --here: bound in where it is, when it lives under /tmp
        )
        return _checks.make_driver(name, opts, outputs.key)


@app.command(
    epilog="Examples:\n\n"
    "  imagegate complete imagegate-runs/sha256-ab12…/20260101T000000.000Z-1a2b3c --gpus all\n\n"
    "  imagegate complete runs/ref-local/20260101T000000.000Z-1a2b3c --here --gpus all\n\n"
    "  imagegate complete runs/sha256-ab12…/20260101T000000.000Z-1a2b3c --driver rootfs --gpus all\n\n"
    "  imagegate complete runs/sha256-ab12…/20260101T000000.000Z-1a2b3c --gpus all --key gpu.key --trust ci.pub\n\n"
    "  imagegate complete runs/sha256-ab12…/20260101T000000.000Z-1a2b3c --gpus all --key gpu.key "
    "--identity https://github.com/org/repo/.github/workflows/gate.yml@refs/heads/main "
    "--issuer https://token.actions.githubusercontent.com --trusted-root trusted_root.json   # a CI that signed keyless\n\n"
    "First verifies ATTEMPT as verify does (the signature with a trusted key: --trust, "
    "--trusted-keys, the key its certificate proves was the identity's (--identity, --issuer, "
    "--trusted-root), else the public half of the signing key; the statement; every evidence file; "
    "its own link): one that does not verify is refused (exit 1) before anything is written. "
    "Then runs exactly the stages ATTEMPT deferred (after the GPU node check when --gpus is given), "
    "with its own pipeline and plan, against the same image (refused, exit 3, when its ID or "
    "digest differs; with --here, the same interpreter and distributions). Writes a new attempt "
    "beside the earlier one whose signed statement links it and whose verdict covers both; the "
    "earlier attempt is never changed. --attach pushes the completion's acceptance, VSA and "
    "test-result to the image the earlier attempt judged in its registry, as run --attach does, "
    "replacing the deferred statements of the same pipeline there. Exit codes as for run."
)
@o.grouped
def complete(
    attempt: Path = typer.Argument(..., help="The earlier attempt folder, or its attestation file."),
    c: Completing = Completing(),
    who: Identity = Identity(),
) -> None:
    """Complete an attempt's deferred stages in a new, linked attempt: on a GPU host, say."""
    from imagegate.drivers.select import DriverName, driver_name
    from imagegate.usecases import accept, runner
    from imagegate.usecases import complete as completing

    notify = o.notifier(c.quiet or c.fmt is Format.json)  # stdout then is the statement's alone
    with o.interrupts():
        outputs = c.outputs(notify)
        mounted = modelpath.check(str(c.model)) if c.model else None
        trusted = _trusted(c.trust, c.trusted_keys, outputs.key, _certified(attempt, who))
        gpu = gpus_parse(c.gpus)
        name = driver_name(c.driver, c.here)
        here = name is DriverName.here
        seen_at = modelpath.in_sandbox(mounted, here) if mounted else None
        earlier, prep = completing.prepare(attempt, gpu.spec if gpu else None, trusted, seen_at)
        notify(f"{earlier.dir.name} verified with key {earlier.signer}")
        if c.attach:
            outputs = dataclasses.replace(outputs, attach=True, insecure=c.insecure)
            accept.check_outputs(outputs, _attach_to(earlier.predicate), no_sign=c.no_sign)
        with accept.within(prep, c.timeout):  # the earlier attempt is verified: now the clock runs
            made = c.make_driver(earlier, outputs, name, gpu, mounted, notify)
            opts = runner.RunOptions(pipeline="", jobs=os.cpu_count() or 1)
            observer = completing.CompletionObserver(earlier, made, opts, notify)
            root = c.out or earlier.dir.parent.parent  # beside the earlier attempt by default
            done = accept.accept(accept.Request(prep, observer, root, outputs), notify)
    o.finish(done, c.fmt, c.quiet, outputs.key)


def _certified(attempt: Path, who: Identity) -> "keys.PublicKey | None":
    """Keyless (--identity, --issuer, --trusted-root): the key the earlier attempt's certificate
    proves was that identity's (a CI that signed keyless); None when no identity is named."""
    expected = who.expected("keyless verification of the earlier attempt")
    if expected is None:
        return None
    from imagegate.attest import verify

    return verify.certified_attempt(attempt, expected, use="so it is not completed")


def _trusted(
    trust: list[Path],
    lists: list[Path],
    signing: "keys.SigningKey | None",
    certified: "keys.PublicKey | None",
) -> "tuple[keys.PublicKey, ...]":
    """The keys the earlier attempt may be signed with: those named and the one its certificate
    proves was the identity's, else the signing key's own public key (one machine signs the
    whole chain)."""
    from imagegate.attest import keys

    named = keys.trusted_keys(trust, lists) + ((certified,) if certified is not None else ())
    if named:
        return named
    if signing is None:
        raise UsageError(
            "no key to verify the earlier attempt with: nothing is signed (--no-sign, or no signing "
            "key) and no --trust or --trusted-keys was given",
            hint="pass --trust PUB, the public key the earlier attempt was signed with",
        )
    return (signing.public,)


def _attach_to(predicate: "JsonMapping") -> str:
    """The registry image a completion attaches to: the one the earlier attempt judged by its
    manifest digest. An image no registry held has nowhere to attach to: refused before the run."""
    from imagegate._support.jsontypes import obj

    image = obj(predicate.get("image"))
    if image.get("subjectDigest") != "manifest" or not image.get("reference"):
        raise UsageError(
            f"--attach: the earlier attempt judged {image.get('reference') or 'an image'} by its "
            f"{image.get('subjectDigest') or 'environment'}, not by a registry manifest digest: "
            "there is no registry image to attach to",
            hint="push the image, run it from the registry and complete that attempt; or attach by hand "
            "later with imagegate attach",
        )
    return str(image["reference"])
