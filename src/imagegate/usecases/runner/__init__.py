"""One acceptance run, in its phases: prepare (the plan and the bundle) → observe (a driver runs
the image's stages, the outside stages alongside) → judge (each stage's result and evidence) →
conclude (the verdict and the statement, as values) → the attempt writes them in one step. The
names the use cases and the drivers' observers use are here; outcomes are data, only setup
problems raise."""

from imagegate.usecases.runner.concluding import Concluded, conclude
from imagegate.usecases.runner.judging import INTEGRITY_STAGE, Judged, judge
from imagegate.usecases.runner.observation import (
    Capabilities,
    ControllerRun,
    Display,
    FailFast,
    Observation,
    gpu_granted,
)
from imagegate.usecases.runner.observing import DriverObserver, observe, refused_stage, run_inside
from imagegate.usecases.runner.preparing import (
    STARTUP_SLACK_S,
    Notify,
    Prepared,
    RunOptions,
    StageInputs,
    now,
    prepare,
)

__all__ = [
    "INTEGRITY_STAGE",
    "STARTUP_SLACK_S",
    "Capabilities",
    "Concluded",
    "ControllerRun",
    "Display",
    "DriverObserver",
    "FailFast",
    "Judged",
    "Notify",
    "Observation",
    "Prepared",
    "RunOptions",
    "StageInputs",
    "conclude",
    "gpu_granted",
    "judge",
    "now",
    "observe",
    "prepare",
    "refused_stage",
    "run_inside",
]
