"""From a loaded pipeline and command-line additions to the plan: each stage with its validated
parameters, what runs inside the image (carried in the bundle) and what the runner does itself
afterwards. Typed throughout; JSON only for the bundle and the statement (`to_json`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from imagegate._support import jsontypes as j
from imagegate.domain.results import USER_SKIP
from imagegate.errors import UsageError
from imagegate.pipeline import LoadedPipeline
from imagegate.pipeline.params import (
    DOTTED_NAME,
    FindSpecParams,
    GpuPreflightParams,
    InventoryParams,
    Params,
    ServeParams,
    VulnsParams,
)
from imagegate.pipeline.probes import PROBES, Side
from imagegate.pipeline.spec import Pipeline, Stage

API_VERSION = "imagegate/v1"


@dataclass(frozen=True)
class PlannedStage:
    id: str
    probe: str
    side: Side
    params: Params
    timeout: float
    needs: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    skipped: str | None = None  # why the stage is left out (--skip, completed earlier)

    @property
    def user_skipped(self) -> bool:
        """Left out with --skip: it did not run, so it is DEFERRED (never passed), for
        `complete` to run later."""
        return (self.skipped or "").startswith(USER_SKIP)

    @classmethod
    def of(cls, s: Stage) -> PlannedStage:
        return cls(s.id, s.probe, s.side, s.with_, s.timeout, tuple(s.needs), tuple(s.requires))

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "id": self.id,
            "probe": self.probe,
            "side": self.side,
            "params": self.params.model_dump(mode="json", exclude_none=True),
            "timeout": self.timeout,
            "needs": list(self.needs),
            "requires": list(self.requires),
        }
        if self.skipped:
            out["skipped"] = self.skipped
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> PlannedStage:
        """A stage of a recorded plan (an earlier attempt's statement), validated again."""
        probe = PROBES[str(d["probe"])]
        return cls(
            str(d["id"]),
            probe.name,
            probe.side,
            probe.params.model_validate(d.get("params") or {}),
            _seconds(d["timeout"]),
            tuple(str(n) for n in j.items(d.get("needs"))),
            tuple(str(r) for r in j.items(d.get("requires"))),
            j.text(d.get("skipped")) or None,
        )


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"timeout {value!r}: not a number of seconds")
    return float(value)


@dataclass(frozen=True)
class PipelineRef:
    name: str
    version: str
    sha256: str
    source: str

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Plan:
    pipeline: PipelineRef
    python: str | None
    stop_on_fail: bool
    stages: tuple[PlannedStage, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "apiVersion": API_VERSION,
            "pipeline": self.pipeline.to_json(),
            "python": self.python,
            "stop_on_fail": self.stop_on_fail,
            "stages": [s.to_json() for s in self.stages],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> Plan:
        p = j.obj(d.get("pipeline"))
        ref = PipelineRef(
            str(p.get("name")), str(p.get("version")), str(p.get("sha256")), str(p.get("source"))
        )
        # A stage that is no object reads as an empty one, which names no probe: refused, not dropped.
        stages = tuple(PlannedStage.from_json(j.obj(s)) for s in j.items(d.get("stages")))
        return cls(ref, j.text(d.get("python")), bool(d.get("stop_on_fail")), stages)

    def with_stages(self, stages: Iterable[PlannedStage]) -> Plan:
        return dataclasses.replace(self, stages=tuple(stages))

    @property
    def ids(self) -> list[str]:
        return [s.id for s in self.stages]

    def inside(self) -> Plan:
        """The part of the plan the bundle carries: in-image stages that run."""
        return self.with_stages(s for s in self.stages if s.side == "inside" and not s.skipped)

    @property
    def outside_stages(self) -> list[PlannedStage]:
        return [s for s in self.stages if s.side == "outside" and not s.skipped]

    @property
    def folder_numbers(self) -> dict[str, int]:
        """Stage id -> its position in the plan: the number of its evidence folder."""
        return {s.id: n for n, s in enumerate(self.stages, 1)}


def build_plan(
    loaded: LoadedPipeline,
    *,
    modules: Sequence[str] = (),
    advisory_db: Path | None = None,
    gpus: bool = False,
    skip: Sequence[str] = (),
    model: str | None = None,
    startup_budget: float | None = None,
) -> Plan:
    """`advisory_db` may add the audit stages; `gpus` puts the GPU node check first; `skip`:
    stage ids the user leaves out (kept in the plan, marked, so the record says so)."""
    p = loaded.pipeline
    check_modules(modules)
    if modules and not any(s.probe == "find_spec" for s in p.stages):
        raise UsageError(
            f"--module given, but pipeline {p.name!r} has no find_spec stage",
            hint="use -p python, or add a find_spec stage to your pipeline",
        )
    stages = [PlannedStage.of(s) for s in p.stages]
    if modules:
        stages = [_add_modules(s, modules) for s in stages]
    if model is not None:
        stages = _set_model(p.name, stages, model)
    if startup_budget is not None:
        stages = _set_startup_budget(p.name, stages, startup_budget)
    stages += _audit_stages(p, {s.id for s in stages}, advisory_db)
    if gpus:
        stages = node_check_first(stages)
    ids = [s.id for s in stages]
    unknown = [x for x in skip if x not in ids]
    if unknown:
        raise UsageError(
            f"--skip {', '.join(unknown)}: no such stage in pipeline {p.name!r}",
            hint=f"its stages: {', '.join(ids)}",
        )
    stages = [dataclasses.replace(s, skipped=USER_SKIP + s.id) if s.id in skip else s for s in stages]
    check_serve_models(stages, gpus=gpus)
    ref = PipelineRef(p.name, p.version, loaded.sha256, loaded.source)
    return Plan(ref, p.python, p.stop_on_fail, tuple(stages))


def check_modules(modules: Sequence[str]) -> None:
    """-m values are module names; a comma list is one name per -m (it is never split: a value
    that is not a name is a typo to show, not to guess at)."""
    for m in modules:
        if re.fullmatch(DOTTED_NAME, m):
            continue
        parts = [x.strip() for x in m.split(",")]
        if "," in m and all(re.fullmatch(DOTTED_NAME, x) for x in parts):
            hint = "one module per -m: " + " ".join(f"-m {x}" for x in parts)
        else:
            hint = "a module name as `import` takes it, e.g. -m requests or -m vllm.entrypoints"
        raise UsageError(f"--module {m!r}: not a dotted module name", hint=hint)


def _add_modules(s: PlannedStage, modules: Sequence[str]) -> PlannedStage:
    if not isinstance(s.params, FindSpecParams):
        return s
    merged = list(dict.fromkeys([*s.params.modules, *modules]))
    return dataclasses.replace(
        s, params=FindSpecParams.model_validate({**s.params.model_dump(), "modules": merged})
    )


def _set_model(name: str, stages: list[PlannedStage], model: str) -> list[PlannedStage]:
    """--model: every serve stage serves the model at `model` (where the sandbox sees it)."""
    if not any(isinstance(s.params, ServeParams) for s in stages):
        raise UsageError(
            f"a model given (--model, --model-pvc, --model-host-path), but pipeline {name!r} has no serve stage",
            hint="use a pipeline with a serve stage (probe: serve), or give no model",
        )
    return [with_model(s, model) for s in stages]


def with_model(stage: PlannedStage, model: str) -> PlannedStage:
    """`stage` serving the model at `model` when it is a serve stage; any other stage as it is."""
    if not isinstance(stage.params, ServeParams):
        return stage
    return dataclasses.replace(stage, params=stage.params.model_copy(update={"model": model}))


def check_serve_models(stages: Iterable[PlannedStage], *, gpus: bool) -> None:
    """Before any work: a serve stage that will start its server here (it needs no GPU, or the
    run has GPUs) and whose command names {model} needs a model. Without GPUs a GPU serve stage
    is DEFERRED and `complete --model` gives it one then; a parse-only stage starts nothing."""
    for s in stages:
        if not isinstance(s.params, ServeParams) or s.skipped or s.params.parse_only:
            continue
        runs_here = gpus or "gpu" not in s.requires
        if runs_here and s.params.model is None and any("{model}" in a for a in s.params.command):
            where = "on the GPUs given (--gpus)" if "gpu" in s.requires else "here"
            raise UsageError(
                f"stage {s.id} would start its server {where}, and no model was given: its command "
                "names {model}",
                hint=f"give --model PATH (or --model-pvc / --model-host-path for a Pod), or --skip {s.id}",
            )


# What a serve stage needs after its server is ready: the functional and bad-media requests.
SERVE_CHECKS_S = 600.0


def _set_startup_budget(name: str, stages: list[PlannedStage], budget: float) -> list[PlannedStage]:
    """--startup-budget: every serve stage waits that long for readiness, and its timeout covers
    it and the requests after it (so a Job's deadline, the timeouts added up, covers it too)."""
    if not any(isinstance(s.params, ServeParams) for s in stages):
        raise UsageError(
            f"--startup-budget given, but pipeline {name!r} has no serve stage",
            hint="use a pipeline with a serve stage (probe: serve), or drop --startup-budget",
        )
    return [
        dataclasses.replace(
            s,
            params=s.params.model_copy(update={"startup_timeout": budget}),
            timeout=max(s.timeout, budget + SERVE_CHECKS_S),
        )
        if isinstance(s.params, ServeParams)
        else s
        for s in stages
    ]


NODE_CHECK = "node_check"


def node_check_first(stages: Sequence[PlannedStage]) -> list[PlannedStage]:
    """A GPU run starts with the node check (gpu_preflight), and the image's GPU stages need it:
    a node that is not fit leaves them SKIPPED and the run ERROR, never a FAIL of the image. A
    serve stage needs it too, GPU or not: beside the check's sustained load it would time the
    check, not the server. A pipeline with its own gpu_preflight stage keeps it (then that one is
    the node check)."""
    if any(s.probe == "gpu_preflight" for s in stages):
        return list(stages)
    sid = _free_id(NODE_CHECK, {s.id for s in stages})
    check = PlannedStage(sid, "gpu_preflight", "inside", GpuPreflightParams(), 900.0, requires=("gpu",))
    out = [check]
    for s in stages:
        if s.side == "inside" and ("gpu" in s.requires or s.probe == "serve"):
            s = dataclasses.replace(s, needs=(sid, *s.needs))
        out.append(s)
    return out


def _audit_stages(p: Pipeline, taken: set[str], db: Path | None) -> list[PlannedStage]:
    """--advisory-db on a pipeline without a vulns stage adds the audit: an inventory stage
    (unless the pipeline has one) and a vulns stage that needs it. Without it nothing is added,
    so a pipeline never depends on a database it was not given."""
    if db is not None and not Path(db).exists():
        raise UsageError(
            f"--advisory-db {db}: no such folder",
            hint="give a folder of OSV advisories, e.g. a copy of the PyPA advisory database",
        )
    inventory = next((s.id for s in p.stages if s.probe == "inventory"), None)
    if any(s.probe == "vulns" for s in p.stages):
        if inventory is None:
            raise UsageError(
                f"pipeline {p.name!r} has a vulns stage but no inventory stage",
                hint="add a stage with probe: inventory before it, and list it in the vulns stage's needs",
            )
        return []
    if db is None:
        return []
    added: list[PlannedStage] = []
    if inventory is None:
        inventory = _free_id("inventory", taken)
        added.append(PlannedStage(inventory, "inventory", "inside", InventoryParams(), 120.0))
    vulns = _free_id("vulns", taken)
    added.append(PlannedStage(vulns, "vulns", "outside", VulnsParams(), 300.0, needs=(inventory,)))
    return added


def _free_id(base: str, taken: set[str]) -> str:
    n, sid = 1, base
    while sid in taken:
        n += 1
        sid = f"{base}_{n}"
    taken.add(sid)
    return sid


def skip_reason(
    stage: PlannedStage,
    statuses: Mapping[str, object],
    stopped_by: str | None,
    node_checks: Iterable[str] = (),
) -> str | None:
    """Why `stage` is SKIPPED, or None when it runs: after a FAIL with stop_on_fail (`stopped_by`
    names the failed stage), or when a stage it needs did not PASS. The GPU node check DEFERRED
    means no GPU here, not a broken node: a GPU stage that needs it still runs. The in-image
    controller (probes/controller.py, standard library only) applies the same rule with the same
    words; a test holds the two together. `statuses`: stage id -> Status or its value."""
    if stopped_by is not None:
        return f"stop_on_fail: {stopped_by} failed"
    status = {k: getattr(v, "value", v) for k, v in statuses.items()}
    checks = set(node_checks)
    unmet = [n for n in stage.needs if status.get(n) != "PASS"]
    unmet = [n for n in unmet if not (n in checks and status.get(n) == "DEFERRED")]
    if unmet:
        return "needs " + ", ".join(f"{n} is {status.get(n, 'not run')}" for n in unmet)
    return None
