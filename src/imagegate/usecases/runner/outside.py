"""The outside stages (the runner reads the image's bytes itself: layers, vulnerabilities), in
plan order, each skipped by the same rule as in the image and DEFERRED by its `requires` where
the run lacks them; their evidence written in the stage's folder as each ends."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from imagegate._support import deadline, interrupts
from imagegate._support.jsontypes import JsonObject
from imagegate.domain.evidence import Attempt, sha256_file
from imagegate.domain.plan import PlannedStage, skip_reason
from imagegate.domain.results import EvidenceFile, StageResult, Status
from imagegate.stages import Outcome, OutsideContext, load_outside_probe
from imagegate.usecases.runner.observation import Capabilities, Observation
from imagegate.usecases.runner.preparing import Notify, Prepared


def outside_results(
    prep: Prepared,
    stages: Sequence[PlannedStage],
    obs: Observation,
    attempt: Attempt,
    earlier: list[StageResult],
    notify: Notify,
) -> list[StageResult]:
    """The outside stages, in plan order, each skipped by the same rule as in the image
    (plan.skip_reason) and DEFERRED by its `requires` where this run lacks them."""
    done = {r.id: r.status for r in earlier}
    stopped_by = next((r.id for r in earlier if r.status is Status.FAIL), None)
    node_checks = {s.id for s in prep.plan.stages if s.probe == "gpu_preflight"}
    out: list[StageResult] = []
    for stage in stages:
        why = skip_reason(stage, done, stopped_by if prep.plan.stop_on_fail else None, node_checks)
        if why is not None:
            res = StageResult(stage.id, stage.probe, "outside", Status.SKIPPED, why)
        else:
            notify(f"outside stage {stage.id} ({stage.probe})")
            res = _run_outside(prep, stage, obs, attempt, {r.id: r for r in [*earlier, *out]})
        out.append(res)
        done[stage.id] = res.status
        if res.status is Status.FAIL and stopped_by is None:
            stopped_by = stage.id
    return out


def _run_outside(
    prep: Prepared, stage: PlannedStage, obs: Observation, attempt: Attempt, done: dict[str, StageResult]
) -> StageResult:
    folder = Path(f"stages/{prep.plan.folder_numbers[stage.id]:02d}-{stage.id}")
    (attempt.dir / folder).mkdir(parents=True, exist_ok=False)
    ctx = OutsideContext(
        image=obs.image,
        driver=obs.driver,
        stage_dir=attempt.dir / folder,
        source=prep.inputs.source or obs.source,
        expect_config_digest=prep.inputs.expect_config,
        image_source=obs.image_source,
        verified=obs.verified,
        has_image=obs.has_image,
        inside_results=done,
        advisory_db=prep.inputs.advisory_db,
        cache_dir=prep.inputs.cache_dir,
        no_cache=prep.inputs.no_cache,
        progress=obs.progress,
        timeout_s=deadline.cap(stage.timeout),  # its own deadline, ending by the command's
    )
    t0 = time.monotonic()
    started = None if obs.clock is None else max(0.0, t0 - obs.clock)
    gate = obs.fail_fast
    try:
        outcome = load_outside_probe(stage.probe)(ctx, stage.params)
    except interrupts.Stopped:
        if gate is None or gate.reason is None or interrupts.signalled():
            raise  # a signal or the deadline: the command ends
        outcome = Outcome(Status.SKIPPED, gate.reason)
    except Exception as e:  # a bug or an unreadable source is an ERROR of the stage
        outcome = Outcome(Status.ERROR, f"{type(e).__name__}: {e}")
    if gate is not None:
        gate.saw(stage.id, outcome.status.value)
    had = obs.capabilities
    outcome = _deferred_by_requires(stage, outcome, had)
    files = []
    for p in sorted((attempt.dir / folder).rglob("*")):
        if p.is_file():
            files.append(EvidenceFile(str(p.relative_to(attempt.dir)), sha256_file(p), p.stat().st_size))
    result = {"id": stage.id, "status": outcome.status.value, "detail": outcome.detail, "data": outcome.data}
    files.append(attempt.write_json(f"{folder}/result.json", result))
    return StageResult(
        stage.id, stage.probe, "outside", outcome.status, outcome.detail,
        time.monotonic() - t0, dict[str, object](outcome.data), files, started, on_gpu=had.gpu,
    )  # fmt: skip


def _deferred_by_requires(stage: PlannedStage, outcome: Outcome, had: Capabilities) -> Outcome:
    """As in the image: a stage that requires what this run lacks ran for the record, DEFERRED."""
    unmet = [r for r in stage.requires if not (r == "gpu" and had.gpu)]
    if not unmet:
        return outcome
    data: JsonObject = dict(
        outcome.data, ran_for_record={"status": outcome.status.value, "detail": outcome.detail}
    )
    detail = f"requires {', '.join(unmet)}, not present here; ran for the record: {outcome.detail or outcome.status.value}"
    return Outcome(Status.DEFERRED, detail, data)
