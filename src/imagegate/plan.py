"""From a loaded pipeline and command-line additions to the plan: what runs inside the image
(carried in the bundle) and what the runner does itself afterwards."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from imagegate.errors import UsageError
from imagegate.pipeline import LoadedPipeline
from imagegate.pipeline.model import (
    FindSpecStage,
    GpuPreflightStage,
    InventoryStage,
    Pipeline,
    Stage,
    VulnsStage,
)


def build_plan(
    loaded: LoadedPipeline,
    *,
    modules: Sequence[str] = (),
    extra: Mapping[str, Any] | None = None,
    skip: Sequence[str] = (),
) -> dict[str, Any]:
    """`extra`: command-line options that may add stages (e.g. an advisory database); `skip`:
    stage ids the user leaves out (kept in the plan, marked, so the record says so)."""
    p = loaded.pipeline
    find_spec_stages = [s for s in p.stages if isinstance(s, FindSpecStage)]
    if modules and not find_spec_stages:
        raise UsageError(
            f"--module given, but pipeline {p.name!r} has no find_spec stage",
            hint="use -p python, or add a find_spec stage to your pipeline",
        )
    stages: list[dict[str, Any]] = []
    for s in p.stages:
        params = s.with_.model_dump(mode="json", exclude_none=True)
        if isinstance(s, FindSpecStage) and modules:
            params["modules"] = list(dict.fromkeys([*params.get("modules", []), *modules]))
        stages.append(_entry(s, params))
    stages += _audit_stages(p, {s["id"] for s in stages}, extra or {})
    if (extra or {}).get("gpus"):
        stages = node_check_first(stages)
    ids = [s["id"] for s in stages]
    unknown = [x for x in skip if x not in ids]
    if unknown:
        raise UsageError(
            f"--skip {', '.join(unknown)}: no such stage in pipeline {p.name!r}",
            hint=f"its stages: {', '.join(ids)}",
        )
    for entry in stages:
        if entry["id"] in skip:
            entry["skipped"] = "--skip " + entry["id"]
    return {
        "apiVersion": "imagegate/v1",
        "pipeline": {
            "name": p.name,
            "version": p.version,
            "sha256": loaded.sha256,
            "source": loaded.source,
        },
        "python": p.python,
        "stop_on_fail": p.stop_on_fail,
        "stages": stages,
    }


def _entry(s: Stage, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": s.id,
        "probe": s.probe,
        "side": s.side,
        "params": params,
        "timeout": s.timeout,
        "needs": list(s.needs),
        "requires": list(s.requires),
    }


NODE_CHECK = "node_check"


def node_check_first(stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A GPU run starts with the node check (gpu_preflight), and the image's GPU stages need it:
    a node that is not fit leaves them SKIPPED and the run ERROR, never a FAIL of the image. A
    pipeline with its own gpu_preflight stage keeps it (then that one is the node check)."""
    if any(s["probe"] == "gpu_preflight" for s in stages):
        return stages
    sid = _free_id(NODE_CHECK, {s["id"] for s in stages})
    check = GpuPreflightStage(id=sid, probe="gpu_preflight", requires=["gpu"], timeout=900)
    out = [_entry(check, check.with_.model_dump(mode="json", exclude_none=True))]
    for s in stages:
        if "gpu" in s["requires"] and s["side"] == "inside":
            s = dict(s, needs=[sid, *s["needs"]])
        out.append(s)
    return out


def _audit_stages(p: Pipeline, taken: set[str], extra: Mapping[str, Any]) -> list[dict[str, Any]]:
    """--advisory-db on a pipeline without a vulns stage adds the audit: an inventory stage
    (unless the pipeline has one) and a vulns stage that needs it. Without it nothing is added,
    so a pipeline never depends on a database it was not given."""
    db = extra.get("advisory_db")
    if db is not None and not Path(db).exists():
        raise UsageError(
            f"--advisory-db {db}: no such folder",
            hint="give a folder of OSV advisories, e.g. a copy of the PyPA advisory database",
        )
    inventory = next((s.id for s in p.stages if isinstance(s, InventoryStage)), None)
    if any(isinstance(s, VulnsStage) for s in p.stages):
        if inventory is None:
            raise UsageError(
                f"pipeline {p.name!r} has a vulns stage but no inventory stage",
                hint="add a stage with probe: inventory before it, and list it in the vulns stage's needs",
            )
        return []
    if db is None:
        return []
    added: list[Stage] = []
    if inventory is None:
        inventory = _free_id("inventory", taken)
        added.append(InventoryStage(id=inventory, probe="inventory", timeout=120))
    added.append(VulnsStage(id=_free_id("vulns", taken), probe="vulns", needs=[inventory]))
    return [_entry(s, s.with_.model_dump(mode="json", exclude_none=True)) for s in added]


def _free_id(base: str, taken: set[str]) -> str:
    n, sid = 1, base
    while sid in taken:
        n += 1
        sid = f"{base}_{n}"
    taken.add(sid)
    return sid


def stage_model(entry: Mapping[str, Any]) -> Stage:
    """The stage model of a plan entry that has no pipeline stage behind it (one added by a
    command-line option), validated like a pipeline's."""
    stage: Stage = _STAGE.validate_python(
        {"id": entry["id"], "probe": entry["probe"], "with": entry["params"], "needs": entry["needs"]}
    )
    return stage


_STAGE: TypeAdapter[Stage] = TypeAdapter(Stage)


def inside_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """The part of the plan the bundle carries: in-image stages only."""
    return dict(plan, stages=[s for s in plan["stages"] if s["side"] == "inside" and not s.get("skipped")])
