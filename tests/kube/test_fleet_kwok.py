"""`fleet run` and `fleet collect` on GPU nodes of a real control plane (tests/kube/apiserver.py
with kube-controller-manager and kube-scheduler): the nodes are kwok's (tests/kube/kwok.py), GPU
nodes as the GPU operator labels them, a MIG node, a cordoned one and one with GPU work running.
The real scheduler places each node check Job's Pod; kwok runs nothing, so the test plays each
node's part (named so: tests/kube/kwok.NodePlayer): the log is the real controller's output for that Job's
bundle and event key (read from the Job's Secret in the cluster), run on this machine, where no
GPU is, so each node's check does not pass and each node is unfit; the image ID is the one a
containerd node would report for the image the Job names."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagegate.domain.results import Status
from imagegate.kube import collect
from imagegate.kube.render import GPU_RESOURCE
from imagegate.report.load import read_attempt
from tests.kube.apiserver import ApiServer, started
from tests.kube.kwok import Kwok, NodePlayer
from tests.kube.kwok import started as kwok_started

DIGEST = "sha256:" + "6e" * 32
IMAGE = f"registry.example/team/torch@{DIGEST}"
IMAGE_ID = IMAGE  # what a containerd node reports for the image it pulled by digest
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}
RUN_S = 300


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kwok]:
    """A control plane and kwok, with the fleet's nodes Ready and GPU work running on one."""
    with (
        started(tmp_path_factory.mktemp("control-plane"), controllers=True) as api,
        kwok_started(api, tmp_path_factory.mktemp("kwok")) as kwok,
    ):
        eight, four = {GPU_RESOURCE: "8"}, {GPU_RESOURCE: "4"}
        kwok.node("gpu-a", labels=H100, allocatable=eight)
        kwok.node("gpu-b", labels={**H100, "nvidia.com/gpu.count": "4"}, allocatable=four)
        kwok.node("gpu-cordoned", labels=H100, allocatable=eight, cordoned=True)
        kwok.node(
            "gpu-mig",
            labels={**H100, "nvidia.com/mig.config": "all-1g.10gb"},
            allocatable={"nvidia.com/mig-1g.10gb": "56"},
        )
        kwok.node("gpu-busy", labels=H100, allocatable=eight)
        kwok.node("cpu-1")
        kwok.ready(["gpu-a", "gpu-b", "gpu-cordoned", "gpu-mig", "gpu-busy", "cpu-1"])
        _busy(api, "gpu-busy")
        yield kwok


def _busy(api: ApiServer, node: str) -> None:
    """GPU work running on `node`: a Pod bound there, asking for one GPU (kwok makes it Running)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "inference", "namespace": "default"},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "server",
                    "image": "registry.example/team/server:1",
                    "resources": {"limits": {GPU_RESOURCE: "1"}},
                }
            ],
        },
    }
    made = api.kubectl_run("create", "-f", "-", stdin=json.dumps(pod))
    assert made.returncode == 0, made.stderr
    running = api.kubectl_run(
        "wait", "pod/inference", "-n", "default", "--for=jsonpath={.status.phase}=Running", "--timeout=60s"
    )
    assert running.returncode == 0, running.stderr


def _listings(api: ApiServer, work: Path) -> list[str]:
    """`--nodes` and `--pods` as a user writes them: kubectl get ... -o json."""
    for what, args in (("nodes", ["get", "nodes"]), ("pods", ["get", "pods", "-A"])):
        got = api.kubectl_run(*args, "-o", "json")
        assert got.returncode == 0, got.stderr
        (work / f"{what}.json").write_text(got.stdout)
    return ["--nodes", str(work / "nodes.json"), "--pods", str(work / "pods.json")]


def _imagegate(api: ApiServer, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "imagegate", *args], capture_output=True, text=True, cwd=cwd,
        env={**api.env(), "COLUMNS": "300"}, timeout=RUN_S + 60,
    )  # fmt: skip


def _attempts(out: Path) -> dict[str, Path]:
    return {n.name: next(n.glob("*/2*")) for n in out.iterdir()}


def _checked(fleet: Kwok, work: Path, done: subprocess.CompletedProcess[str], nodes: NodePlayer) -> None:
    """What both commands must show: one Job per eligible node, each Pod placed by the scheduler
    on its own node (the cordoned one too: its Job tolerates the cordon), the MIG and busy nodes
    skipped and named, each node's attempt collected from its Pod, the node statements signed."""
    assert done.returncode == 1, done.stdout + done.stderr  # unfit (no GPU here), not "no result" (2)
    assert "gpu-mig: MIG mode (nvidia.com/mig-1g.10gb)" in done.stderr, done.stderr
    assert "gpu-busy: GPU work running (default/inference)" in done.stderr, done.stderr
    eligible = {"gpu-a", "gpu-b", "gpu-cordoned"}
    assert sorted(nodes.placed.values()) == sorted(eligible), nodes.placed
    report = json.loads(done.stdout)
    assert {n["name"] for n in report["nodes"]} == eligible, report
    assert all(n["verdict"] == "unfit" for n in report["nodes"]), report
    attempts = _attempts(work / "out")
    assert set(attempts) == eligible
    for node, attempt in attempts.items():
        facts = json.loads((attempt / "run.json").read_text())
        # the node the Pod ran on, as the API server reported it, and the image its runtime named
        assert facts["environment"]["node"] == node, facts["environment"]
        assert (attempt / "node-check.dsse.json").exists(), sorted(p.name for p in attempt.iterdir())
        (stage,) = [s for s in read_attempt(attempt).record.stages if s.id == collect.IMAGE_ID_STAGE]
        assert stage.status is Status.PASS, stage.detail
    pairs = [f"{n}={a}" for n, a in sorted(attempts.items())]
    verified = _imagegate(
        fleet.api, "fleet", "report", *pairs, "--key", "ci.pub", "--format", "json", cwd=work
    )
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert {n["evidence"] for n in json.loads(verified.stdout)["nodes"]} == {"verified"}, verified.stdout


def test_fleet_run_places_one_job_per_gpu_node_through_the_scheduler(fleet: Kwok, tmp_path: Path) -> None:
    assert _imagegate(fleet.api, "keygen", "--out", "ci", cwd=tmp_path).returncode == 0
    ns = fleet.api.namespace("restricted")
    listings = _listings(fleet.api, tmp_path)
    with NodePlayer(fleet, ns, IMAGE_ID) as nodes:
        done = _imagegate(
            fleet.api, "fleet", "run", IMAGE, *listings, "-n", ns, "--jobs", "2", "--key", "ci.key",
            "--timeout", str(RUN_S), "--format", "json", "-o", "out", cwd=tmp_path,
        )  # fmt: skip
    _checked(fleet, tmp_path, done, nodes)
    left = fleet.api.kubectl_run("get", "jobs,secrets,configmaps", "-n", ns, "-o", "name")
    assert not [o for o in left.stdout.split() if "imagegate" in o], left.stdout  # each node's run deleted


def test_fleet_collect_reads_the_jobs_applied_earlier(fleet: Kwok, tmp_path: Path) -> None:
    assert _imagegate(fleet.api, "keygen", "--out", "ci", cwd=tmp_path).returncode == 0
    ns = fleet.api.namespace("restricted")
    listings = _listings(fleet.api, tmp_path)
    rendered = _imagegate(fleet.api, "fleet", "render", IMAGE, *listings, "-n", ns, cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    with NodePlayer(fleet, ns, IMAGE_ID) as nodes:
        applied = fleet.api.kubectl_run("apply", "-f", "-", stdin=rendered.stdout)
        assert applied.returncode == 0, applied.stderr
        complete = fleet.api.kubectl_run(
            "wait",
            "jobs",
            "--all",
            "-n",
            ns,
            "--for=condition=Complete",
            f"--timeout={RUN_S}s",
            timeout=RUN_S + 10,
        )
        assert complete.returncode == 0, complete.stderr
    done = _imagegate(
        fleet.api, "fleet", "collect", IMAGE, *listings, "-n", ns, "--key", "ci.key", "--format", "json",
        "-o", "out", cwd=tmp_path,
    )  # fmt: skip
    _checked(fleet, tmp_path, done, nodes)
