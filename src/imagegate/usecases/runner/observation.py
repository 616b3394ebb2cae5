"""What a driver saw of one run, as values: each controller's raw output (`ControllerRun`), the
capabilities the run had, the `Observation` the judging reads, and the watchers that see a run
while it happens (`Display`, `FailFast`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from imagegate._support import interrupts
from imagegate.domain import protocol
from imagegate.domain.plan import PlannedStage
from imagegate.domain.results import ImageFacts, StageResult, Status
from imagegate.drivers.interface import BundleRun
from imagegate.stages import ImageSourceOpener
from imagegate.usecases.runner.preparing import Notify, Prepared

if TYPE_CHECKING:  # the verification loads with the layers stage, not with every run
    from imagegate.oci.layercheck import Progress, VerifyReport


@dataclass(frozen=True)
class Display:
    """What shows a run while it happens (report.progress.run_shown makes one); it sees, never
    decides: the controller events as they arrive, and the layers stage's blob progress."""

    on_event: Callable[[dict[str, object]], None] | None = None
    progress: Progress | None = None


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
