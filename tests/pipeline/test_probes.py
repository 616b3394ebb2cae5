"""The probe registry (imagegate.pipeline.probes) against what it describes: the in-image
dispatch in probes/stage.py (standard library only, so it cannot import the registry), the
pipeline schema's stage models, and the in-image controller's skip rule."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import pytest

from imagegate.model import Status
from imagegate.pipeline import model
from imagegate.pipeline.params import FindSpecParams
from imagegate.pipeline.probes import INSIDE_PROBES, OUTSIDE_PROBES, PROBES
from imagegate.plan import PlannedStage, skip_reason
from imagegate.stages import load_outside_probe
from tests.probes.test_parsers import load

PROBES_DIR = Path(__file__).resolve().parents[2] / "probes"


def test_inside_probes_are_the_ones_the_image_side_dispatches() -> None:
    dispatched = re.findall(r'name == "([a-z_]+)"', (PROBES_DIR / "stage.py").read_text())
    assert sorted(dispatched) == sorted(INSIDE_PROBES)
    assert all((PROBES_DIR / f"{name}.py").is_file() for name in INSIDE_PROBES)


def test_every_pipeline_stage_model_matches_the_registry() -> None:
    (union, _field) = typing.get_args(model.Stage)
    by_probe = {}
    for cls in typing.get_args(union):
        (probe,) = typing.get_args(cls.model_fields["probe"].annotation)
        by_probe[probe] = cls.model_fields["with_"].annotation
    assert by_probe == {name: p.params for name, p in PROBES.items()}


@pytest.mark.parametrize("name", OUTSIDE_PROBES)
def test_outside_probes_load(name: str) -> None:
    assert callable(load_outside_probe(name))


CASES: list[tuple[tuple[str, ...], dict[str, str], str | None]] = [
    ((), {}, None),
    (("a",), {"a": "PASS"}, None),
    (("a",), {"a": "FAIL"}, None),
    (("a", "b"), {"a": "PASS", "b": "ERROR"}, None),
    (("a",), {}, None),
    (("node_check",), {"node_check": "DEFERRED"}, None),
    (("node_check",), {"node_check": "FAIL"}, None),
    (("a",), {"a": "PASS"}, "x"),
]


@pytest.mark.parametrize(("needs", "statuses", "stopped_by"), CASES)
def test_the_runner_skips_as_the_controller_does(
    needs: tuple[str, ...], statuses: dict[str, str], stopped_by: str | None
) -> None:
    """One skip rule: the outside stages (plan.skip_reason) and the in-image stages
    (probes/controller.py) are SKIPPED in the same cases, with the same words."""
    controller = load("controller")
    stage = PlannedStage("s", "find_spec", "inside", FindSpecParams(), 10.0, needs)
    ours = skip_reason(stage, {k: Status(v) for k, v in statuses.items()}, stopped_by, {"node_check"})
    try:
        # Its work folder does not exist: a stage past the skip rule stops at its first step.
        event: dict[str, Any] | None = controller.run_stage(
            stage.to_json(), statuses, {}, stopped_by, b"", "/nonexistent-work", {}, {"node_check"}
        )
    except FileNotFoundError:
        event = None  # the controller would have run it
    if ours is None:
        assert event is None
    else:
        assert event is not None and (event["status"], event["detail"]) == ("SKIPPED", ours)
