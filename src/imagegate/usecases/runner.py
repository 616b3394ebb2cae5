"""One acceptance run: plan → bundle → observation (what a driver saw) → stage results → outside
stages → verdict → evidence and statement. Outcomes are data; only setup problems raise."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from imagegate import __version__, pipeline
from imagegate._support import deadline, interrupts, workers
from imagegate._support import jsontypes as j
from imagegate._support.jsontypes import JsonObject
from imagegate.attest.statement import build_statement
from imagegate.domain import probes_bundle as bundle
from imagegate.domain import protocol
from imagegate.domain.evidence import Attempt, sha256_file
from imagegate.domain.plan import Plan, PlannedStage, build_plan, skip_reason
from imagegate.domain.results import EvidenceFile, ImageFacts, RunRecord, StageResult, Status, verdict
from imagegate.domain.statements import Acceptance, Statement
from imagegate.drivers.interface import BundleRequest, BundleRun, Driver, Refusal
from imagegate.stages import ImageSourceOpener, Outcome, OutsideContext, load_outside_probe

if TYPE_CHECKING:  # the verification loads with the layers stage, not with every run
    from imagegate.oci.layercheck import Progress, VerifyReport
    from imagegate.oci.sources.interface import Source

STARTUP_SLACK_S = 60.0  # container start + interpreter start + bundle transfer
PREPARE_S = 1800.0  # with no --timeout: pulling or unpacking the image (20 GB over a slow link)


@dataclass
class RunOptions:
    pipeline: str
    modules: Sequence[str] = ()
    out: Path = Path("imagegate-runs")
    source: str | None = None  # --source: where outside stages read the image
    expect_config: str | None = None
    advisory_db: Path | None = None  # --advisory-db: adds the audit, overrides a stage's own folder
    gpus: str | None = None  # --gpus: the plan starts with the GPU node check
    skip: Sequence[str] = ()  # stage ids the user left out (--skip): DEFERRED; their dependents SKIPPED
    jobs: int = 1  # in-image stage groups run at once (container drivers only)
    model: str | None = None  # --model: the serve stages' model, where the sandbox sees it
    startup_budget: float | None = None  # --startup-budget: the serve stages' time to readiness
    fail_fast: bool = False  # --fail-fast: stop the stages still running once no verdict can accept


@dataclass(frozen=True)
class Display:
    """What shows a run while it happens (report.progress.run_shown makes one); it sees, never
    decides: the controller events as they arrive, and the layers stage's blob progress."""

    on_event: Callable[[dict[str, object]], None] | None = None
    progress: Progress | None = None


Notify = Callable[[str], None]


class FailFast:
    """--fail-fast: once a stage's result leaves the verdict no way to be accepted (FAIL or ERROR
    of a stage that no `requires` may turn DEFERRED), the stages still running stop: the
    controllers by `cancel` (each removes its container), the outside stages' reads by the stop
    (interrupts.stop), lifted once they ended. What stopped is SKIPPED with `reason`. An image
    that says its own stage FAILed only rejects itself sooner."""

    def __init__(self, prep: Prepared, notify: Notify) -> None:
        self.cancel = threading.Event()
        self.reason: str | None = None
        self._deferrable = {s.id for s in prep.plan.stages if s.requires}
        self._notify = notify
        self._lock = threading.Lock()

    def saw(self, stage_id: str, status: str) -> None:
        if status not in (Status.FAIL.value, Status.ERROR.value) or stage_id in self._deferrable:
            return
        with self._lock:
            if self.reason is not None:
                return
            self.reason = f"stopped by --fail-fast: {stage_id} {status}, so no verdict could accept the image"
        self._notify(f"--fail-fast: {stage_id} {status}: stopping the stages still running")
        self.cancel.set()
        interrupts.stop()

    def watching(
        self, on_event: Callable[[dict[str, object]], None] | None
    ) -> Callable[[dict[str, object]], None]:
        def relay(ev: dict[str, object]) -> None:
            if ev.get("event") == "stage":
                self.saw(str(ev.get("id")), str(ev.get("status")))
            if on_event is not None:
                on_event(ev)

        return relay

    def stopped(self, stage: PlannedStage) -> StageResult:
        assert self.reason is not None
        return StageResult(stage.id, stage.probe, stage.side, Status.SKIPPED, self.reason)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class StageInputs:
    """What outside stages are given besides the image: the command line's choices."""

    source: str | None = None
    expect_config: str | None = None
    advisory_db: Path | None = None


@dataclass(frozen=True)
class Prepared:
    """What a run needs before it touches an image: the validated pipeline, the plan, the bundle."""

    loaded: pipeline.LoadedPipeline
    plan: Plan
    bundle: bundle.Bundle
    inputs: StageInputs = StageInputs()

    @classmethod
    def of(cls, loaded: pipeline.LoadedPipeline, plan: Plan, inputs: StageInputs = StageInputs()) -> Prepared:
        return cls(loaded, plan, bundle.build(plan.inside().to_json()), inputs)

    @property
    def inside(self) -> Plan:
        return self.plan.inside()

    @property
    def stage_ids(self) -> list[str]:
        return self.inside.ids

    @property
    def interpreters(self) -> list[str]:
        py = self.plan.python
        return [py] if py else ["python3", "python"]

    def deadline(self, ids: Sequence[str] | None = None) -> float:
        """The in-image deadline of the stages `ids` (default: all of them, one controller): their
        timeouts added up, ending by the command's deadline (all of it, when --timeout named it)."""
        stages = [s for s in self.inside.stages if ids is None or s.id in ids]
        return deadline.budget(sum(s.timeout for s in stages) + STARTUP_SLACK_S)

    def overall(self, timeout: float | None) -> float:
        """The whole command's deadline: --timeout, or getting the image (PREPARE_S) and every
        stage's timeout added up."""
        stages = sum(s.timeout for s in self.plan.stages if not s.skipped)
        return timeout or PREPARE_S + stages + STARTUP_SLACK_S


def prepare(opts: RunOptions) -> Prepared:
    loaded = pipeline.load(opts.pipeline)
    plan = build_plan(
        loaded,
        modules=opts.modules,
        advisory_db=opts.advisory_db,
        gpus=bool(opts.gpus),
        skip=opts.skip,
        model=opts.model,
        startup_budget=opts.startup_budget,
    )
    inputs = StageInputs(opts.source, opts.expect_config, opts.advisory_db)
    return Prepared.of(loaded, plan, inputs)


def new_attempt(prep: Prepared, image: ImageFacts, out: Path) -> Attempt:
    """A fresh attempt folder holding the run's inputs."""
    attempt = Attempt(out, image)
    attempt.write("pipeline.yaml", prep.loaded.text)
    attempt.write_json("plan.json", prep.plan.to_json())
    attempt.write("bundle.pyz", prep.bundle.data)
    return attempt


@dataclass
class ControllerRun:
    """One controller's run over some of the in-image stages (one container each: runs of a
    container driver are isolated from each other as stages within one run are)."""

    stage_ids: list[str]
    bundle_run: BundleRun
    events: protocol.Events


@dataclass(frozen=True)
class Capabilities:
    """What this run had, as its first controller said at its start (probes/controller.py): the
    control data a `requires` rule reads, typed, apart from the environment evidence."""

    gpu: bool = False

    @classmethod
    def reported(cls, start: dict[str, object] | None, granted: bool) -> Capabilities:
        """A GPU where the controller saw one and the runner had granted it (`granted`): the
        image's word alone is no GPU."""
        gpu = (start or {}).get("gpu")
        return cls(gpu=granted and isinstance(gpu, dict) and gpu.get("present") is True)


def gpu_granted(cr: ControllerRun | None) -> bool:
    """Whether the runner granted GPUs to this controller's container or process and saw them
    (the driver's own fact, BundleRun.gpus)."""
    grant = cr.bundle_run.gpus if cr is not None else None
    return grant is not None and grant.granted


@dataclass
class Observation:
    """What a driver saw of one run, however it ran (containers, this environment, a Pod): the
    image, the environment, each controller's raw output, when it started, and how to read the
    image's bytes for the outside stages. `conclude` turns it into results."""

    image: ImageFacts
    environment: dict[str, object]
    runs: list[ControllerRun]
    started: str
    driver: str
    image_source: ImageSourceOpener | None = None  # the driver's own way to the image's bytes
    source: str | None = None  # a transport to read the image from, when the driver knows one
    verified: VerifyReport | None = None  # the driver's own verification of these bytes (rootfs)
    has_image: bool = True  # False: the run checked an environment (Driver.has_image)
    # Results the observer made itself (the Pod's image_id check) or carried over (a
    # completion's earlier stages), and outside stages it already ran alongside the image's.
    given: list[StageResult] = field(default_factory=list)
    outside_done: list[StageResult] = field(default_factory=list)
    completes: dict[str, object] | None = None  # `imagegate complete`: the link to the earlier attempt
    # The image was refused before it could run (Driver.refusal): nothing ran in it. Apart from
    # `given`, which a completion replaces with the earlier results: a refusal is never lost.
    refused: StageResult | None = None
    # When this runner began watching (monotonic): stages' starts are counted from it. None: the
    # stages ran unwatched (a Pod's log read afterwards), so no start is known.
    clock: float | None = None
    progress: Progress | None = None  # where the layers stage shows its blobs (Display.progress)
    fail_fast: FailFast | None = None  # --fail-fast, and whether it stopped the run

    @property
    def capabilities(self) -> Capabilities:
        first = next((cr for cr in self.runs if cr.events.start), None)
        return Capabilities.reported(first.events.start if first else None, gpu_granted(first))


def inside_groups(inside: Plan, jobs: int) -> list[list[str]]:
    """The in-image stages split into at most `jobs` groups that can run at the same time: a
    stage stays with the stages it `needs` (and they with it); with stop_on_fail, one group.
    Groups are filled round-robin in plan order, so slow neighbours land apart."""
    ids = inside.ids
    if jobs <= 1 or inside.stop_on_fail or len(ids) <= 1:
        return [ids] if ids else []
    root = {i: i for i in ids}

    def find(x: str) -> str:
        while root[x] != x:
            x = root[x]
        return x

    for s in inside.stages:
        for n in s.needs:
            if n in root:
                root[find(s.id)] = find(n)
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

    def __init__(self, ids: list[str], on_event: Callable[[dict[str, object]], None]) -> None:
        self.ids, self.on_event = ids, on_event
        self.held: dict[str, dict[str, object]] = {}
        self.next = 0
        self.started = False
        self.lock = threading.Lock()

    def __call__(self, ev: dict[str, object]) -> None:
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
    prep: Prepared,
    driver: Driver,
    image: ImageFacts,
    opts: RunOptions,
    on_event: Callable[[dict[str, object]], None] | None = None,
    cancel: threading.Event | None = None,
) -> list[ControllerRun]:
    """Every in-image stage, in one controller or (a container driver, --jobs > 1) in several
    at once. Runs happen in worker threads; an interrupt (or `cancel`, set by --fail-fast)
    cancels them, and each removes its container before the interrupt goes on."""
    jobs = opts.jobs if driver.isolated_runs else 1
    groups = inside_groups(prep.inside, jobs)
    if not groups:
        return []
    relay = _PlanOrder(prep.stage_ids, on_event) if on_event else None
    cancel = cancel or threading.Event()

    def one(ids: list[str]) -> ControllerRun:
        key = protocol.new_key()  # this controller's event key: only it gets it
        stream = protocol.EventStream(key, ids, relay)
        deadline = prep.deadline(ids)
        began = _now()
        br = driver.run_bundle(
            BundleRequest(
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
        )
        br.facts["event_key"] = key.hex()  # spent: published so the event log can be re-checked
        br.facts["started"], br.facts["finished"] = began, _now()
        return ControllerRun(ids, br, stream.close())

    # Each run stops and removes its container when cancelled; then the interrupt goes on.
    return workers.run_all(one, groups, cancel, "controller")


def observe(
    prep: Prepared,
    driver: Driver,
    image: ImageFacts,
    attempt: Attempt,
    opts: RunOptions,
    notify: Notify = lambda _m: None,
    display: Display = Display(),
) -> Observation:
    """How a driver (docker, local) produces its Observation: the in-image stages in its
    controllers and, meanwhile, the outside stages that need nothing from inside."""
    env = dict[str, object](driver.environment())

    def opener(timeout: float | None) -> Source | None:
        return driver.image_source(image, timeout)

    obs = Observation(image, env, [], _now(), str(env.get("driver", driver.name)), opener)
    obs.clock, obs.progress = time.monotonic(), display.progress
    obs.verified, obs.has_image = driver.verified_report(image), driver.has_image
    refusal = driver.refusal(image)
    if refusal is not None:
        # Refused before it could run (e.g. a layer that failed verification while unpacked):
        # nothing runs in it; conclude skips its stages and signs the refusal like any outcome.
        obs.refused = refused_stage(refusal, attempt)
        notify(refusal.detail)
        return obs
    # Outside stages that need nothing from inside run while the image's stages do; one that
    # `requires` a capability waits for the controller to say what this run has.
    early = [s for s in prep.plan.outside_stages if not (s.needs or s.requires or prep.plan.stop_on_fail)]
    gate = obs.fail_fast = FailFast(prep, notify) if opts.fail_fast else None
    on_event = display.on_event if gate is None else gate.watching(display.on_event)

    def outside() -> list[StageResult]:
        return outside_results(prep, early, obs, attempt, [], notify) if early else []

    with workers.background(outside, "outside") as done:
        if prep.inside.stages:
            notify(
                f"running {len(prep.inside.stages)} stages in {image.reference} "
                f"({env.get('engine') or env['driver']})"
            )
            obs.runs = run_inside(prep, driver, image, opts, on_event, gate.cancel if gate else None)
        obs.outside_done = done.result()
    if gate is not None and gate.reason is not None:
        interrupts.resume()  # what it stopped has ended; the run goes on to its verdict
    return obs


REFUSAL_PROBE = "refusal"


def refused_stage(refusal: Refusal, attempt: Attempt) -> StageResult:
    """The refusal as a stage of the runner's own, its evidence what was found: the layer, the
    expected and actual digests, the entry, the source, and the verification table so far."""
    report = refusal.report.to_dict() if refusal.report is not None else None
    evidence = attempt.write_json(f"{refusal.stage}.json", {**refusal.facts, "verification": report})
    return StageResult(
        refusal.stage, REFUSAL_PROBE, "outside", refusal.status, refusal.detail, 0.0,
        dict(refusal.facts), [evidence],
    )  # fmt: skip


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


class DriverObserver:
    """A driver (docker, local) as the acceptance use case's observer."""

    def __init__(
        self,
        driver: Driver,
        reference: str | None,
        opts: RunOptions,
        notify: Notify = lambda _m: None,
        display: Display = Display(),
    ) -> None:
        self.driver, self.reference, self.opts, self.notify = driver, reference, opts, notify
        self.display = display
        self.image: ImageFacts | None = None

    def subject(self, prep: Prepared) -> ImageFacts:
        self.image = self.driver.resolve(self.reference or "local")
        return self.image

    def observe(self, prep: Prepared, attempt: Attempt) -> Observation:
        assert self.image is not None, "subject() first"
        return observe(prep, self.driver, self.image, attempt, self.opts, self.notify, self.display)

    def left_behind(self) -> str | None:
        return self.driver.left_behind()


@dataclass(frozen=True)
class Concluded:
    record: RunRecord
    statement: Statement[Acceptance]  # as written to statement.json; what is signed and reported


def conclude(
    prep: Prepared, obs: Observation, attempt: Attempt, notify: Notify = lambda _m: None
) -> Concluded:
    """From what a driver observed (containers, a local process, a Pod log) to stage results,
    outside stages, the verdict, the evidence and the statement."""
    env = obs.environment
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
    attempt.write_json(
        "run.json",
        {"environment": env, "bundle_sha256": prep.bundle.sha256, "run": {"controllers": controllers}},
    )
    record = RunRecord(
        attempt_id=attempt.id,
        attempt_dir=str(attempt.dir),
        pipeline=prep.plan.pipeline.to_json(),
        plan=prep.plan.to_json(),
        image=obs.image,
        environment=env,
        stages=results,
        started_at=obs.started,
        finished_at=_now(),
        verdict=verdict(results),
        imagegate_version=__version__,
        bundle_sha256=prep.bundle.sha256,
        completes=obs.completes,
    )
    statement = build_statement(record)
    attempt.write_json("statement.json", statement.to_json())
    attempt.append_index(
        {
            "attempt": attempt.id,
            "verdict": record.verdict,
            "reference": obs.image.reference,
            "pipeline": prep.plan.pipeline.name,
            "finished": record.finished_at,
        }
    )
    return Concluded(record, statement)


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
