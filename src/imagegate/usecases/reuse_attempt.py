"""`run --reuse`: a run whose every input equals an earlier attempt's answers from that attempt.

An earlier attempt is reused only when all of this holds, each checked on its signed statement
(never on a name, nor on the index, which only says where to look):
- it verifies with the signing key of this run (one key: never across keys), and so does every
  evidence file it lists (attest/verify.py `load_attempt`, as `verify` and `complete` check it);
- it judged this very image: the image ID, the manifest and index digests and the platform this
  run resolved the reference to now (a tag that names another build finds nothing to reuse);
- the same plan (pipeline, its digest, modules, skips, params, GPU request), probes bundle,
  imagegate version and driver, and the same command-line inputs (`--source`, `--expect-config`,
  `--advisory-db`: run.json's `inputs`);
- its verdict is not ERROR; it finished within `--reuse-within` of now (not in the future);
- it is a run of its own, not a completion nor a reuse (the original is found by itself);
- the plan has no stage whose answer changes with time: the vulnerability audit (advisories are
  published every day) and the GPU node check (it judges the node now): such a plan runs anew.

The reuse is an attempt of its own: the run's inputs written anew, the earlier envelope kept as
evidence (`reuses/attestation.dsse.json`, linked by its sha256), each evidence file hard linked
(or copied) and hashed again; its statement carries the earlier stages, verdict and times —
`startedOn`/`finishedOn` are when the stages ran, so a reuse never makes a verdict newer than it
is: the "newest verdict" order and every age bound (`--reuse-within`, the policies' 168 h) count
from the run that ran — and `reuses` names the earlier attempt and when it was reused."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from imagegate import __version__
from imagegate.attest import verify as verifying
from imagegate.attest.keys import PublicKey
from imagegate.attest.sign import BUNDLE_FILE, DSSE_FILE
from imagegate.attest.statement import build_statement, stage_result
from imagegate.attest.vsa import reach
from imagegate.domain.evidence import INDEX, RUN_FILE, Attempt, image_key
from imagegate.domain.results import EvidenceFile, ImageFacts, RunRecord
from imagegate.domain.statements import Acceptance
from imagegate.errors import ImagegateError, UsageError
from imagegate.usecases.runner import Concluded, Prepared

LINK_COPY = "reuses/" + DSSE_FILE
LINK_PROOF = "reuses/" + BUNDLE_FILE
DEFAULT_WITHIN_S = 24 * 3600.0  # well inside the policies' 168 h
MAX_CANDIDATES = 32  # index lines looked at, newest first
MAX_INDEX_TAIL = 1 << 20  # of index.jsonl, its end: thousands of attempts
SKEW_S = 300.0  # a statement finished this far in the future is not believed
# Stages whose answer is about the time they ran, not the image alone: never reused.
CHANGES_WITH_TIME = {
    "vulns": "the vulnerability audit answers as advisories are published",
    "gpu_preflight": "the GPU node check judges the node as it is now",
}
_ATTEMPT_ID = re.compile(r"^\d{8}T\d{6}\.\d{3}Z-[0-9a-f]{6}$")
_WRITTEN = ("pipeline.yaml", "plan.json", "bundle.pyz", RUN_FILE)  # this run writes them itself


@dataclass(frozen=True)
class ReusePolicy:
    within_s: float
    key: PublicKey  # the signing key's public half: the one key an earlier attempt must verify with


@dataclass(frozen=True)
class Found:
    earlier: verifying.SignedAttempt
    acceptance: Acceptance
    run_json: bytes


@dataclass
class Search:
    """The attempt to reuse, or None; why each one looked at was not reused (said to the user)."""

    found: Found | None = None
    passed: list[str] = field(default_factory=list)


def never(prep: Prepared) -> str | None:
    """Why no attempt of this plan may be reused, or None."""
    for stage in prep.plan.stages:
        why = CHANGES_WITH_TIME.get(stage.probe)
        if why is not None and not stage.skipped:
            return f"stage {stage.id}: {why}"
    return None


def find(
    out: Path, image: ImageFacts, prep: Prepared, driver: str, policy: ReusePolicy, now: dt.datetime
) -> Search:
    """The newest earlier attempt under `out` that this run may answer from (module docstring)."""
    search = Search()
    if not image.config_digest:
        search.passed.append("no image ID: an environment is not content, nothing to reuse")
        return search
    folder = out / image_key(image)
    for attempt_id in _candidates(folder / INDEX):
        why = _one(folder / attempt_id, image, prep, driver, policy, now, search)
        if why is None:
            return search
        search.passed.append(f"{attempt_id}: {why}")
    return search


def _candidates(index: Path) -> list[str]:
    """Attempt ids from the index's end, newest first, at most MAX_CANDIDATES; the index is a
    hint (anybody may have written it): each attempt is verified on its own."""
    try:
        fd = os.open(index, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - MAX_INDEX_TAIL))
        tail = f.read(MAX_INDEX_TAIL)
    ids: list[str] = []
    for line in reversed(tail.splitlines()):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or "reuses" in entry:  # a reuse: the attempt it reused is listed too
            continue
        got = entry.get("attempt")
        if isinstance(got, str) and _ATTEMPT_ID.match(got) and got not in ids:
            ids.append(got)
        if len(ids) >= MAX_CANDIDATES:
            break
    return ids


def _one(
    folder: Path,
    image: ImageFacts,
    prep: Prepared,
    driver: str,
    policy: ReusePolicy,
    now: dt.datetime,
    search: Search,
) -> str | None:
    """None when the attempt in `folder` is reused (search.found set); else why not."""
    if folder.is_symlink() or not folder.is_dir():
        return "no attempt folder"
    try:
        earlier = verifying.load_attempt(folder, [policy.key], use="so it is not reused", hint="")
    except ImagegateError as e:
        return f"does not verify with this run's key ({e})"
    acc = Acceptance.from_json(earlier.statement.get("predicate"))
    why = _differs(acc, image, prep, driver, policy, now)
    if why is not None:
        return why
    run_json = _run_json(earlier, acc)
    if isinstance(run_json, str):
        return run_json
    inputs = inputs_of(run_json)
    if inputs != prep.inputs.to_json():
        return f"other inputs (--source, --expect-config, --advisory-db, --no-cache): {inputs} then"
    search.found = Found(earlier, acc, run_json)
    return None


def inputs_of(run_json: bytes) -> object:
    """run.json's `inputs` (None where it has none: a run of an imagegate that kept none)."""
    try:
        doc = json.loads(run_json)
    except ValueError:
        return None
    return doc.get("inputs") if isinstance(doc, dict) else None


def _differs(
    acc: Acceptance, image: ImageFacts, prep: Prepared, driver: str, policy: ReusePolicy, now: dt.datetime
) -> str | None:
    """What makes the verified statement `acc` another run than this one would be, or None."""
    img = acc.image
    if acc.verdict == "ERROR":
        return "its verdict is ERROR: the run could not decide, so it runs again"
    if acc.completes or acc.reuses:
        return "a completion or a reuse: the attempt that ran is looked at instead"
    seen = (img.config_digest, img.manifest_digest, img.index_digest, img.platform)
    wanted = (image.config_digest, image.manifest_digest, image.index_digest, image.platform)
    if seen != wanted:
        return f"another image: {seen} then, {wanted} now"
    then: list[tuple[str, object, object]] = [
        ("plan", _canonical(acc.plan), _canonical(prep.plan.to_json())),
        ("probes bundle", acc.bundle_sha256, prep.bundle.sha256),
        ("imagegate version", acc.imagegate_version, __version__),
        ("driver", acc.environment.get("driver"), driver),
    ]
    for what, was, now_ in then:
        if was != now_:
            return f"another {what}"
    finished = _when(acc.finished_on)
    if finished is None:
        return f"finishedOn {acc.finished_on!r} is no time"
    age = (now - finished).total_seconds()
    if age > policy.within_s:
        return f"finished {age / 3600:.1f} h ago, past --reuse-within {policy.within_s / 3600:g} h"
    if age < -SKEW_S:
        return f"finished in the future ({acc.finished_on})"
    return None


def _run_json(earlier: verifying.SignedAttempt, acc: Acceptance) -> bytes | str:
    """The earlier run.json, as its statement lists it (read again now), or why not."""
    listed = next((f for f in acc.evidence if f.path == RUN_FILE), None)
    if listed is None:
        return "lists no run.json"
    try:
        fd = os.open(earlier.dir / RUN_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            data = f.read(16 << 20)
    except OSError as e:
        return f"run.json unreadable ({e.strerror})"
    if hashlib.sha256(data).hexdigest() != listed.sha256:
        return "run.json changed after it verified"
    return data


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _when(text: str) -> dt.datetime | None:
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def reused(
    out: Path, image: ImageFacts, prep: Prepared, found: Found, now: str, notify: Callable[[str], None]
) -> tuple[Attempt, Concluded]:
    """The new attempt that answers from `found`: the earlier envelope linked, every evidence
    file taken and hashed again (it must be the bytes that verified), the statement carrying the
    earlier stages, verdict and times. Raises UsageError where a file changed meanwhile."""
    earlier, acc = found.earlier, found.acceptance
    attempt = Attempt.begin(out, image, prep.evidence())
    notify(f"attempt {attempt.dir}: reusing {earlier.dir.name}")
    attempt.write(LINK_COPY, earlier.envelope)
    if (earlier.dir / BUNDLE_FILE).is_file():  # a keyless signer is proven by its certificate
        attempt.take(LINK_PROOF, earlier.dir / BUNDLE_FILE)
    _take_evidence(attempt, earlier.dir, acc.evidence_files())
    run_env = json.loads(found.run_json).get("environment")
    link: dict[str, object] = {
        "attempt": acc.attempt_id,
        "envelopeSha256": hashlib.sha256(earlier.envelope).hexdigest(),
        "envelope": LINK_COPY,
        "verdict": acc.verdict,
        "verifiedWith": earlier.signer,
        "reusedOn": now,
    }
    # Each stage carried as the earlier attempt's result, its evidence files taken here.
    stages = [
        replace(s, data={**s.data, "from_attempt": acc.attempt_id}) for s in map(stage_result, acc.stages)
    ]
    record = RunRecord(
        attempt_id=attempt.id,
        attempt_dir=str(attempt.dir),
        pipeline=prep.plan.pipeline.to_json(),
        plan=prep.plan.to_json(),
        image=image,
        environment=dict(run_env) if isinstance(run_env, dict) else dict(acc.environment),
        stages=stages,
        started_at=acc.started_on,
        finished_at=acc.finished_on,
        verdict=acc.verdict,
        imagegate_version=__version__,
        bundle_sha256=prep.bundle.sha256,
        reuses=link,
        pending_evidence=(
            EvidenceFile(RUN_FILE, hashlib.sha256(found.run_json).hexdigest(), len(found.run_json)),
        ),
    )
    statement = build_statement(record)
    levels, no_level = reach(statement.to_json())
    index_entry: dict[str, object] = {
        "attempt": attempt.id,
        "verdict": record.verdict,
        "reference": image.reference,
        "pipeline": prep.plan.pipeline.name,
        "finished": record.finished_at,
        "reuses": acc.attempt_id,
    }
    concluded = Concluded(record, statement, found.run_json, index_entry, tuple(levels), no_level)
    return attempt, concluded


def _take_evidence(attempt: Attempt, source: Path, files: Sequence[EvidenceFile]) -> None:
    """Each listed file the run does not write itself, taken from `source` and hashed as taken."""
    for f in files:
        if f.path in _WRITTEN:  # its inputs (found equal by the plan check) and run.json, with the statement
            continue
        got = attempt.take(f.path, source / f.path)
        if (got.sha256, got.size) != (f.sha256, f.size):
            raise UsageError(
                f"{source / f.path}: changed after the attempt verified (sha256 {got.sha256[:16]}…, "
                f"listed {f.sha256[:16]}…): not reused",
                hint="leave attempt folders as they are; run again without --reuse",
            )
