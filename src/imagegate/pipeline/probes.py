"""The probe registry: every probe a pipeline may name, which side it runs on, the model of its
parameters and, for an outside probe, the function the runner calls. The pipeline schema, the
planner, the runner and the bundle all read it; `probes/stage.py` (standard library only, so it
cannot import this) dispatches the inside names, and a test keeps the two in step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from imagegate.pipeline.params import (
    AvRoundtripParams,
    CliParams,
    FindSpecParams,
    GpuPreflightParams,
    InventoryParams,
    LayersParams,
    Params,
    PipCheckParams,
    ServeParams,
    VulnsParams,
)

Side = Literal["inside", "outside"]


@dataclass(frozen=True)
class Probe:
    name: str
    side: Side
    params: type[Params]
    # Outside probes: "module:function" taking (OutsideContext, params) -> Outcome; imported
    # when the stage runs, so that loading a pipeline never imports the image libraries.
    run: str | None = None
    # Inside probes: the in-image modules (probes/NAME.py) the probe's own module needs besides
    # the controller's; the bundle ships the probe's module, these, and the controller's.
    helpers: tuple[str, ...] = ()


PROBES: dict[str, Probe] = {
    p.name: p
    for p in (
        Probe("pip_check", "inside", PipCheckParams),
        Probe("find_spec", "inside", FindSpecParams),
        Probe("cli", "inside", CliParams, helpers=("versions", "platforms")),
        Probe("av_roundtrip", "inside", AvRoundtripParams),
        Probe("inventory", "inside", InventoryParams),
        Probe("gpu_preflight", "inside", GpuPreflightParams, helpers=("gpu_worker",)),
        Probe(
            "serve",
            "inside",
            ServeParams,
            helpers=(
                "serve_engines",
                "serve_http",
                "serve_media",
                "serve_process",
                "cli",
                "versions",
                "platforms",
            ),
        ),
        Probe("layers", "outside", LayersParams, "imagegate.stages.layers:run_layers_stage"),
        Probe("vulns", "outside", VulnsParams, "imagegate.stages.vulns:run_vulns_stage"),
    )
}
INSIDE_PROBES = tuple(n for n, p in PROBES.items() if p.side == "inside")
OUTSIDE_PROBES = tuple(n for n, p in PROBES.items() if p.side == "outside")


def side_of(probe: str) -> Side:
    return PROBES[probe].side
