"""The probe registry: every probe a pipeline may name, which side it runs on, the model of its
parameters, how its facts enter the signed statement and, for an outside probe, the function the
runner calls. The pipeline schema, the planner, the runner, the bundle and the statement all read
it; the image side (`probes/stage.py`) takes an inside probe's module by its name. A new probe is
three files: its module (probes/NAME.py or a stages/ function), its parameters (params.py) and
its entry here."""

from __future__ import annotations

from dataclasses import dataclass, field
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
class FactRules:
    """How one probe's `data` enters the predicate. `carried`: keys copied as facts; `items`: keys
    whose value is a list of records, with the keys a record may have; `evidence_only`: keys left,
    on purpose, to the stage's result.json (an evidence file whose sha256 the predicate lists):
    bulky lists (sys.path, the full inventory) and byte counts. A key in none of them is a fact
    the attestation does not know: building the statement fails rather than drop it."""

    carried: tuple[str, ...] = ()
    items: dict[str, tuple[str, ...]] = field(default_factory=dict)
    evidence_only: tuple[str, ...] = ()


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
    # How the probe's `data` enters the signed statement (attest/statement.py applies it).
    facts: FactRules = field(default_factory=FactRules)


PROBES: dict[str, Probe] = {
    p.name: p
    for p in (
        Probe(
            "pip_check",
            "inside",
            PipCheckParams,
            facts=FactRules(
                carried=("returncode", "unparsed"),
                items={
                    "problems": (
                        "kind",
                        "project",
                        "version",
                        "requirement",
                        "dependency",
                        "installed",
                        "ignored",
                        "line",
                    ),
                },
                evidence_only=("python",),
            ),
        ),
        Probe(
            "find_spec",
            "inside",
            FindSpecParams,
            facts=FactRules(
                items={
                    "modules": (
                        "module",
                        "found",
                        "namespace",
                        "distribution",
                        "version",
                        "distributions",
                        "origin",
                        "search_locations",
                        "reason",
                        "error",
                    ),
                },
                evidence_only=("cwd", "sys_path"),
            ),
        ),
        Probe(
            "cli",
            "inside",
            CliParams,
            helpers=("versions", "platforms"),
            facts=FactRules(
                carried=(
                    "argv",
                    "how",
                    "platform",
                    "platform_checked_against",
                    "returncode",
                    "timed_out",
                    "version_choice",
                    "raw",
                ),
                evidence_only=("command_stdout_bytes", "command_stderr_bytes"),
            ),
        ),
        Probe(
            "av_roundtrip",
            "inside",
            AvRoundtripParams,
            facts=FactRules(
                carried=(
                    "av_version",
                    "codec",
                    "width",
                    "height",
                    "mp4_bytes",
                    "decoded_frames",
                    "decoded_widths",
                    "decoded_heights",
                ),
            ),
        ),
        Probe(
            "inventory",
            "inside",
            InventoryParams,
            facts=FactRules(
                carried=("python_version",),
                items={"broken": ("location", "error")},
                evidence_only=("python", "sys_path", "distributions"),
            ),
        ),
        # The node check: the GPUs and the image's torch (facts), BF16 matmul per GPU, the
        # all-reduce per rank, HBM / host<->GPU / peer copies, each figure as a fraction of the GPU's
        # limit, whose fault a failure is (unfit: image or node), what the host showed.
        Probe(
            "gpu_preflight",
            "inside",
            GpuPreflightParams,
            helpers=("gpu_worker", "gpu_causes"),
            facts=FactRules(
                carried=(
                    "facts",
                    "matmul",
                    "allreduce",
                    "bandwidth",
                    "fraction_of_limit",
                    "unfit",
                    "torch",
                    "facts_error",
                    "host",
                ),
                evidence_only=("params",),
            ),
        ),
        # The serve stage: how its server started (timeline, phases, the recommended startupProbe),
        # whether readiness told the truth, each functional check and bad-media case, how it ended.
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
            facts=FactRules(
                carried=(
                    "argv",
                    "model",
                    "served_model_name",
                    "timeline",
                    "phases",
                    "startup_probe",
                    "readiness",
                    "baseline_prompt_tokens",
                    "stopped",
                    "parse_only",
                    "platform",
                    "how",
                    "returncode",
                    "timed_out",
                ),
                items={
                    "functional": (
                        "check",
                        "status",
                        "text",
                        "prompt_tokens",
                        "first_token_s",
                        "done",
                        "events",
                        "error",
                        "server_line",
                    ),
                    "bad_media": ("case", "kind", "status", "outcome", "server_line", "recovery"),
                },
                evidence_only=("host", "port"),
            ),
        ),
        Probe(
            "layers",
            "outside",
            LayersParams,
            "imagegate.stages.layers:run_layers_stage",
            facts=FactRules(
                carried=(
                    "config_digest",
                    "manifest_digest",
                    "layers",
                    "verified",
                    "failed",
                    "error",
                    "hint",
                    "source",
                    "source_choice",
                ),
            ),
        ),
        Probe(
            "vulns",
            "outside",
            VulnsParams,
            "imagegate.stages.vulns:run_vulns_stage",
            facts=FactRules(
                carried=(
                    "source",
                    "fail_on",
                    "counted",
                    "advisories",
                    "advisories_as_of",
                    "packages",
                    "expired_ignores",
                    "problems",
                    "where",
                ),
                items={
                    "findings": (
                        "id",
                        "aliases",
                        "package",
                        "version",
                        "fixed",
                        "severity",
                        "score",
                        "summary",
                        "locations",
                        "state",
                        "ignore",
                    ),
                },
            ),
        ),
    )
}
INSIDE_PROBES = tuple(n for n, p in PROBES.items() if p.side == "inside")
OUTSIDE_PROBES = tuple(n for n, p in PROBES.items() if p.side == "outside")


def side_of(probe: str) -> Side:
    return PROBES[probe].side
