"""The probe registry (imagegate.pipeline.probes) against what it describes: the in-image
dispatch in probes/stage.py (standard library only, so it cannot import the registry), the
pipeline schema's stage models, and the in-image controller's skip rule."""

from __future__ import annotations

import io
import re
import typing
import zipfile
from pathlib import Path
from typing import Any

import pytest

from imagegate.domain import probes_bundle as bundle
from imagegate.domain.plan import PlannedStage, skip_reason
from imagegate.domain.results import Status
from imagegate.pipeline import spec as model
from imagegate.pipeline.params import PLATFORM_OVERRIDES, CliParams, FindSpecParams, InventoryParams
from imagegate.pipeline.probes import INSIDE_PROBES, OUTSIDE_PROBES, PROBES, Probe
from imagegate.stages import load_outside_probe
from tests.probes.test_parsers import load

PROBES_DIR = Path(__file__).resolve().parents[2] / "probes"


def test_every_inside_probe_is_a_module_with_run() -> None:
    """The image side takes a probe's module by its name (probes/stage.py): a registered inside
    probe is probes/NAME.py with a top-level run(params)."""
    for name in INSIDE_PROBES:
        source = (PROBES_DIR / f"{name}.py").read_text()
        assert re.search(r"^def run\(params", source, re.M), f"probes/{name}.py has no run(params)"


def test_every_pipeline_stage_model_matches_the_registry() -> None:
    (union, _field) = typing.get_args(model.Stage)
    by_probe = {}
    for cls in typing.get_args(union):
        (probe,) = typing.get_args(cls.model_fields["probe"].annotation)
        by_probe[probe] = cls.model_fields["with_"].annotation
    assert by_probe == {name: p.params for name, p in PROBES.items()}


def test_the_bundle_ships_the_registrys_probes() -> None:
    """What the image gets is what the registry names: each inside probe's module and helpers,
    beside the controller's own modules, and nothing else."""
    with zipfile.ZipFile(io.BytesIO(bundle.build({}).data)) as zf:
        shipped = {Path(n).stem for n in zf.namelist() if n.endswith(".py")}
    wanted = set(bundle.CONTROLLER)
    for name in INSIDE_PROBES:
        wanted |= {name, *PROBES[name].helpers}
    assert shipped == wanted
    # Every in-image module a shipped module imports is shipped too (a helper left unregistered
    # would surface only inside an image, as an ImportError of the stage).
    for name in shipped - {"__main__"}:
        imported = re.findall(r"^from \.(\w*) import (\w+)", (PROBES_DIR / f"{name}.py").read_text(), re.M)
        for module, what in imported:
            assert (module or what) in shipped, f"{name}.py imports {module or what}, which is not shipped"


def test_a_probe_in_one_place_only_stops_the_build() -> None:
    without = {n: p for n, p in PROBES.items() if n != "inventory"}
    with pytest.raises(bundle.RegistryMismatch, match=r"but no probe's module or helper: inventory\.py"):
        bundle.build({}, without)
    extra = {**PROBES, "new_probe": Probe("new_probe", "inside", InventoryParams)}
    with pytest.raises(bundle.RegistryMismatch, match=r"missing from .*: new_probe\.py"):
        bundle.build({}, extra)
    # serve names platforms.py among its helpers too: without it, only cli could have shipped it
    others = {n: p for n, p in PROBES.items() if n != "serve"}
    lost_helper = {**others, "cli": Probe("cli", "inside", CliParams, helpers=("versions",))}
    with pytest.raises(bundle.RegistryMismatch, match=r"no probe's module or helper: platforms\.py"):
        bundle.build({}, lost_helper)


def test_the_runner_knows_the_platform_overrides_the_cli_probe_applies() -> None:
    """One table (probes/platforms.py): the names a pipeline may give are its keys, and the cli
    probe applies that very table."""
    table = load("platforms").OVERRIDES
    assert set(PLATFORM_OVERRIDES) == set(table) and PLATFORM_OVERRIDES
    assert load("cli").OVERRIDES is table
    for name in table:
        assert CliParams(command=["vllm", "serve", "--help"], platform=name).platform == name
    with pytest.raises(ValueError, match=r"unknown platform 'tpu-cpu'; built-in: " + ", ".join(table)):
        CliParams(command=["vllm", "serve", "--help"], platform="tpu-cpu")


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


def test_on_a_gpu_run_the_serve_stage_waits_for_the_node_check() -> None:
    """The node check loads every GPU for seconds; a serve stage beside it would time the check's
    load, not the server's start-up (seen on an H200: readiness 1.7 s later than by hand)."""
    from imagegate.domain.plan import node_check_first
    from imagegate.pipeline.params import ServeParams

    serve = PlannedStage("serve", "serve", "inside", ServeParams(command=["srv", "{model}"]), 60.0)
    cpu = PlannedStage("find_spec", "find_spec", "inside", FindSpecParams(modules=["json"]), 60.0)
    check, *rest = node_check_first([cpu, serve])
    assert check.probe == "gpu_preflight"
    assert {s.id: s.needs for s in rest} == {"find_spec": (), "serve": (check.id,)}


@pytest.mark.parametrize("name", ["no_such_probe", "../controller", "controller", "_x", "os.path"])
def test_the_image_side_refuses_a_name_that_is_no_probe(name: str) -> None:
    stage = load("stage")
    with pytest.raises(ValueError, match="unknown in-image probe"):
        stage._probe(name)
    assert stage._probe("find_spec").run is load("find_spec").run
