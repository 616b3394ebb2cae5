"""The acceptance use case, whatever ran the probes: prepare → observe → conclude → (with
--attach: the image's digest fixed) → sign → attach → reports. One statement value flows from
the runner to the signer to the reports; the commands (`run`, `pod run`, `pod collect`,
`complete`) only parse options and render the result."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from imagegate._support import deadline
from imagegate.domain.evidence import Attempt
from imagegate.domain.results import ImageFacts, RunRecord, accepted, exit_code
from imagegate.domain.statements import Acceptance, Statement
from imagegate.errors import EXIT_ACCEPTED, EXIT_REJECTED, ImagegateError, UsageError
from imagegate.usecases.runner import Notify, Observation, Prepared, conclude, judge, now

if TYPE_CHECKING:  # signing and its keys are loaded when a run signs, after the probes ran
    from imagegate.attest import keys
    from imagegate.attest.sign import Signed
    from imagegate.oci.reference import Reference
    from imagegate.usecases.reuse_attempt import Found, ReusePolicy

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
    # The use case prints nothing: what it did comes back as values (Accepted), and the reports
    # go to the caller's hands. `write_reports`: writes `reports` for a run (its record,
    # statement, attempt folder and signing key), True when one went to stdout.
    write_reports: Callable[[RunRecord, Statement[Acceptance], Path, keys.SigningKey | None], bool] | None = (
        None
    )


@dataclass(frozen=True)
class Request:
    """One acceptance as a command asks for it, every option checked at the edge (cli/_checks.py)
    before it is made: the plan, what observes the image, where the evidence goes, and what
    happens after the verdict."""

    prep: Prepared
    observer: Observer
    out: Path
    outputs: Outputs = Outputs()
    reuse: ReusePolicy | None = None  # run --reuse: an equal earlier attempt answers, linked


@dataclass(frozen=True)
class Attachment:
    """What --attach did, for the caller to say: where the statements went (the tag of the
    attestation image, how many, how referrers are found), the earlier statements it replaced and
    those it kept (another signer's, a newer verdict), and `left`: what a registry refused to
    delete, which keeps the image from being admitted as it is (None: nothing)."""

    reference: str
    tag: str
    layers: int
    via: str
    replaced: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    left: str | None = None


@dataclass(frozen=True)
class Accepted:
    record: RunRecord
    statement: Statement[Acceptance]  # the one written beside the evidence, signed and reported
    signed: Signed | None
    used_stdout: bool  # a report went to stdout: nothing else may
    exit_code: int  # 0 accepted, 1 rejected, 2 could not decide
    rejected_by: str | None  # what rejected a verdict that is accepted by itself (--require-complete)
    attached: Attachment | None = None  # --attach
    reused: str | None = None  # run --reuse: the earlier attempt whose verified results this carries


class NotAttachable(ImagegateError):
    """--attach cannot push the run's statements where IMAGE names now (a tag moved since the
    run began): refused before anything is signed. Exit 2: the image the tag names now was not
    judged, and the one judged is no longer what the tag gives admission."""


def check_outputs(
    outputs: Outputs, reference: str | None, *, no_sign: bool = False, keyed: bool = True
) -> None:
    """Before any work: what cannot be done at the end is refused at the start. `keyed`: the
    signing key is resolved already (at the edge it is checked before the key is looked for)."""
    if outputs.attach and no_sign:
        raise UsageError("--attach needs a signed attestation", hint="drop --no-sign")
    if outputs.attach and keyed and outputs.key is None:
        raise UsageError("--attach needs a signed attestation, and there is no key to sign with")
    if outputs.attach and reference is None:
        raise UsageError(
            "--attach pushes the attestation to IMAGE's repository, and no IMAGE was given",
            hint="name the image the environment was built from: imagegate run --here IMAGE --attach",
        )


def accept(request: Request, notify: Notify = _silent) -> Accepted:
    """Raises Interrupted (a KeyboardInterrupt) on an interrupt, saying what may be left."""
    r = request
    check_outputs(r.outputs, r.observer.reference)  # the use case's own invariant, whoever calls it
    try:
        return _accept(r.prep, r.observer, r.out, r.outputs, notify, r.reuse)
    except KeyboardInterrupt:
        raise Interrupted(r.observer.left_behind()) from None


@contextlib.contextmanager
def within(prep: Prepared, timeout: float | None) -> Iterator[None]:
    """The whole command under one deadline (Prepared.overall): making the driver, getting the
    image, the stages; a wait past it ends with DeadlineReached naming what it waited for."""
    with deadline.covering(prep.overall(timeout), explicit=timeout is not None):
        yield


def _accept(
    prep: Prepared,
    observer: Observer,
    out: Path,
    outputs: Outputs,
    notify: Notify,
    reuse: ReusePolicy | None = None,
) -> Accepted:
    with deadline.armed():  # pulling, unpacking: a stalled engine or registry is cut at the deadline
        image = observer.subject(prep)
    found = _reusable(prep, observer, out, image, reuse, notify) if reuse is not None else None
    if found is not None:
        from imagegate.usecases import reuse_attempt as reusing

        attempt, concluded = reusing.reused(out, image, prep, found, now(), notify)
    else:
        attempt = Attempt.begin(out, image, prep.evidence())
        notify(f"attempt {attempt.dir}")
        obs = observer.observe(prep, attempt)
        concluded = conclude(prep, obs, judge(prep, obs, attempt, notify), attempt, now())
    attempt.write_conclusion(concluded.run_json, concluded.statement.to_json(), concluded.index_entry)
    record, statement = concluded.record, concluded.statement
    pinned = _pinned(observer.reference, image, statement, outputs) if outputs.attach else None
    signed = None
    if outputs.key is not None:
        from imagegate.attest.sign import sign_attempt

        signed = sign_attempt(attempt.dir, statement, outputs.key)
    attached = _attach(signed, pinned, outputs) if signed is not None and pinned is not None else None
    left = attached.left if attached is not None else None
    used_stdout = False
    if outputs.write_reports is not None:  # also with no --report: a CI's own summary
        used_stdout = outputs.write_reports(record, statement, attempt.dir, outputs.key)
    code, rejected_by = exit_for(
        record.verdict, concluded.levels, concluded.no_level, outputs.require_complete
    )
    if left is not None and code == EXIT_ACCEPTED:
        # Attached, but beside earlier statements a controller still reads: not admitted as it is.
        code, rejected_by = EXIT_REJECTED, "--attach left earlier statements (named above)"
    reused = found.acceptance.attempt_id if found is not None else None
    return Accepted(record, statement, signed, used_stdout, code, rejected_by, attached, reused)


def _reusable(
    prep: Prepared, observer: Observer, out: Path, image: ImageFacts, policy: ReusePolicy, notify: Notify
) -> Found | None:
    """The earlier attempt this run answers from (usecases/reuse_attempt.py), each one passed over said."""
    import datetime as dt

    from imagegate.usecases import reuse_attempt as reusing

    never = reusing.never(prep)
    driver = getattr(getattr(observer, "driver", None), "name", None)
    if never is not None or not isinstance(driver, str):
        notify(f"--reuse: runs anew: {never or 'this run has no driver of its own'}")
        return None
    search = reusing.find(out, image, prep, driver, policy, dt.datetime.now(dt.timezone.utc))
    for why in search.passed:
        notify(f"--reuse: not reused: {why}")
    if search.found is None:
        notify("--reuse: no earlier attempt answers for this run: it runs")
    return search.found


def exit_for(
    verdict: str, reached: Sequence[str], no_level: str, require_complete: bool
) -> tuple[int, str | None]:
    """The exit code, and what rejects a verdict that is accepted by itself: --require-complete,
    or no level reached (`reached`: the levels its statement reaches, Concluded.levels;
    `no_level`: the stages that did not run or pass, named)."""
    code = exit_code(verdict, require_complete=require_complete)
    if code != exit_code(verdict):
        return code, "--require-complete"
    if accepted(verdict, list(reached)) != code:
        return EXIT_REJECTED, no_level
    return code, None


def _pinned(
    reference: str | None, image: ImageFacts, statement: Statement[Acceptance], outputs: Outputs
) -> Reference:
    """Where --attach pushes, fixed before anything is signed: the digest `reference` names in
    its registry now, read once (the attach then pushes by that digest, so a tag moving later
    cannot split the statements), which must be the image the statement is about: the manifest
    that ran, or the index it was chosen from (then that manifest). Else NotAttachable."""
    from imagegate.attest import attach

    assert reference is not None  # check_outputs: no attach without an image
    ref = attach.parse_image(reference)
    with attach.client_for(ref, insecure=outputs.insecure) as client:
        now = attach.resolve(client, ref).digests[0]
    ran = image.manifest_digest if now == image.index_digest else now
    if ran in attach.subject_digests(statement.to_json()):
        return ref.with_digest(ran)
    raise _not_attachable(reference, now, image)


def _not_attachable(reference: str, now: str, image: ImageFacts) -> NotAttachable:
    said = f"--attach: {reference} names {now} in its registry now, not the image this run judged"
    if image.manifest_digest is None:  # judged by its image ID alone: no registry manifest is it
        return NotAttachable(
            f"{said} (its image ID {image.config_digest}; {image.subject_note or 'no manifest digest known'}): "
            "nothing signed or attached",
            hint="push the image, run it from the registry and attach that run",
        )
    return NotAttachable(
        f"{said} ({image.manifest_digest}): nothing signed or attached",
        hint=f"the tag moved since the run began: run again on {reference}, or on "
        f"{image.repository or 'its repository'}@{image.manifest_digest}, the image that ran",
    )


def _attach(signed: Signed, ref: Reference, outputs: Outputs) -> Attachment:
    """Attach the acceptance, the VSA and the test-result to `ref` (pinned by `_pinned`); each
    replaces the earlier ones of its type and pipeline that the same signer made (keyless: the
    same identity, proven by each earlier bundle)."""
    from imagegate.attest import attach, referrers

    with attach.client_for(ref, insecure=outputs.insecure) as client:
        # The standard statements too: admission policies are written against them.
        pairs = referrers.attach_signed(client, ref, signed, outputs.key)
    done, referred = pairs[-1]
    replaced = [g.describe() for d, r in pairs for g in (*(d.replaced if d else ()), *r.replaced)]
    return Attachment(
        done.reference if done else f"{ref.registry}/{ref.repository}@{ref.digest}",
        done.tag if done else "",
        done.layers if done else len(pairs),
        referred.via,
        tuple(replaced),
        tuple(referrers.kept(pairs)),
        referrers.remaining(pairs, ref.repository),
    )
