"""From what a driver observed to each stage's result: the controllers' events read against the
plan (an event the image forged, a run cut short, a GPU stage where none was granted), each
stage's output written as its evidence, the outside stages that waited on the image's run, in
plan order. What it returns, `conclude` turns into the verdict and the statement."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from imagegate._support import jsontypes as j
from imagegate.domain import protocol
from imagegate.domain.evidence import Attempt
from imagegate.domain.plan import PlannedStage
from imagegate.domain.results import StageResult, Status
from imagegate.drivers.interface import BundleRun
from imagegate.usecases.runner.observation import ControllerRun, Observation, gpu_granted
from imagegate.usecases.runner.outside import outside_results
from imagegate.usecases.runner.preparing import Notify, Prepared

INTEGRITY_STAGE = "event_integrity"  # the runner's own stage: the controllers' events could not be trusted


@dataclass(frozen=True)
class Judged:
    """Every stage's result in plan order (the runner's own stages first), each controller's
    facts for run.json, and the environment completed by the first controller's start."""

    results: list[StageResult]
    controllers: list[dict[str, object]]
    environment: dict[str, object]


def judge(prep: Prepared, obs: Observation, attempt: Attempt, notify: Notify = lambda _m: None) -> Judged:
    """Each stage's result from the observation; the outside stages that waited run now."""
    env = dict(obs.environment)
    controllers = [
        _record_controller(cr, attempt, env, "" if len(obs.runs) == 1 else f"-{n + 1}")
        for n, cr in enumerate(obs.runs)
    ]
    results: list[StageResult] = list(obs.given)
    if obs.runs:
        results += _fail_fast(prep, obs, inside_results(prep, obs.runs, attempt, obs.clock))
    given = {r.id for r in obs.given}  # a completion's earlier results stand for their stages
    results += [left_out(s) for s in prep.plan.stages if s.skipped and s.id not in given]
    done_ids = {r.id for r in obs.outside_done}
    if obs.refused is not None:
        results = [obs.refused, *results]
        results += refused_skips(prep, obs, {r.id for r in results})
        done_ids |= {r.id for r in results}
    later = [s for s in prep.plan.outside_stages if s.id not in done_ids]
    results += obs.outside_done
    gate = obs.fail_fast
    if gate is not None and gate.reason is not None:  # not started: stopped as well
        results += [gate.stopped(s) for s in later]
    else:
        results += outside_results(prep, later, obs, attempt, results, notify)
    order = {sid: n for n, sid in enumerate(prep.plan.ids)}
    results.sort(key=lambda r: order.get(r.id, -1))  # plan order; runner-made stages first
    return Judged(results, controllers, env)


def _fail_fast(prep: Prepared, obs: Observation, results: list[StageResult]) -> list[StageResult]:
    """With --fail-fast that stopped the run: each in-image stage that reported nothing (its
    controller was cancelled) is SKIPPED with the reason, not an ERROR of its own."""
    gate = obs.fail_fast
    if gate is None or gate.reason is None:
        return results
    reported = {sid for cr in obs.runs for sid in cr.events.stages}
    planned = {s.id: s for s in prep.inside.stages}
    return [gate.stopped(planned[r.id]) if r.id in planned and r.id not in reported else r for r in results]


def _record_controller(
    cr: ControllerRun, attempt: Attempt, env: dict[str, object], suffix: str
) -> dict[str, object]:
    """One controller's evidence files and facts; the environment from its start event."""
    br, events = cr.bundle_run, cr.events
    attempt.write(f"controller{suffix}.events.log", events.event_lines)
    attempt.write(f"controller{suffix}.stdout.other.log", events.noise_head)
    attempt.write(f"controller{suffix}.stderr.log", br.stderr)
    if events.start and "controller" not in env:
        env["python"] = events.start.get("python")
        env["gpu"] = events.start.get("gpu")  # the image's word: what its controller saw
        env["gpus_granted"] = br.gpus.to_json() if br.gpus is not None else None  # the runner's
        # How the controller protected its events (probes/controller.py harden()).
        env["controller"] = {"protection": events.start.get("protection"), "pid": events.start.get("pid")}
        env["in_image"] = {
            k: events.start.get(k) for k in ("executable", "platform", "uid", "home_redirected_to")
        }
    return {
        "stages": cr.stage_ids,
        # The runner's own fact (BundleRun.gpus), beside the image's report in `environment.gpu`.
        "gpus_granted": br.gpus.to_json() if br.gpus is not None else None,
        "interpreter": br.interpreter,
        "interpreters_tried": br.tried,
        "exit_code": br.exit_code,
        "timed_out": br.timed_out,
        "error": br.error,
        "stdout_bytes": br.stdout_total,
        "stderr_bytes": br.stderr_total,
        **br.facts,
        "events": {
            "accepted": len(events.stages) + (events.start is not None) + (events.end is not None),
            "violations": events.violations_total,
            "other_output_bytes": events.noise_bytes,
        },
    }


def _cut_reason(br: BundleRun, events: protocol.Events) -> str:
    if br.error and br.exit_code is None and not br.timed_out:
        return br.error
    if br.timed_out:
        return br.error or "overall deadline reached"
    if events.start is None:
        tail = br.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        return f"the controller did not start (exit {br.exit_code}): {tail[0][:300]}"
    return f"the run was cut: no end event (exit {br.exit_code})"


def _distrust(events: protocol.Events) -> str | None:
    reasons = []
    if events.violations_total:
        shown = "; ".join(events.violations[:3])
        more = events.violations_total - min(3, len(events.violations))
        reasons.append(
            f"{events.violations_total} line(s) claimed to be controller events and were rejected: {shown}"
            + (f" (and {more} more)" if more > 0 else "")
        )
    prot = j.obj((events.start or {}).get("protection"))
    if events.start is not None:
        missing = [k for k in ("isolated", "non_dumpable", "subreaper") if not prot.get(k)]
        if missing:
            why = f" ({prot['error']})" if prot.get("error") else ""
            reasons.append(
                "the controller could not protect its events from the stages: not "
                + ", not ".join(m.replace("_", "-") for m in missing)
                + why
            )
    return "; ".join(reasons) or None


def inside_results(
    prep: Prepared, runs: Sequence[ControllerRun], attempt: Attempt, clock: float | None = None
) -> list[StageResult]:
    out: list[StageResult] = []
    of: dict[str, ControllerRun] = {sid: cr for cr in runs for sid in cr.stage_ids}
    cut = {
        id(cr): None if cr.events.end is not None else _cut_reason(cr.bundle_run, cr.events) for cr in runs
    }
    reasons = [d for cr in runs if (d := _distrust(cr.events))]
    if reasons:
        # The image tried to speak for a controller, or a controller could not protect its
        # channel: no in-image result of this run can be trusted to be the probes' own.
        out.append(StageResult(INTEGRITY_STAGE, "controller", "inside", Status.ERROR, "; ".join(reasons)))
    numbers = prep.plan.folder_numbers
    for stage in prep.inside.stages:
        cr = of.get(stage.id)
        ev = cr.events.stages.get(stage.id) if cr else None
        if ev is None or cr is None:
            res = _unreported(stage, cr, cut[id(cr)] if cr else None)
        else:
            res = _reported(stage, ev, f"stages/{numbers[stage.id]:02d}-{stage.id}", attempt, gpu_granted(cr))
        began = cr.events.started.get(stage.id) if cr else None
        if clock is not None and began is not None:
            res = replace(res, started_s=max(0.0, began - clock))
        out.append(res)
    return out


def _on_gpu(stage: PlannedStage, res: StageResult, granted: bool) -> StageResult:
    """The runner's own fact on a reported stage: run where it granted GPUs and saw them, or not.
    A GPU stage that ran where it granted none is DEFERRED whatever the image says of its GPU
    (a lying interpreter can say it had one): it ran for the record, as the controller defers
    a stage on a host without a GPU, and `complete` runs it on GPUs."""
    if granted or "gpu" not in stage.requires or res.status in (Status.DEFERRED, Status.SKIPPED):
        return replace(res, on_gpu=granted)
    data = dict(res.data, ran_for_record={"status": res.status.value, "detail": res.detail})
    detail = (
        f"requires gpu, and the runner granted none; ran for the record: {res.detail or res.status.value}"
    )
    return replace(res, status=Status.DEFERRED, detail=detail, data=data)


def _unreported(stage: PlannedStage, cr: ControllerRun | None, cut: str | None) -> StageResult:
    """A stage without its event: the run was cut (no `end`), so it is ERROR, never PASS."""
    why = cut or "stage did not report"
    ran = 0.0
    if cr and stage.id in cr.events.started and cr.events.closed_at is not None:
        ran = cr.events.closed_at - cr.events.started[stage.id]
        why += f"; it was running for {ran:.1f}s"
    return StageResult(stage.id, stage.probe, "inside", Status.ERROR, why, ran)


def _reported(
    stage: PlannedStage, ev: dict[str, object], folder: str, attempt: Attempt, granted: bool
) -> StageResult:
    """A stage's event, the runner's GPU fact on it (`granted`: _on_gpu), and its output and
    artifacts as evidence files."""
    try:
        status = Status(ev.get("status"))
    except ValueError:
        status = Status.ERROR
    files = [
        attempt.write(f"{folder}/stdout.txt", _said(ev.get("stdout", ""))),
        attempt.write(f"{folder}/stderr.txt", _said(ev.get("stderr", ""))),
    ]
    for name, text in sorted(j.obj(ev.get("artifacts")).items()):
        safe = Path(str(name)).name  # never a path from inside the image
        files.append(attempt.write(f"{folder}/{safe}", str(text)))
    data = dict(j.obj(ev.get("data")))
    for key in ("ran_for_record", "stdout_bytes", "stderr_bytes", "survivors_killed"):
        if key in ev:
            data[key] = ev[key]
    said = StageResult(stage.id, stage.probe, "inside", status, str(ev.get("detail", "")), data=data)
    res = _on_gpu(stage, said, granted)
    result = {"id": stage.id, "status": res.status.value, "detail": res.detail, "data": res.data}
    files.append(attempt.write_json(f"{folder}/result.json", result))
    return replace(res, duration_s=j.number(ev.get("duration_s")) or 0.0, evidence=files)


def _said(output: object) -> str | bytes:
    """A stage's output as its event carries it (text; bytes as they are)."""
    return output if isinstance(output, str | bytes) else str(output)


def refused_skips(prep: Prepared, obs: Observation, done: set[str]) -> list[StageResult]:
    """The stages of a refused image: none runs in it. A layers stage still reports the
    driver's verification (its table, FAIL) or reads --source; every other stage is SKIPPED."""
    assert obs.refused is not None
    why = (
        f"the image was refused before it could run: see stage {obs.refused.id} ({obs.refused.status.value})"
    )
    reports = obs.verified is not None or prep.inputs.source is not None
    return [
        StageResult(s.id, s.probe, s.side, Status.SKIPPED, why)
        for s in prep.plan.stages
        if s.id not in done and not s.skipped and not (s.probe == "layers" and reports)
    ]


def left_out(stage: PlannedStage) -> StageResult:
    """A stage the plan leaves out. One the user skipped did not run: DEFERRED, so that no
    verdict or level counts it as passed and `complete` can run it."""
    if stage.user_skipped:
        why = f"not run: left out with {stage.skipped}; `imagegate complete` runs it"
        return StageResult(stage.id, stage.probe, stage.side, Status.DEFERRED, why)
    return StageResult(stage.id, stage.probe, stage.side, Status.SKIPPED, f"skipped: {stage.skipped}")
