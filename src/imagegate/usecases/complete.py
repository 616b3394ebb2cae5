"""`imagegate complete`: run exactly the stages an earlier attempt deferred (after the GPU node
check, when the run has GPUs), against the same image or environment, and write a new attempt
whose statement links the earlier one and whose verdict is computed over both. The earlier
attempt is only read, and only after it verified (its signature with a trusted key, its statement,
every evidence file, its own link): nothing is built on an attempt that does not."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from imagegate import pipeline
from imagegate._support import jsontypes as j
from imagegate._support.jsontypes import JsonMapping
from imagegate.attest import verify as verifying
from imagegate.attest.envelopes import read_bounded
from imagegate.attest.keys import PublicKey
from imagegate.attest.sign import BUNDLE_FILE, DSSE_FILE
from imagegate.attest.statement import evidence_files, stage_result
from imagegate.domain import plan as planning
from imagegate.domain.evidence import Attempt
from imagegate.domain.plan import Plan
from imagegate.domain.results import ImageFacts, StageResult, Status, recorded_needs, waiting_on_deferred
from imagegate.domain.statements import Acceptance
from imagegate.drivers.interface import Driver
from imagegate.errors import NotVerified, UsageError
from imagegate.pipeline.params import ServeParams
from imagegate.usecases import runner

LINK_COPY = "completes/" + DSSE_FILE  # the earlier envelope, kept as evidence of the completion
LINK_PROOF = "completes/" + BUNDLE_FILE  # its Sigstore bundle, when it has one (keyless: its certificate)


@dataclass(frozen=True)
class Earlier:
    """An earlier attempt that verified: its statement is the signed payload, `envelope` the
    very bytes that verified (what the completion links and copies)."""

    dir: Path
    statement: JsonMapping  # as it verified
    envelope: bytes
    signer: str  # the fingerprint of the trusted key its signature verified with

    @property
    def predicate(self) -> dict[str, object]:
        return j.obj(self.statement.get("predicate"))

    @property
    def acceptance(self) -> Acceptance:
        """Its predicate, read as the acceptance it must be."""
        return Acceptance.from_json(self.statement.get("predicate"))

    @property
    def attempt_id(self) -> str:
        return self.acceptance.attempt_id or self.dir.name

    @property
    def deferred(self) -> list[str]:
        return [s.id for s in self.acceptance.stages if s.status is Status.DEFERRED]

    @property
    def to_run(self) -> list[str]:
        """What a completion runs: the deferred stages (no GPU then, or --skip) and those that
        never ran for want of them (SKIPPED, waiting on one): a stage carried over as SKIPPED
        would leave a completed verdict naming as passed what never ran. Plan order."""
        stages = [stage_result(e) for e in self.acceptance.stages]
        waiting = waiting_on_deferred(stages, recorded_needs(self.acceptance.plan))
        return [s.id for s in stages if s.status is Status.DEFERRED or s.id in waiting]

    def evidence_sha256(self, path: str) -> str | None:
        return next(
            (str(f.get("sha256")) for f in evidence_files(self.statement) if f.get("path") == path), None
        )


def load_earlier(target: Path, trusted: Sequence[PublicKey]) -> Earlier:
    """An attempt folder, or one of its attestation files, that verifies as `imagegate verify`
    checks it (attest/verify.py `load_attempt`); refused otherwise (NotVerified, exit 1), naming
    the file and the check: before any attempt folder is made or anything is signed."""
    got = verifying.load_attempt(
        target,
        trusted,
        use="so it is not completed",
        hint="an attempt signed on another machine needs that machine's public key (--trust PUB); "
        "an attempt changed after signing cannot be completed: run the pipeline anew",
    )
    return Earlier(got.dir, got.statement, got.envelope, got.signer)


def check_same_subject(earlier: Earlier, image: ImageFacts, now_fp: str | None) -> None:
    """Refuse (exit 3) when the image or environment found now (`now_fp`: the driver's
    environment fingerprint, --here) is not the one the earlier attempt judged, naming both."""
    was = earlier.acceptance.image
    if was.config_digest or was.manifest_digest:
        pairs = [("image ID", was.config_digest, image.config_digest)]
        if was.manifest_digest and image.manifest_digest:
            pairs.append(("digest", was.manifest_digest, image.manifest_digest))
        for what, then, now in pairs:
            if then != now:
                raise UsageError(
                    f"{image.reference}: {what} {now} is not the {what} {then} that attempt "
                    f"{earlier.attempt_id} judged",
                    hint="complete the attempt against the same image (its ID or digest), or run the image anew",
                )
        return
    then_fp = j.text(j.path(earlier.acceptance.environment, "fingerprint", "sha256"))
    if not then_fp:
        raise UsageError(
            f"attempt {earlier.attempt_id} records no image ID and no environment fingerprint: "
            "nothing to compare this run with",
            hint="run the pipeline anew here",
        )
    if then_fp != now_fp:
        raise UsageError(
            f"this environment (fingerprint sha256:{now_fp}) is not the one attempt {earlier.attempt_id} "
            f"judged (fingerprint sha256:{then_fp}): the interpreter or its installed distributions differ",
            hint="complete it in the same environment, or run the pipeline anew here",
        )


def completion_subject(earlier: Earlier, image: ImageFacts) -> ImageFacts:
    """What a completion speaks about: the subject the earlier attempt signed, once
    check_same_subject found the same image ID. The engine's registry digests change beside the
    run (the image pushed since, or loaded here by ID only), and a completion naming another
    subject would not link to the attempt it completes (verify refuses it). What the engine knows
    now stays in the predicate's repoDigests."""
    was = earlier.acceptance.image
    if not image.config_digest:  # an environment (--here): its fingerprint matched
        return image
    note = was.subject_note
    if was.manifest_digest and not image.manifest_digest:  # known here by its ID only, which matched
        note = (
            f"manifest digest as attempt {earlier.attempt_id} found it; the engine here knows the image "
            "by its ID only, which is the one that attempt judged"
        )
    return dataclasses.replace(
        image,
        manifest_digest=was.manifest_digest,
        repository=was.repository,
        index_digest=was.index_digest,
        subject_note=note,
    )


def completion_plan(earlier: Earlier, gpus: str | None, model: str | None = None) -> Plan:
    """The earlier plan with every stage that is not deferred marked as done earlier; a deferred
    stage's needs on those are dropped (they passed then, or it would not have been deferred).
    `model`: where a deferred serve stage's server finds the model now (--model), which on a GPU
    node is seldom the path the first run was given."""
    try:
        plan = Plan.from_json(earlier.acceptance.plan)
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(
            f"attempt {earlier.attempt_id}: its recorded plan is not one this imagegate reads ({e})"
        ) from e
    again = set(earlier.to_run)
    if model is not None and not any(
        s.id in again and isinstance(s.params, ServeParams) for s in plan.stages
    ):
        raise UsageError(
            f"--model given, but attempt {earlier.attempt_id} deferred no serve stage "
            f"(deferred: {', '.join(earlier.deferred)})",
            hint="give --model only to complete a deferred serve stage",
        )
    stages = []
    for s in plan.stages:
        if s.id in again:
            s = dataclasses.replace(s, skipped=None, needs=tuple(n for n in s.needs if n in again))
            if model is not None:
                s = planning.with_model(s, model)
        else:
            s = dataclasses.replace(s, skipped=f"completed earlier, in attempt {earlier.attempt_id}")
        stages.append(s)
    planning.check_serve_models(stages, gpus=bool(gpus))
    return plan.with_stages(planning.node_check_first(stages) if gpus else stages)


def earlier_results(earlier: Earlier) -> list[StageResult]:
    """The earlier results of the stages that ran then, each with the attempt it ran in (an
    earlier completion's carried results keep theirs) and its facts: the completion's statement
    alone says every stage's result."""
    again = set(earlier.to_run)
    out = []
    for entry in earlier.acceptance.stages:
        s = stage_result(entry)
        if s.id in again:
            continue
        data = {"from_attempt": earlier.attempt_id, **s.data}  # an earlier completion's keep theirs
        # Carried as a result, not as evidence: its files are the earlier attempt's.
        out.append(dataclasses.replace(s, data=data, evidence=[], started_s=None))
    return out


def prepare(
    target: Path, gpus: str | None, trusted: Sequence[PublicKey], model: str | None = None
) -> tuple[Earlier, runner.Prepared]:
    """The earlier attempt, verified with the `trusted` keys, and the run that completes it: its
    own pipeline, its deferred stages (a serve stage's model at `model` when given)."""
    earlier = load_earlier(target, trusted)
    deferred = earlier.deferred
    if not deferred:
        raise UsageError(
            f"attempt {earlier.attempt_id} deferred nothing (verdict {earlier.acceptance.verdict})",
            hint="only an attempt with DEFERRED stages can be completed",
        )
    if not earlier.acceptance.verdict.endswith("_DEFERRED"):
        raise UsageError(
            f"attempt {earlier.attempt_id} ended {earlier.acceptance.verdict}: completing its "
            f"deferred stages ({', '.join(deferred)}) cannot change that",
            hint="fix the image and run it anew",
        )
    loaded = pipeline.load(str(earlier.dir / "pipeline.yaml"))
    if loaded.sha256 != earlier.evidence_sha256("pipeline.yaml"):  # changed since it verified
        raise NotVerified(
            f"{earlier.dir / 'pipeline.yaml'}: not the pipeline attempt {earlier.attempt_id} signed "
            "(it changed after the attempt verified)",
            hint="leave the earlier attempt as it is while it is completed, and complete it again",
        )
    return earlier, runner.Prepared.of(loaded, completion_plan(earlier, gpus, model))


class CompletionObserver:
    """Completing an attempt as the acceptance use case's observer: the same image (or
    environment) through a driver, the deferred stages run again, the earlier results carried
    over and the earlier envelope linked."""

    def __init__(
        self,
        earlier: Earlier,
        driver: Driver,
        opts: runner.RunOptions,
        notify: runner.Notify = lambda _m: None,
    ) -> None:
        was = earlier.acceptance.image
        # By the name the user gave then: a tag that now names another build is refused below.
        self.reference: str | None = was.reference or was.config_digest or "local"
        self.inner = runner.DriverObserver(driver, self.reference, opts, notify)
        self.earlier, self.notify = earlier, notify
        self.image: ImageFacts | None = None  # completion_subject: the earlier attempt's subject

    def subject(self, prep: runner.Prepared) -> ImageFacts:
        image = self.inner.subject(prep)
        check_same_subject(self.earlier, image, self.inner.driver.environment_fingerprint())
        self.image = completion_subject(self.earlier, image)
        return self.image

    def left_behind(self) -> str | None:
        return self.inner.left_behind()

    def observe(self, prep: runner.Prepared, attempt: Attempt) -> runner.Observation:
        earlier = self.earlier
        attempt.write(LINK_COPY, earlier.envelope)
        proof = earlier.dir / BUNDLE_FILE  # a keyless signer is proven by its certificate: kept too
        if proof.is_file():
            attempt.write(LINK_PROOF, read_bounded(proof))
        self.notify(f"completing {earlier.attempt_id} ({', '.join(earlier.to_run)})")
        obs = self.inner.observe(prep, attempt)
        obs.image = self.image or obs.image
        obs.given = earlier_results(earlier)
        obs.completes = {
            "attempt": earlier.attempt_id,
            "envelopeSha256": hashlib.sha256(earlier.envelope).hexdigest(),
            "envelope": os.path.relpath(earlier.dir / DSSE_FILE, attempt.dir),
            "verdict": earlier.acceptance.verdict,
            "stages": earlier.to_run,
            "verifiedWith": earlier.signer,
        }
        return obs
