"""A fleet's nodes judged beside their peers (src/imagegate/fleet/judge.py), from a real H200's node-check
figures (benchmarks/records/2026-12-01-1936-gpu-rootfs-nvidia-h200-cdi-spec.json) and perturbed
copies of them: exactly the nodes below their peers are flagged, and only where there are peers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from imagegate.fleet import judge as fleet

RECORD = (
    Path(__file__).resolve().parents[2]
    / "benchmarks/records/2026-12-01-1936-gpu-rootfs-nvidia-h200-cdi-spec.json"
)


def _measured() -> dict[str, float]:
    figures = json.loads(RECORD.read_text())["figures"]
    return {
        k: figures[f"gpu0_{k}"]["node_check"]
        for k in ("bf16_tflops", "bf16_sustained_tflops", "hbm_copy_gbps", "h2d_gbps", "d2h_gbps")
    }


H200 = _measured()


def _data(scale: dict[str, float] | None = None, gpus: int = 1, model: str = "NVIDIA H200") -> dict[str, Any]:
    """A node check's data in gpu_preflight's form, each figure the H200's times its scale."""
    s = {k: (scale or {}).get(k, 1.0) for k in H200}
    return {
        "facts": {"devices": [{"index": i, "name": model} for i in range(gpus)]},
        "matmul": {"gpus": [{"index": i, "tflops": H200["bf16_tflops"] * s["bf16_tflops"],
                             "sustained": {"last_second_tflops": H200["bf16_sustained_tflops"] * s["bf16_sustained_tflops"]}}
                            for i in range(gpus)]},
        "bandwidth": {"gpus": [{"index": i, "hbm_copy_gbps": H200["hbm_copy_gbps"] * s["hbm_copy_gbps"],
                                "h2d_gbps": H200["h2d_gbps"] * s["h2d_gbps"], "d2h_gbps": H200["d2h_gbps"] * s["d2h_gbps"]}
                               for i in range(gpus)]},
    }  # fmt: skip


def _node(name: str, status: str = "PASS", **kw: Any) -> fleet.Node:
    data = _data(**kw)
    return fleet.Node(
        name,
        status,
        fleet.gpu_model(data),
        fleet.figures_of(data),
        "" if status == "PASS" else "node not fit: x",
    )


def test_a_nodes_figures_are_its_weakest_gpus() -> None:
    data = _data(gpus=2)
    data["matmul"]["gpus"][1]["tflops"] = 600.0
    data["allreduce"] = {"ranks": [{"rank": 0, "busbw_gbps": 380.0}, {"rank": 1, "busbw_gbps": 360.0}]}
    got = fleet.figures_of(data)
    assert got["bf16_tflops"] == 600.0 and got["allreduce_busbw_gbps"] == 360.0
    assert got["hbm_copy_gbps"] == pytest.approx(4252.13)
    assert fleet.gpu_model(data) == "NVIDIA H200"
    # a figure that is no finite positive number (JSON's Infinity, NaN, a bool, zero) is no figure
    one = _data()
    for bogus in (float("inf"), float("nan"), True, 0):
        one["matmul"]["gpus"][0]["tflops"] = bogus
        assert "bf16_tflops" not in fleet.figures_of(one), bogus


def test_exactly_the_node_below_its_peers_is_suspect() -> None:
    nodes = [
        _node("gpu-a"),
        _node("gpu-b", scale={"bf16_tflops": 0.99}),
        _node("gpu-c", scale={"hbm_copy_gbps": 1.02}),
        _node("gpu-d", scale={"bf16_tflops": 0.85}),  # 15 % below: passes the 0.5-of-the-limit floors
        _node("gpu-e", scale={"h2d_gbps": 0.92, "d2h_gbps": 0.92}),  # 8 %: within the 10 %
    ]
    judged = {j.node.name: j for j in fleet.judge(nodes).nodes}
    assert {n: j.verdict for n, j in judged.items()} == {
        "gpu-a": "fit", "gpu-b": "fit", "gpu-c": "fit", "gpu-d": "suspect", "gpu-e": "fit",
    }  # fmt: skip
    (why,) = judged["gpu-d"].why
    assert why.startswith("bf16_tflops 664.2, 15% below the median 781.4 of 5 NVIDIA H200 nodes")
    assert judged["gpu-d"].deviations["bf16_tflops"] == pytest.approx(-0.15)
    # a tighter bound flags the 8 % one too
    tight = {j.node.name: j.verdict for j in fleet.judge(nodes, suspect_below=0.05).nodes}
    assert tight["gpu-e"] == "suspect" and tight["gpu-b"] == "fit"


def test_peers_only_within_one_model_with_enough_passing_nodes() -> None:
    nodes = [
        _node("h-1"), _node("h-2"), _node("h-3", scale={"bf16_tflops": 0.8}),
        # two of another model: no median, their floors alone, however far apart they are
        _node("a-1", model="NVIDIA A100-SXM4-80GB"), _node("a-2", model="NVIDIA A100-SXM4-80GB", scale={"bf16_tflops": 0.5}),
        # an unfit node is not a peer: it neither counts toward the three nor moves the median
        _node("h-4", status="ERROR", scale={"bf16_tflops": 0.1}),
    ]  # fmt: skip
    judged = fleet.judge(nodes)
    verdicts = {j.node.name: j.verdict for j in judged.nodes}
    assert verdicts == {
        "h-1": "fit",
        "h-2": "fit",
        "h-3": "suspect",
        "a-1": "fit",
        "a-2": "fit",
        "h-4": "unfit",
    }
    assert judged.floors_only == ("NVIDIA A100-SXM4-80GB",)
    assert judged.medians["NVIDIA H200"]["bf16_tflops"] == pytest.approx(H200["bf16_tflops"])
    two = fleet.judge([*nodes[:2], _node("h-x", scale={"bf16_tflops": 0.5})])
    assert {j.verdict for j in two.nodes} == {"fit", "suspect"}  # three H200 nodes: a median
    assert {j.verdict for j in fleet.judge(nodes[:2]).nodes} == {"fit"}  # two: floors alone
    with_unfit = fleet.judge([*nodes[:2], nodes[-1]])  # two passing and an unfit one: no peers
    assert with_unfit.floors_only == ("NVIDIA H200",) and not with_unfit.medians


def test_one_gpu_on_two_nodes_refuses_both_naming_it_and_neither_is_a_peer() -> None:
    uuid, other = "GPU-6b1f0c2e-0000-4000-8000-00000000000a", "GPU-6b1f0c2e-0000-4000-8000-00000000000b"
    nodes = [
        dataclasses.replace(_node("h-1"), gpus=(uuid,)),
        dataclasses.replace(_node("h-2"), gpus=(other, uuid, uuid)),  # twice in one node: one node
        dataclasses.replace(_node("h-3"), gpus=(other,)),
        dataclasses.replace(_node("h-4", scale={"bf16_tflops": 0.8}), gpus=("GPU-c",)),
        _node("h-5"), _node("h-6"),
    ]  # fmt: skip
    assert fleet.shared_gpus(nodes) == {
        "h-1": [f"GPU {uuid} is also on node h-2"],
        "h-2": [f"GPU {uuid} is also on node h-1", f"GPU {other} is also on node h-3"],
        "h-3": [f"GPU {other} is also on node h-2"],
    }
    judged = {j.node.name: j for j in fleet.judge(nodes).nodes}
    assert {n: j.verdict for n, j in judged.items()} == {
        "h-1": "unfit", "h-2": "unfit", "h-3": "unfit", "h-4": "suspect", "h-5": "fit", "h-6": "fit",
    }  # fmt: skip
    assert judged["h-1"].why == (f"refused: GPU {uuid} is also on node h-2",)
    assert "3 NVIDIA H200 nodes" in judged["h-4"].why[0]  # h-4, h-5, h-6: the refused are no peers
    assert fleet.shared_gpus([nodes[0], nodes[3]]) == {}
    three = fleet.shared_gpus([*nodes[:2], dataclasses.replace(_node("h-7"), gpus=(uuid,))])
    assert three["h-7"] == [f"GPU {uuid} is also on nodes h-1, h-2"]


def test_a_refused_node_is_unfit_never_a_peer_and_says_why() -> None:
    """Refused by the caller (a signature or binding that fails): unfit whatever its check said,
    and its figures move no median: with it, four nodes would make a median under --min-peers 4."""
    forged = dataclasses.replace(
        _node("h-9", scale={"bf16_tflops": 1.5}), evidence="refused", refused=("a", "b")
    )
    nodes = [_node("h-1"), _node("h-2"), _node("h-3", scale={"bf16_tflops": 0.8}), forged]
    judged = fleet.judge(nodes, min_peers=4)
    assert [j.verdict for j in judged.nodes] == ["fit", "fit", "fit", "unfit"]
    assert judged.nodes[-1].why == ("refused: a", "refused: b") and judged.nodes[-1].deviations == {}
    assert judged.floors_only == ("NVIDIA H200",) and not judged.medians
    assert fleet.judge(nodes[:3], min_peers=3).nodes[2].verdict == "suspect"
    assert fleet.unverified(judged) == ["h-9"]
    unchecked = fleet.judge([dataclasses.replace(n, evidence="unverified") for n in nodes[:2]])
    assert fleet.unverified(unchecked) == ["h-1", "h-2"]
    rows = fleet.table(unchecked)
    assert rows[0].split()[4] == "evidence" and all(r.split()[5] == "unverified" for r in rows[1:3])
    assert [n["evidence"] for n in fleet.as_json(unchecked)["nodes"]] == ["unverified", "unverified"]


def test_a_check_that_did_not_pass_is_unfit_and_no_peer_whatever_its_status() -> None:
    """SKIPPED sorts after PASS, DEFERRED and ERROR before it: none of them is a pass."""
    for status in ("SKIPPED", "DEFERRED", "ERROR", "FAIL"):
        nodes = [_node("h-1"), _node("h-2"), _node("h-x", status=status, scale={"bf16_tflops": 0.1})]
        judged = fleet.judge(nodes)
        assert [j.verdict for j in judged.nodes] == ["fit", "fit", "unfit"], status
        assert judged.floors_only == ("NVIDIA H200",) and not judged.medians, status


def _bare(name: str, **figures: float) -> fleet.Node:
    return fleet.Node(name, "PASS", "M", figures)


def test_the_bound_is_strict_and_every_median_above_zero_judges() -> None:
    # exactly --suspect-below under the median is not more than it: fit
    quarter = [_bare("a", h2d_gbps=4.0), _bare("b", h2d_gbps=4.0), _bare("c", h2d_gbps=3.0)]
    assert [j.verdict for j in fleet.judge(quarter, suspect_below=0.25).nodes] == ["fit"] * 3
    # figures under 1 (a slow link's GB/s) are judged as any other
    small = [_bare("a", h2d_gbps=0.5), _bare("b", h2d_gbps=0.5), _bare("c", h2d_gbps=0.25)]
    assert [j.verdict for j in fleet.judge(small).nodes] == ["fit", "fit", "suspect"]
    # a zero median divides nothing; a figure a node lacks is not judged for it
    zero = [
        _bare("a", h2d_gbps=0.0),
        _bare("b", h2d_gbps=0.0),
        _bare("c", h2d_gbps=0.0, d2h_gbps=1.0),
        _bare("d"),
    ]
    assert {j.node.name: j.deviations for j in fleet.judge(zero).nodes} == {
        "a": {}, "b": {}, "c": {"d2h_gbps": 0.0}, "d": {},
    }  # fmt: skip
    # the bound and the peers by name only: two numbers never swapped by position
    with pytest.raises(TypeError):
        fleet.judge(small, 0.25)  # type: ignore[misc]


def test_the_commands_an_operator_would_run() -> None:
    nodes = [
        _node("h-1"),
        _node("h-2"),
        _node("h-3", scale={"hbm_copy_gbps": 0.7}),
        _node("h-4", status="ERROR"),
    ]
    assert fleet.commands(fleet.judge(nodes)) == [
        "kubectl label node h-3 imagegate.dev/node-check=suspect --overwrite",
        "kubectl label node h-4 imagegate.dev/node-check=unfit --overwrite",
        "kubectl taint node h-4 imagegate.dev/node-check=unfit:NoSchedule --overwrite",
    ]


def _k8s_node(
    name: str, gpus: int | None = 8, product: str | None = "NVIDIA-H200", **extra: Any
) -> dict[str, Any]:
    """A node as `kubectl get nodes -o json` lists it (the fields read), with the labels NVIDIA's
    GPU operator sets (gpu-feature-discovery) and what its device plugin makes allocatable."""
    labels = {"kubernetes.io/hostname": name, **({"nvidia.com/gpu.product": product} if product else {})}
    allocatable = {
        "cpu": "96",
        "memory": "2Ti",
        **({"nvidia.com/gpu": str(gpus)} if gpus is not None else {}),
    }
    allocatable |= extra.pop("allocatable", {})
    labels |= extra.pop("labels", {})
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}


def _k8s_pod(node: str, name: str, phase: str = "Running", gpu: bool = True) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "8"} if gpu else {"cpu": "1"}
    return {"metadata": {"namespace": "team", "name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": phase}}  # fmt: skip


def test_the_gpu_nodes_to_check_and_the_ones_skipped_with_why() -> None:
    nodes = {"items": [
        _k8s_node("h200-a"), _k8s_node("h200-b"),
        _k8s_node("cpu-1", gpus=None, product=None),  # not a GPU node: not listed at all
        _k8s_node("mig-1", gpus=0, allocatable={"nvidia.com/mig-1g.18gb": "56"}, labels={"nvidia.com/mig.config": "all-1g.18gb"}),
        _k8s_node("no-plugin", gpus=None),
        _k8s_node("busy-1"), _k8s_node("done-1"),
    ]}  # fmt: skip
    pods = {"items": [
        _k8s_pod("busy-1", "train-0"),
        _k8s_pod("done-1", "old", phase="Succeeded"),  # finished: holds no GPU
        _k8s_pod("h200-a", "web", gpu=False),  # no GPU asked: no matter
    ]}  # fmt: skip
    found, skipped = fleet.targets(nodes, pods)
    assert found == [fleet.Target("h200-a", "NVIDIA-H200", 8), fleet.Target("h200-b", "NVIDIA-H200", 8),
                     fleet.Target("done-1", "NVIDIA-H200", 8)]  # fmt: skip
    assert skipped == [
        "mig-1: MIG mode (nvidia.com/mig-1g.18gb): whole GPUs only, skipped",
        "no-plugin: no allocatable nvidia.com/gpu (is the device plugin running there?)",
        "busy-1: GPU work running (team/train-0): cordon it first (kubectl cordon busy-1), then check it once they finish",
    ]
    # without the pods, busy-1 is a target too
    assert [t.node for t in fleet.targets(nodes)[0]] == ["h200-a", "h200-b", "busy-1", "done-1"]
