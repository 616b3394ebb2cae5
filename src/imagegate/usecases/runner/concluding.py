"""From the judged stages to the verdict, the record and the signed statement's content, as
values: nothing is written here (the attempt writes them in one step, Attempt.write_conclusion)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from imagegate import __version__
from imagegate.attest.statement import build_statement
from imagegate.attest.vsa import reach
from imagegate.domain.evidence import RUN_FILE, Attempt, json_bytes
from imagegate.domain.results import EvidenceFile, RunRecord, verdict
from imagegate.domain.statements import Acceptance, Statement
from imagegate.usecases.runner.judging import Judged
from imagegate.usecases.runner.observation import Observation
from imagegate.usecases.runner.preparing import Prepared


@dataclass(frozen=True)
class Concluded:
    record: RunRecord
    statement: Statement[Acceptance]  # as written to statement.json; what is signed and reported
    run_json: bytes  # run.json: the environment, the bundle, each controller's facts
    index_entry: dict[str, object]  # the attempt's line in the output folder's index
    # The levels the statement reaches, read from it as every reader of a signed one does, and
    # why it reaches none (vsa.no_level) when so.
    levels: tuple[str, ...] = ()
    no_level: str = ""


def conclude(prep: Prepared, obs: Observation, judged: Judged, attempt: Attempt, finished: str) -> Concluded:
    """The verdict over the judged stages, the record and the statement built from it."""
    run_json = json_bytes(
        {
            "environment": judged.environment,
            "bundle_sha256": prep.bundle.sha256,
            "run": {"controllers": judged.controllers},
            # The command line's choices besides the plan: what `run --reuse` must find equal.
            "inputs": prep.inputs.to_json(),
        }
    )
    record = RunRecord(
        attempt_id=attempt.id,
        attempt_dir=str(attempt.dir),
        pipeline=prep.plan.pipeline.to_json(),
        plan=prep.plan.to_json(),
        image=obs.image,
        environment=judged.environment,
        stages=judged.results,
        started_at=obs.started,
        finished_at=finished,
        verdict=verdict(judged.results),
        imagegate_version=__version__,
        bundle_sha256=prep.bundle.sha256,
        completes=obs.completes,
        pending_evidence=(EvidenceFile(RUN_FILE, hashlib.sha256(run_json).hexdigest(), len(run_json)),),
    )
    index_entry: dict[str, object] = {
        "attempt": attempt.id,
        "verdict": record.verdict,
        "reference": obs.image.reference,
        "pipeline": prep.plan.pipeline.name,
        "finished": record.finished_at,
    }
    statement = build_statement(record)
    reached, no_level = reach(statement.to_json())
    return Concluded(record, statement, run_json, index_entry, tuple(reached), no_level)
