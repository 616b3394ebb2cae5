"""Before a run touches an image: the command line's options, the validated pipeline, its plan
and the probes bundle (`prepare`), and the inputs the attempt folder keeps (`Prepared.evidence`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from imagegate import pipeline
from imagegate._support import deadline
from imagegate.domain import probes_bundle as bundle
from imagegate.domain.evidence import json_bytes
from imagegate.domain.plan import Plan, build_plan

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
    cache_dir: str | None = None  # --cache-dir: the root cache, whose verified pairs the layers stage uses
    no_cache: bool = False  # --no-cache: the layers stage reads every blob


Notify = Callable[[str], None]


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class StageInputs:
    """What outside stages are given besides the image: the command line's choices."""

    source: str | None = None
    expect_config: str | None = None
    advisory_db: Path | None = None
    cache_dir: str | None = None  # where the layers stage finds verified pairs (its place is no input)
    no_cache: bool = False

    def to_json(self) -> dict[str, object]:
        db = str(self.advisory_db) if self.advisory_db is not None else None
        return {
            "source": self.source,
            "expect_config": self.expect_config,
            "advisory_db": db,
            "no_cache": self.no_cache,
        }


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

    def evidence(self) -> dict[str, bytes | str]:
        """The run's inputs, as its attempt folder keeps them (Attempt.begin)."""
        return {
            "pipeline.yaml": self.loaded.text,
            "plan.json": json_bytes(self.plan.to_json()),
            "bundle.pyz": self.bundle.data,
        }

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
    inputs = StageInputs(opts.source, opts.expect_config, opts.advisory_db, opts.cache_dir, opts.no_cache)
    return Prepared.of(loaded, plan, inputs)
