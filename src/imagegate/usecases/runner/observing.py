"""How a driver (docker, local) runs an image and produces its Observation: the in-image stages
in one or more controllers and, meanwhile, the outside stages that need nothing from inside; a
refusal (the image never ran) as a stage of the runner's own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from imagegate._support import interrupts, workers
from imagegate.domain import protocol
from imagegate.domain.evidence import Attempt
from imagegate.domain.plan import Plan
from imagegate.domain.results import ImageFacts, StageResult
from imagegate.drivers.interface import BundleRequest, Driver, Refusal
from imagegate.usecases.runner.observation import ControllerRun, Display, FailFast, Observation
from imagegate.usecases.runner.outside import outside_results
from imagegate.usecases.runner.preparing import Notify, Prepared, RunOptions, now

if TYPE_CHECKING:
    from imagegate.oci.sources.interface import Source


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
        began = now()
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
        br.facts["started"], br.facts["finished"] = began, now()
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

    obs = Observation(image, env, [], now(), str(env.get("driver", driver.name)), opener)
    obs.clock, obs.progress = time.monotonic(), display.progress
    checked = driver.checked(image)
    obs.verified, obs.has_image = checked.verified, driver.has_image
    refusal = checked.refusal
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
