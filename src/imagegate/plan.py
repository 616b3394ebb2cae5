"""From a loaded pipeline and command-line additions to the plan: what runs inside the image
(carried in the bundle) and what the runner does itself afterwards."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from imagegate.errors import UsageError
from imagegate.pipeline import LoadedPipeline
from imagegate.pipeline.model import FindSpecStage


def build_plan(
    loaded: LoadedPipeline, *, modules: Sequence[str] = (), extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """`extra`: command-line options that may add stages (e.g. an advisory database)."""
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
        stages.append(
            {
                "id": s.id,
                "probe": s.probe,
                "side": s.side,
                "params": params,
                "timeout": s.timeout,
                "needs": list(s.needs),
                "requires": list(s.requires),
            }
        )
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


def inside_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """The part of the plan the bundle carries: in-image stages only."""
    return dict(plan, stages=[s for s in plan["stages"] if s["side"] == "inside"])
