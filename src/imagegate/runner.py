"""One acceptance run: plan → bundle → driver → events → stage results → outside stages →
verdict → evidence and statement. Outcomes are data; only setup problems raise."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
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
    skip: Sequence[str] = ()  # stage ids the user left out (--skip): SKIPPED, and so are their dependents
    jobs: int = 1  # in-image stage groups run at once (container drivers only)
    # Sees each controller event as it arrives (progress display); never affects the verdict.
    on_event: Callable[[dict[str, Any]], None] | None = None
    completes: dict[str, Any] | None = None  # `imagegate complete`: the link to the earlier attempt


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
    def outside_stages(self) -> list[dict[str, Any]]:
        return [s for s in self.plan["stages"] if s["side"] == "outside" and not s.get("skipped")]

    @property
    def interpreters(self) -> list[str]:
        py = self.loaded.pipeline.python
        return [py] if py else ["python3", "python"]

    def deadline(self, override: float | None, ids: Sequence[str] | None = None) -> float:
        """The in-image deadline of the stages `ids` (default: all of them, one controller)."""
        stages = [s for s in self.inside["stages"] if ids is None or s["id"] in ids]
        return override or sum(s["timeout"] for s in stages) + STARTUP_SLACK_S

    @property
    def folder_numbers(self) -> dict[str, int]:
        """Stage id -> its position in the plan: the number of its evidence folder."""
        return {s["id"]: n for n, s in enumerate(self.plan["stages"], 1)}


def prepare(opts: RunOptions) -> Prepared:
    loaded = pipeline.load(opts.pipeline)
    full_plan = planning.build_plan(loaded, modules=opts.modules, extra=opts.extra, skip=opts.skip)
    inside = planning.inside_plan(full_plan)
    return Prepared(loaded, full_plan, inside, bundle.build(inside))


def new_attempt(prep: Prepared, image: ImageFacts, out: Path) -> Attempt:
    """A fresh attempt folder holding the run's inputs."""
    attempt = Attempt(out, image)
    attempt.write("pipeline.yaml", prep.loaded.text)
    attempt.write_json("plan.json", prep.plan)
    attempt.write("bundle.pyz", prep.bundle.data)
    return attempt


@dataclass
class ControllerRun:
    """One controller's run over some of the in-image stages (one container each: runs of a
    container driver are isolated from each other as stages within one run are)."""

    stage_ids: list[str]
    bundle_run: BundleRun
    events: protocol.Events


def inside_groups(inside: dict[str, Any], jobs: int) -> list[list[str]]:
    """The in-image stages split into at most `jobs` groups that can run at the same time: a
    stage stays with the stages it `needs` (and they with it); with stop_on_fail, one group.
    Groups are filled round-robin in plan order, so slow neighbours land apart."""
    stages = inside["stages"]
    ids = [s["id"] for s in stages]
    if jobs <= 1 or inside.get("stop_on_fail") or len(ids) <= 1:
        return [ids] if ids else []
    root = {i: i for i in ids}

    def find(x: str) -> str:
        while root[x] != x:
            x = root[x]
        return x

    for s in stages:
        for n in s["needs"]:
            if n in root:
                root[find(s["id"])] = find(n)
    components: dict[str, list[str]] = {}
    for i in ids:
        components.setdefault(find(i), []).append(i)
    groups: list[list[str]] = [[] for _ in range(min(jobs, len(components)))]
    for k, comp in enumerate(components.values()):
        groups[k % len(groups)].extend(comp)
    order = {sid: n for n, sid in enumerate(ids)}
    return [sorted(g, key=order.__getitem__) for g in groups]


class _PlanOrder:
    """Relays events from several controllers in plan order (progress reads like one run)."""

    def __init__(self, ids: list[str], on_event: Callable[[dict[str, Any]], None]) -> None:
        self.ids, self.on_event = ids, on_event
        self.held: dict[str, dict[str, Any]] = {}
        self.next = 0
        self.started = False
        self.lock = threading.Lock()

    def __call__(self, ev: dict[str, Any]) -> None:
        if ev.get("event") == "start":
            with self.lock:
                if not self.started:  # the first controller's start, for the whole plan
                    self.started = True
                    self.on_event(dict(ev, plan_stages=self.ids))
            return
        if ev.get("event") != "stage":
            return
        with self.lock:
            self.held[str(ev.get("id"))] = ev
            while self.next < len(self.ids) and self.ids[self.next] in self.held:
                self.on_event(self.held.pop(self.ids[self.next]))
                self.next += 1


def run_inside(
    prep: Prepared, driver: Driver, image: ImageFacts, opts: RunOptions, notify: Notify
) -> list[ControllerRun]:
    """Every in-image stage, in one controller or (a container driver, --jobs > 1) in several
    at once. Runs happen in worker threads; an interrupt cancels them, and each removes its
    container before the interrupt goes on."""
    jobs = opts.jobs if driver.isolated_runs else 1
    groups = inside_groups(prep.inside, jobs)
    if not groups:
        return []
    relay = _PlanOrder(prep.stage_ids, opts.on_event) if opts.on_event else None
    cancel = threading.Event()

    def one(ids: list[str]) -> ControllerRun:
        key = protocol.new_key()  # this controller's event key: only it gets it
        stream = protocol.EventStream(key, ids, relay)
        deadline = prep.deadline(opts.timeout, ids)
        began = _now()
        br = driver.run_bundle(
            image,
            prep.bundle.data,
            prep.bundle.sha256,
            prep.interpreters,
            deadline,
            event_key=key,
            on_stdout=stream.feed,
            stages=None if len(groups) == 1 else ids,
            cancel=cancel,
        )
        br.facts["event_key"] = key.hex()  # spent: published so the event log can be re-checked
        br.facts["started"], br.facts["finished"] = began, _now()
        return ControllerRun(ids, br, stream.close())

    with ThreadPoolExecutor(max_workers=len(groups), thread_name_prefix="controller") as pool:
        futures = [pool.submit(one, g) for g in groups]
        try:
            while not all(f.done() for f in futures):
                wait(futures, timeout=0.5)
        except BaseException:
            cancel.set()  # each run stops and removes its container; then the interrupt goes on
            wait(futures)
            raise
        return [f.result() for f in futures]


def run(reference: str, driver: Driver, opts: RunOptions, notify: Notify = lambda _m: None) -> RunRecord:
    prep = prepare(opts)
    image = driver.resolve(reference)
    env = dict(driver.environment())
    attempt = new_attempt(prep, image, opts.out)
    notify(f"attempt {attempt.dir}")
    started = _now()
    early = [] if prep.loaded.pipeline.stop_on_fail else [s for s in prep.outside_stages if not s["needs"]]
    runs: list[ControllerRun] = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="outside") as pool:
        # Outside stages that need nothing from inside run while the image's stages do.
        early_results = (
            pool.submit(outside_results, prep, early, image, env, driver, opts, attempt, [], notify)
            if early
            else None
        )
        if prep.inside["stages"]:
            notify(
                f"running {len(prep.inside['stages'])} stages in {reference} "
                f"({env.get('engine') or env['driver']})"
            )
            runs = run_inside(prep, driver, image, opts, notify)
        done_early = early_results.result() if early_results else []
    return conclude(
        prep, image, env, runs, attempt, opts, started=started, driver=driver, notify=notify,
        outside_done=done_early,
    )  # fmt: skip


def conclude(
    prep: Prepared,
    image: ImageFacts,
    env: dict[str, Any],
    runs: Sequence[ControllerRun],
    attempt: Attempt,
    opts: RunOptions,
    *,
    started: str,
    driver: Driver | None = None,
    notify: Notify = lambda _m: None,
    extra_stages: Sequence[StageResult] = (),
    outside_done: Sequence[StageResult] = (),
) -> RunRecord:
    """From the controllers' raw output (however it was obtained: containers, a local process, a
    Pod log) to stage results, outside stages, the verdict, the evidence and the statement."""
    results: list[StageResult] = list(extra_stages)
    controllers: list[dict[str, Any]] = []
    for n, cr in enumerate(runs):
        controllers.append(_record_controller(cr, attempt, env, "" if len(runs) == 1 else f"-{n + 1}"))
    if runs:
        results += inside_results(prep, runs, attempt)
    given = {r.id for r in extra_stages}  # a completion's earlier results stand for their stages
    results += [
        StageResult(s["id"], s["probe"], s["side"], Status.SKIPPED, f"skipped: {s['skipped']}")
        for s in prep.plan["stages"]
        if s.get("skipped") and s["id"] not in given
    ]
    done_ids = {r.id for r in outside_done}
    later = [s for s in prep.outside_stages if s["id"] not in done_ids]
    results += list(outside_done)
    results += outside_results(prep, later, image, env, driver, opts, attempt, results, notify)
    order = {s["id"]: n for n, s in enumerate(prep.plan["stages"])}
    results.sort(key=lambda r: order.get(r.id, -1))  # plan order; runner-made stages first
    run_facts: dict[str, Any] = {"controllers": controllers}
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
        completes=opts.completes,
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


def _record_controller(
    cr: ControllerRun, attempt: Attempt, env: dict[str, Any], suffix: str
) -> dict[str, Any]:
    """One controller's evidence files and facts; the environment from its start event."""
    br, events = cr.bundle_run, cr.events
    attempt.write(f"controller{suffix}.events.log", events.event_lines)
    attempt.write(f"controller{suffix}.stdout.other.log", events.noise_head)
    attempt.write(f"controller{suffix}.stderr.log", br.stderr)
    if events.start and "controller" not in env:
        env["python"] = events.start.get("python")
        env["gpu"] = events.start.get("gpu")
        # How the controller protected its events (probes/controller.py harden()).
        env["controller"] = {"protection": events.start.get("protection"), "pid": events.start.get("pid")}
        env["in_image"] = {
            k: events.start.get(k) for k in ("executable", "platform", "uid", "home_redirected_to")
        }
    return {
        "stages": cr.stage_ids,
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


def inside_results(prep: Prepared, runs: Sequence[ControllerRun], attempt: Attempt) -> list[StageResult]:
    inside = prep.inside
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
    numbers = prep.folder_numbers
    for stage in inside["stages"]:
        sid = stage["id"]
        cr = of.get(sid)
        ev = cr.events.stages.get(sid) if cr else None
        if ev is None:
            # Missing `end` means the run was cut: stages that did not report are ERROR.
            why = (cut[id(cr)] if cr else None) or "stage did not report"
            ran = 0.0
            if cr and sid in cr.events.started and cr.events.closed_at is not None:
                ran = cr.events.closed_at - cr.events.started[sid]
                why += f"; it was running for {ran:.1f}s"
            out.append(StageResult(sid, stage["probe"], "inside", Status.ERROR, why, ran))
            continue
        n = numbers[sid]
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
    prep: Prepared,
    stages: Sequence[dict[str, Any]],
    image: ImageFacts,
    env: dict[str, Any],
    driver: Driver | None,
    opts: RunOptions,
    attempt: Attempt,
    earlier: list[StageResult],
    notify: Notify,
) -> list[StageResult]:
    pipe = prep.loaded.pipeline
    by_id = {s.id: s for s in pipe.stages}
    numbers = prep.folder_numbers
    done = {r.id: r for r in earlier}
    out: list[StageResult] = []
    failed_before = any(r.status is Status.FAIL for r in earlier)
    driver_name = str(env.get("driver", "unknown"))
    docker_client = getattr(driver, "client", None)
    for stage in stages:
        n = numbers[stage["id"]]
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
                verified=getattr(driver, "verified_report", lambda _i: None)(image),
                inside_results=dict(done),
                options=dict(opts.extra),
                timeout_s=float(
                    stage["timeout"]
                ),  # the stage's own deadline (an engine export waits that long)
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
