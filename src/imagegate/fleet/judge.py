"""A GPU fleet judged as fleets are: every node's node-check figures beside its peers' (issue: the
node check a GPU fleet runs). azurehpc-health-checks and SuperBench compare each node with
expected values and with its peers; here a node is compared with the median of the nodes of its
GPU model, only where that model has enough nodes to make a median mean something.

Pure functions over what each node's check measured (the `node_check` stage's data, as
probes/gpu_preflight.py writes it): the figures of a node, the peers' medians, each node's
deviation, the nodes below their peers (suspect: their own verdict stays PASS), and the
`kubectl` commands an operator would run for the unfit and suspect ones (printed, never run here).
A node whose result is not its own (refused by the caller: a signature or binding that fails;
or a GPU UUID that another node claims too) is unfit and never a peer: one copied or forged
result must neither pass nor move the median the others are judged by.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from imagegate._support import jsontypes as jt  # `j` names a judged node here

if TYPE_CHECKING:
    from imagegate.domain.results import RunRecord, StageResult

# A node more than this fraction below the median of its GPU model's nodes is suspect.
SUSPECT_BELOW = 0.10
# The fewest nodes of one GPU model whose median is a peer figure (two nodes: which one is off?).
MIN_PEERS = 3
# Each figure: higher is better. The node's own is its weakest GPU's (one slow GPU slows a job).
FIGURES = (
    "bf16_tflops",
    "bf16_sustained_tflops",
    "hbm_copy_gbps",
    "h2d_gbps",
    "d2h_gbps",
    "allreduce_busbw_gbps",
)
LABEL = "imagegate.dev/node-check"


def node_check(record: RunRecord) -> StageResult | None:
    """The attempt's node check stage (the gpu_preflight probe's), or None when it ran none."""
    return next((s for s in record.stages if s.probe == "gpu_preflight"), None)


def figures_of(data: Mapping[str, object]) -> dict[str, float]:
    """A node's figures from its node check's data: per figure the weakest GPU's (or rank's)."""
    per: dict[str, list[float]] = {}

    def add(name: str, value: object) -> None:
        # JSON may carry Infinity or NaN: a figure is a finite positive number, else none
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value > 0
        ):
            per.setdefault(name, []).append(float(value))

    for g in jt.objects(jt.path(data, "matmul", "gpus")):
        add("bf16_tflops", g.get("tflops"))
        add("bf16_sustained_tflops", jt.path(g, "sustained", "last_second_tflops"))
    for g in jt.objects(jt.path(data, "bandwidth", "gpus")):
        for name in ("hbm_copy_gbps", "h2d_gbps", "d2h_gbps"):
            add(name, g.get(name))
    for r in jt.objects(jt.path(data, "allreduce", "ranks")):
        add("allreduce_busbw_gbps", r.get("busbw_gbps"))
    return {name: min(values) for name, values in per.items()}


def gpu_model(data: Mapping[str, object]) -> str:
    """The node's GPU model, from torch's device names (one model a node; mixed ones joined)."""
    names = sorted({str(d.get("name")) for d in jt.objects(jt.path(data, "facts", "devices"))})
    return "/".join(names) or "unknown"


@dataclass(frozen=True)
class Node:
    """One node's result: its name, the node check's status (PASS, ERROR …) and what it measured;
    its GPUs' UUIDs; what vouches for it (`evidence`: verified with the key, unverified, or this
    command's own run) and why it is refused as this node's own result (`refused`), if it is."""

    name: str
    status: str
    model: str
    figures: Mapping[str, float]
    detail: str = ""
    gpus: tuple[str, ...] = ()
    evidence: str = "this run"  # verified, unverified, refused, this run
    refused: tuple[str, ...] = ()


@dataclass(frozen=True)
class Judged:
    node: Node
    verdict: str  # fit, suspect, unfit
    deviations: Mapping[str, float] = field(default_factory=dict)  # figure -> value / median - 1
    why: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fleet:
    nodes: tuple[Judged, ...]
    medians: Mapping[str, Mapping[str, float]]  # model -> figure -> median (models with peers)
    floors_only: tuple[str, ...]  # models with fewer than MIN_PEERS nodes: their floors alone


def shared_gpus(nodes: Sequence[Node]) -> dict[str, list[str]]:
    """Node name -> why it is refused for a GPU UUID another node claims too: a GPU is in one
    node, so two nodes naming it means one result is not its node's own, and which one cannot
    be told (both are refused)."""
    owners: dict[str, list[str]] = {}
    for n in nodes:
        for uuid in dict.fromkeys(n.gpus):
            owners.setdefault(uuid, []).append(n.name)
    why: dict[str, list[str]] = {}
    for uuid, names in owners.items():
        for name in names:
            others = [o for o in names if o != name]
            if others:
                node = "nodes" if len(others) > 1 else "node"
                why.setdefault(name, []).append(f"GPU {uuid} is also on {node} {', '.join(others)}")
    return why


def _medians(peers: Mapping[str, list[Node]], min_peers: int) -> dict[str, dict[str, float]]:
    """Per GPU model with `min_peers` peers or more: each figure's median over them."""
    return {
        model: {
            f: statistics.median(vals)
            for f in FIGURES
            if (vals := [n.figures[f] for n in group if f in n.figures])
        }
        for model, group in peers.items()
        if len(group) >= min_peers
    }


def judge(
    nodes: Sequence[Node], *, suspect_below: float = SUSPECT_BELOW, min_peers: int = MIN_PEERS
) -> Fleet:
    """Each node fit, suspect or unfit. Unfit: refused (its result is not its own) or its own
    check did not pass. Suspect: it passed, but a figure is more than `suspect_below` under the
    median of the passing, unrefused nodes of its GPU model (where that model has `min_peers` of
    them or more). A refused node is never a peer."""
    shared = shared_gpus(nodes)
    refused = {n.name: [*n.refused, *shared.get(n.name, [])] for n in nodes}
    peers: dict[str, list[Node]] = {}
    for n in nodes:
        if n.status == "PASS" and not refused[n.name]:
            peers.setdefault(n.model, []).append(n)
    medians = _medians(peers, min_peers)
    judged = []
    for n in nodes:
        if refused[n.name]:
            judged.append(Judged(n, "unfit", {}, tuple(f"refused: {why}" for why in refused[n.name])))
            continue
        if n.status != "PASS":
            judged.append(Judged(n, "unfit", {}, (f"node check {n.status}: {n.detail}".rstrip(": "),)))
            continue
        median = medians.get(n.model, {})
        deviations = {f: n.figures[f] / m - 1 for f, m in median.items() if f in n.figures and m > 0}
        low = [
            f"{f} {n.figures[f]:.1f}, {-d:.0%} below the median {median[f]:.1f} of {len(peers[n.model])} {n.model} nodes"
            for f, d in deviations.items()
            if d < -suspect_below
        ]
        judged.append(Judged(n, "suspect" if low else "fit", deviations, tuple(low)))
    few = tuple(sorted({n.model for n in nodes} - medians.keys()))
    return Fleet(tuple(judged), medians, few)


def commands(fleet: Fleet) -> list[str]:
    """What an operator would run: label every judged node with its verdict, and keep new work off
    the unfit ones (a NoSchedule taint: running work stays). Printed, never run by imagegate."""
    out = []
    for j in fleet.nodes:
        if j.verdict == "fit":
            continue
        out.append(f"kubectl label node {j.node.name} {LABEL}={j.verdict} --overwrite")
        if j.verdict == "unfit":
            out.append(f"kubectl taint node {j.node.name} {LABEL}=unfit:NoSchedule --overwrite")
    return out


def unverified(fleet: Fleet) -> list[str]:
    """The nodes nothing vouches for: neither verified with the key nor this command's own run."""
    return [j.node.name for j in fleet.nodes if j.node.evidence not in ("verified", "this run")]


def as_json(fleet: Fleet) -> dict[str, object]:
    """The report as data: each node's verdict, figures and deviations, the medians, the commands."""
    return {
        "nodes": [
            {
                "name": j.node.name,
                "model": j.node.model,
                "check": j.node.status,
                "verdict": j.verdict,
                "evidence": j.node.evidence,
                "gpus": list(j.node.gpus),
                "figures": dict(j.node.figures),
                "deviations": {f: round(d, 4) for f, d in j.deviations.items()},
                "why": list(j.why),
            }
            for j in fleet.nodes
        ],
        "medians": {m: dict(f) for m, f in fleet.medians.items()},
        "floorsOnly": list(fleet.floors_only),
        "unverified": unverified(fleet),
        "commands": commands(fleet),
    }


def table(fleet: Fleet) -> list[str]:
    """The report in lines: a row a node (what vouches for it, each figure with its deviation from
    the median), then why each one not fit is so, the models judged by their floors alone, and
    the commands."""
    shown = [f for f in FIGURES if any(f in j.node.figures for j in fleet.nodes)]
    rows = [["node", "model", "check", "verdict", "evidence", *shown]]
    for j in fleet.nodes:
        cells = [
            f"{j.node.figures[f]:.1f}" + (f" ({j.deviations[f]:+.0%})" if f in j.deviations else "")
            if f in j.node.figures
            else "-"
            for f in shown
        ]
        rows.append([j.node.name, j.node.model, j.node.status, j.verdict, j.node.evidence, *cells])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    out += [f"{j.node.name}: {why}" for j in fleet.nodes for why in j.why]
    out += [
        f"{m}: fewer than the peers a median needs: its nodes are judged by the floors alone"
        for m in fleet.floors_only
    ]
    out += commands(fleet)
    return out


# -- which nodes: the GPU operator's labels and the node's allocatable GPUs ------------------------
# GPU feature discovery (NVIDIA GPU operator) labels every GPU node with its product; the device
# plugin makes nvidia.com/gpu allocatable; a MIG-partitioned node offers nvidia.com/mig-* slices.
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_CONFIG = "nvidia.com/mig.config"


@dataclass(frozen=True)
class Target:
    node: str
    product: str
    gpus: int


def targets(
    nodes: Mapping[str, object], pods: Mapping[str, object] | None = None
) -> tuple[list[Target], list[str]]:
    """The GPU nodes of `kubectl get nodes -o json` to check, each with all its GPUs, and the ones
    skipped, each with why: MIG-partitioned (whole GPUs only here), no allocatable GPU, or GPU
    work running on it (from `kubectl get pods -A -o json`: cordon it first)."""
    busy: dict[str, list[str]] = {}
    for pod in jt.objects((pods or {}).get("items")):
        spec, status = jt.obj(pod.get("spec")), jt.obj(pod.get("status"))
        wants = any(
            GPU_RESOURCE in jt.obj(jt.path(c, "resources", "limits"))
            for c in jt.objects(spec.get("containers"))
        )
        if wants and spec.get("nodeName") and status.get("phase") in ("Pending", "Running"):
            meta = jt.obj(pod.get("metadata"))
            busy.setdefault(str(spec["nodeName"]), []).append(f"{meta.get('namespace')}/{meta.get('name')}")
    found: list[Target] = []
    skipped: list[str] = []
    for item in jt.objects(nodes.get("items")):
        name = str(jt.path(item, "metadata", "name"))
        labels = jt.obj(jt.path(item, "metadata", "labels"))
        allocatable = jt.obj(jt.path(item, "status", "allocatable"))
        product = labels.get(GPU_PRODUCT)
        slices = sorted(k for k in allocatable if k.startswith("nvidia.com/mig-"))
        gpus = int(str(allocatable.get(GPU_RESOURCE, "0")) or 0)
        if product is None and not gpus and not slices:
            continue  # not a GPU node
        if slices or labels.get(MIG_CONFIG, "all-disabled") != "all-disabled":
            skipped.append(
                f"{name}: MIG mode ({', '.join(slices) or labels.get(MIG_CONFIG)}): whole GPUs only, skipped"
            )
        elif not gpus:
            skipped.append(f"{name}: no allocatable {GPU_RESOURCE} (is the device plugin running there?)")
        elif name in busy:
            skipped.append(
                f"{name}: GPU work running ({', '.join(busy[name])}): cordon it first "
                f"(kubectl cordon {name}), then check it once they finish"
            )
        else:
            found.append(Target(name, str(product or "unknown"), gpus))
    return found, skipped
