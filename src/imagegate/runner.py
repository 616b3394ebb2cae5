"""One acceptance run: plan → bundle → driver → events → stage results → outside stages →
verdict → evidence and statement. Outcomes are data; only setup problems raise."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagegate import __version__, bundle, pipeline, protocol
from imagegate import plan as planning
from imagegate.attest.statement import build_statement
from imagegate.drivers.interface import BundleRun, Driver
from imagegate.evidence import Attempt, sha256_file
from imagegate.model import EvidenceFile, ImageFacts, RunRecord, StageResult, Status, verdict
from imagegate.outside import Outcome, OutsideContext, load_outside_probe
from imagegate.pipeline.model import Pipeline

STARTUP_SLACK_S = 60.0  # container start + interpreter start + bundle transfer


@dataclass
class RunOptions:
    pipeline: str
    modules: Sequence[str] = ()
    out: Path = Path("imagegate-runs")
    timeout: float | None = None  # overall; default: the stages' timeouts added up + slack
    source: str | None = None
    expect_config: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Sees each controller event as it arrives (progress display); never affects the verdict.
    on_event: Callable[[dict[str, Any]], None] | None = None


Notify = Callable[[str], None]


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Prepared:
    """What a run needs before it touches an image: the validated pipeline, the plan, the bundle."""

    loaded: pipeline.LoadedPipeline
    plan: dict[str, Any]
    inside: dict[str, Any]
    bundle: bundle.Bundle

    @property
    def stage_ids(self) -> list[str]:
        return [s["id"] for s in self.inside["stages"]]

    @property
    def interpreters(self) -> list[str]:
        py = self.loaded.pipeline.python
        return [py] if py else ["python3", "python"]

    def deadline(self, override: float | None) -> float:
        return override or sum(s["timeout"] for s in self.inside["stages"]) + STARTUP_SLACK_S


def prepare(opts: RunOptions) -> Prepared:
    loaded = pipeline.load(opts.pipeline)
    full_plan = planning.build_plan(loaded, modules=opts.modules, extra=opts.extra)
    inside = planning.inside_plan(full_plan)
    return Prepared(loaded, full_plan, inside, bundle.build(inside))


def new_attempt(prep: Prepared, image: ImageFacts, out: Path) -> Attempt:
    """A fresh attempt folder holding the run's inputs."""
    attempt = Attempt(out, image)
    attempt.write("pipeline.yaml", prep.loaded.text)
    attempt.write_json("plan.json", prep.plan)
    attempt.write("bundle.pyz", prep.bundle.data)
    return attempt


def run(reference: str, driver: Driver, opts: RunOptions, notify: Notify = lambda _m: None) -> RunRecord:
    prep = prepare(opts)
    image = driver.resolve(reference)
    env = dict(driver.environment())
    attempt = new_attempt(prep, image, opts.out)
    notify(f"attempt {attempt.dir}")
    started = _now()
    br = None
    events = None
    if prep.inside["stages"]:
        notify(
            f"running {len(prep.inside['stages'])} stages in {reference} ({env.get('engine') or env['driver']})"
        )
        key = protocol.new_key()  # this run's event key: only the controller gets it
        stream = protocol.EventStream(key, prep.stage_ids, opts.on_event)
        br = driver.run_bundle(
            image,
            prep.bundle.data,
            prep.bundle.sha256,
            prep.interpreters,
            prep.deadline(opts.timeout),
            event_key=key,
            on_stdout=stream.feed,
        )
        events = stream.close()
        br.facts["event_key"] = key.hex()  # spent: published so the event log can be re-checked
    return conclude(
        prep,
        image,
        env,
        br,
        events,
        attempt,
        opts,
        started=started,
        docker_client=getattr(driver, "client", None),
        notify=notify,
    )


def conclude(
    prep: Prepared,
    image: ImageFacts,
    env: dict[str, Any],
    br: BundleRun | None,
    events: protocol.Events | None,
    attempt: Attempt,
    opts: RunOptions,
    *,
    started: str,
    docker_client: Any = None,
    notify: Notify = lambda _m: None,
    extra_stages: Sequence[StageResult] = (),
) -> RunRecord:
    """From the controller's raw output (however it was obtained: container, local process, Pod
    log) to stage results, outside stages, the verdict, the evidence and the statement."""
    results: list[StageResult] = list(extra_stages)
    run_facts: dict[str, Any] = {}
    if br is not None and events is not None:
        run_facts = {
            "interpreter": br.interpreter,
            "interpreters_tried": br.tried,
            "exit_code": br.exit_code,
            "timed_out": br.timed_out,
            "error": br.error,
            "stdout_bytes": br.stdout_total,
            "stderr_bytes": br.stderr_total,
            **br.facts,
        }
        run_facts["events"] = {
            "accepted": len(events.stages) + (events.start is not None) + (events.end is not None),
            "violations": events.violations_total,
            "other_output_bytes": events.noise_bytes,
        }
        attempt.write("controller.events.log", events.event_lines)
        attempt.write("controller.stdout.other.log", events.noise_head)
        attempt.write("controller.stderr.log", br.stderr)
        if events.start:
            env["python"] = events.start.get("python")
            env["gpu"] = events.start.get("gpu")
            # How the controller protected its events (probes/controller.py harden()).
            env["controller"] = {"protection": events.start.get("protection"), "pid": events.start.get("pid")}
            env["in_image"] = {
                k: events.start.get(k) for k in ("executable", "platform", "uid", "home_redirected_to")
            }
        results += inside_results(prep.inside, events, br, attempt)
    driver_name = str(env.get("driver", "unknown"))
    results += outside_results(
        prep.plan, prep.loaded.pipeline, image, driver_name, docker_client, opts, attempt, results, notify
    )
    attempt.write_json(
        "run.json", {"environment": env, "bundle_sha256": prep.bundle.sha256, "run": run_facts}
    )
    record = RunRecord(
        attempt_id=attempt.id,
        attempt_dir=str(attempt.dir),
        pipeline=prep.plan["pipeline"],
        plan=prep.plan,
        image=image,
        environment=env,
        stages=results,
        started_at=started,
        finished_at=_now(),
        verdict=verdict(results),
        imagegate_version=__version__,
        bundle_sha256=prep.bundle.sha256,
    )
    attempt.write_json("statement.json", build_statement(record))
    attempt.append_index(
        {
            "attempt": attempt.id,
            "verdict": record.verdict,
            "reference": image.reference,
            "pipeline": prep.plan["pipeline"]["name"],
            "finished": record.finished_at,
        }
    )
    return record


def _cut_reason(br: BundleRun, events: protocol.Events) -> str:
    if br.error and br.exit_code is None and not br.timed_out:
        return br.error
    if br.timed_out:
        return br.error or "overall deadline reached"
    if events.start is None:
        tail = br.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        return f"the controller did not start (exit {br.exit_code}): {tail[0][:300]}"
    return f"the run was cut: no end event (exit {br.exit_code})"


INTEGRITY_STAGE = "event_integrity"


def _distrust(events: protocol.Events) -> str | None:
    reasons = []
    if events.violations_total:
        shown = "; ".join(events.violations[:3])
        more = events.violations_total - min(3, len(events.violations))
        reasons.append(
            f"{events.violations_total} line(s) claimed to be controller events and were rejected: {shown}"
            + (f" (and {more} more)" if more > 0 else "")
        )
    prot = (events.start or {}).get("protection") or {}
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
    inside: dict[str, Any], events: protocol.Events, br: BundleRun, attempt: Attempt
) -> list[StageResult]:
    out: list[StageResult] = []
    cut = None if events.end is not None else _cut_reason(br, events)
    distrust = _distrust(events)
    if distrust:
        # The image tried to speak for the controller, or the controller could not protect its
        # channel: no in-image result of this run can be trusted to be the probes' own.
        out.append(StageResult(INTEGRITY_STAGE, "controller", "inside", Status.ERROR, distrust))
    for n, stage in enumerate(inside["stages"], 1):
        sid = stage["id"]
        ev = events.stages.get(sid)
        if ev is None:
            # Missing `end` means the run was cut: stages that did not report are ERROR.
            out.append(
                StageResult(sid, stage["probe"], "inside", Status.ERROR, cut or "stage did not report")
            )
            continue
        try:
            status = Status(ev.get("status"))
        except ValueError:
            status = Status.ERROR
        folder = f"stages/{n:02d}-{sid}"
        files = [
            attempt.write(f"{folder}/stdout.txt", ev.get("stdout", "")),
            attempt.write(f"{folder}/stderr.txt", ev.get("stderr", "")),
        ]
        for name, text in sorted((ev.get("artifacts") or {}).items()):
            safe = Path(str(name)).name  # never a path from inside the image
            files.append(attempt.write(f"{folder}/{safe}", str(text)))
        data = dict(ev.get("data") or {})
        for key in ("ran_for_record", "stdout_bytes", "stderr_bytes", "survivors_killed"):
            if key in ev:
                data[key] = ev[key]
        files.append(
            attempt.write_json(
                f"{folder}/result.json",
                {"id": sid, "status": status.value, "detail": ev.get("detail", ""), "data": data},
            )
        )
        out.append(
            StageResult(
                sid,
                stage["probe"],
                "inside",
                status,
                str(ev.get("detail", "")),
                float(ev.get("duration_s") or 0.0),
                data,
                files,
            )
        )
    return out


def outside_results(
    full_plan: dict[str, Any],
    pipe: Pipeline,
    image: ImageFacts,
    driver_name: str,
    docker_client: Any,
    opts: RunOptions,
    attempt: Attempt,
    earlier: list[StageResult],
    notify: Notify,
) -> list[StageResult]:
    by_id = {s.id: s for s in pipe.stages}
    done = {r.id: r for r in earlier}
    out: list[StageResult] = []
    failed_before = any(r.status is Status.FAIL for r in earlier)
    offset = len(earlier)
    for n, stage in enumerate([s for s in full_plan["stages"] if s["side"] == "outside"], offset + 1):
        sid = stage["id"]
        unmet = [x for x in stage["needs"] if done.get(x) is None or done[x].status is not Status.PASS]
        if unmet or (pipe.stop_on_fail and failed_before):
            why = (
                "needs "
                + ", ".join(f"{x} is {done[x].status.value if x in done else 'not run'}" for x in unmet)
                if unmet
                else "stop_on_fail: an earlier stage failed"
            )
            res = StageResult(sid, stage["probe"], "outside", Status.SKIPPED, why)
        else:
            folder = Path(f"stages/{n:02d}-{sid}")
            (attempt.dir / folder).mkdir(parents=True, exist_ok=False)
            ctx = OutsideContext(
                image=image,
                driver=driver_name,
                stage_dir=attempt.dir / folder,
                source=opts.source,
                expect_config_digest=opts.expect_config,
                docker_client=docker_client,
                inside_results=dict(done),
                options=dict(opts.extra),
            )
            notify(f"outside stage {sid} ({stage['probe']})")
            t0 = time.monotonic()
            try:
                # Stages added by an option (--advisory-db) have no pipeline entry: the plan's params.
                model = by_id[sid] if sid in by_id else planning.stage_model(stage)
                outcome = load_outside_probe(stage["probe"])(ctx, model.with_)
            except Exception as e:  # a bug or an unreadable source is an ERROR of the stage
                outcome = Outcome(Status.ERROR, f"{type(e).__name__}: {e}")
            files = []
            for p in sorted((attempt.dir / folder).rglob("*")):
                if p.is_file():
                    rel = str(p.relative_to(attempt.dir))
                    files.append(EvidenceFile(rel, sha256_file(p), p.stat().st_size))
            files.append(
                attempt.write_json(
                    f"{folder}/result.json",
                    {
                        "id": sid,
                        "status": outcome.status.value,
                        "detail": outcome.detail,
                        "data": outcome.data,
                    },
                )
            )
            res = StageResult(
                sid,
                stage["probe"],
                "outside",
                outcome.status,
                outcome.detail,
                time.monotonic() - t0,
                outcome.data,
                files,
            )
        out.append(res)
        done[sid] = res
        failed_before = failed_before or res.status is Status.FAIL
    return out
