"""The acceptance use case, whatever ran the probes: prepare → observe → conclude → sign →
attach → reports. One statement value flows from the runner to the signer to the reports; the
commands (`run`, `pod run`, `pod collect`, `complete`) only parse options and render the result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from imagegate.attest.keys import SigningKey
from imagegate.attest.sign import Signed, sign_attempt
from imagegate.drivers.interface import Driver
from imagegate.drivers.select import DriverName, DriverOptions, make_driver
from imagegate.errors import UsageError
from imagegate.evidence import Attempt
from imagegate.gpus import GpuRequest
from imagegate.model import ImageFacts, RunRecord
from imagegate.runner import Notify, Observation, Prepared, conclude, new_attempt


class Observer(Protocol):
    """A way to run the probes and see what happened: a driver (docker, local), a Pod, a Pod
    that already ran, an earlier attempt's deferred stages."""

    # The image reference the user named (what --attach pushes to); None: no image (run --here).
    reference: str | None

    def subject(self, prep: Prepared) -> ImageFacts:
        """The image (or environment) judged; raise UsageError when it is not there."""
        ...

    def observe(self, prep: Prepared, attempt: Attempt) -> Observation: ...


@dataclass(frozen=True)
class Outputs:
    """What happens after the verdict: signing, attaching, reports (FORMAT, PATH; `-` is stdout)."""

    key: SigningKey | None = None
    attach: bool = False
    insecure: bool = False  # --attach over plain HTTP
    reports: Sequence[tuple[str, Path]] = ()


@dataclass(frozen=True)
class Accepted:
    record: RunRecord
    statement: dict[str, Any]  # the one written beside the evidence, signed and reported
    signed: Signed | None
    used_stdout: bool  # a report went to stdout: nothing else may


def check_outputs(outputs: Outputs, reference: str | None, *, no_sign: bool = False) -> None:
    """Before any work (the key too): what cannot be done at the end is refused at the start."""
    if outputs.attach and no_sign:
        raise UsageError("--attach needs a signed attestation", hint="drop --no-sign")
    if outputs.attach and reference is None:
        raise UsageError(
            "--attach pushes the attestation to IMAGE's repository, and no IMAGE was given",
            hint="name the image the environment was built from: imagegate run --here IMAGE --attach",
        )


def accept(
    prep: Prepared, observer: Observer, out: Path, outputs: Outputs, notify: Notify = lambda _m: None
) -> Accepted:
    check_outputs(outputs, observer.reference)
    image = observer.subject(prep)
    attempt = new_attempt(prep, image, out)
    notify(f"attempt {attempt.dir}")
    concluded = conclude(prep, observer.observe(prep, attempt), attempt, notify)
    record, statement = concluded.record, concluded.statement
    signed = None
    if outputs.key is not None:
        signed = sign_attempt(attempt.dir, statement, outputs.key)
        notify(f"signed {signed.dsse_path} with key {signed.fingerprint}")
    if signed is not None and outputs.attach and observer.reference is not None:
        _attach(signed, observer.reference, outputs.insecure, notify)
    from imagegate.report import formats

    try:
        used_stdout = formats.write_reports(record, list(outputs.reports), statement=statement)
    except OSError as e:
        raise UsageError(f"writing a report: {e}", hint="check the --report paths") from e
    return Accepted(record, statement, signed, used_stdout)


def driver_for(
    *,
    here: bool,
    name: DriverName | None = None,
    python: str | None = None,
    memory: str = "8g",
    pull: str = "missing",
    gpus: GpuRequest | None = None,
    notify: Notify = lambda _m: None,
    expect_config: str | None = None,
    insecure: bool = False,
) -> Driver:
    """The driver the options name (drivers/select.py): --here is the local driver; the default
    an engine (docker)."""
    chosen = DriverName.here if here else name
    return make_driver(
        chosen, DriverOptions(memory, pull, notify, gpus, python, expect_config, insecure=insecure)
    )


def _attach(signed: Signed, reference: str, insecure: bool, notify: Notify) -> None:
    from imagegate.attest import attach

    ref = attach.parse_image(reference)
    with attach.client_for(ref, insecure=insecure) as client:
        done = attach.attach(client, ref, signed.envelope)
    notify(f"attached to {done.reference} ({done.tag}, {done.layers} attestation(s))")
