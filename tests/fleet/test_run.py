"""`fleet run`'s orchestration (fleet/jobs.py) through the Cluster interface, kubelet-style as
tests/kube/test_podrun.py runs one Pod: FakeCluster stands in for the API server only, and each
Pod's log is a real controller run of the real bundle on this machine, with that Pod's own key."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from imagegate.domain.results import RunRecord, Status
from imagegate.fleet import jobs as fleetrun
from imagegate.kube import collect, podrun, render
from imagegate.kube.cluster import ClusterError
from imagegate.usecases import accept, runner
from tests.kube.test_podrun import DIGEST, FakeCluster, prep, real_log  # noqa: F401 (fixtures)

NODES = ["gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"]


class FleetCluster(FakeCluster):
    """FakeCluster for many Jobs at once: each Pod follows its own Job, a Job named in `failing`
    ends DeadlineExceeded with its Pod never started, and the most Jobs alive at once is kept."""

    def __init__(self, log: Callable[[bytes], bytes], failing: Sequence[str] = (), pending: int = 2) -> None:
        super().__init__(log, terminating_polls=1, pending_polls=pending)
        self.lock = threading.Lock()
        self.failing, self.most_alive = set(failing), 0

    def _pod_for(self, job: dict[str, Any]) -> dict[str, Any]:
        """The Job's Pod on the node its nodeSelector pins it to, as the scheduler binds it."""
        pod = super()._pod_for(job)
        pinned = (job["spec"]["template"]["spec"].get("nodeSelector") or {}).get("kubernetes.io/hostname")
        pod["spec"]["nodeName"] = pinned or pod["spec"]["nodeName"]
        return pod

    def _alive(self) -> int:
        return sum(1 for kind, _ in self.objects if kind == "job")

    def create(self, objects: Sequence[dict[str, Any]]) -> None:
        with self.lock:  # FakeCluster's create, as if this Job's Pods were the only ones
            others, self.pod_list = self.pod_list, []
            try:
                super().create(objects)
            finally:
                self.pod_list = others + self.pod_list
            self.most_alive = max(self.most_alive, self._alive())

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        with self.lock:
            obj = copy.deepcopy(self.objects.get((kind, name)))
        if obj is not None and kind == "job" and name in self.failing:
            obj["status"] = {
                "conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]
            }
        return obj

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        key, _, value = selector.partition("=")
        with self.lock:
            for pod in list(self.pod_list):
                meta = pod["metadata"]
                meta["_polls"] = meta.get("_polls", 0) + 1
                if meta.get("deletionTimestamp") and meta["_polls"] > self.terminating_polls:
                    self.pod_list.remove(pod)
                elif (
                    pod["status"]["phase"] == "Pending"
                    and meta["_polls"] > self.pending_polls
                    and meta["labels"][render.RUN_LABEL] not in self.failing
                ):
                    pod["status"] = self._succeeded()
            return [copy.deepcopy(p) for p in self.pod_list if p["metadata"]["labels"].get(key) == value]

    def _succeeded(self) -> dict[str, Any]:
        import json

        from tests.kube.test_podrun import FIXTURES

        status: dict[str, Any] = json.loads((FIXTURES / "pod-containerd-succeeded.json").read_text())[
            "status"
        ]
        return status

    def delete(self, kind: str, name: str, namespace: str) -> None:
        with self.lock:
            self.calls.append(f"delete {kind}/{name}")
            self.objects.pop((kind, name), None)
            for pod in self.pod_list:  # cascade: this Job's Pods start terminating
                if kind == "job" and pod["metadata"]["labels"].get(render.RUN_LABEL) == name:
                    pod["metadata"].setdefault("deletionTimestamp", "2026-12-03T10:30:00Z")
                    pod["metadata"]["_polls"] = 0

    def logs(self, pod: str, namespace: str, container: str) -> bytes:
        with self.lock:
            found = copy.deepcopy(next(p for p in self.pod_list if p["metadata"]["name"] == pod))
            ref = collect.key_secret(found)
            key = collect.event_key(found, self.objects.get(("secret", ref[0])) if ref else None)
        if found["status"]["phase"] == "Pending":  # as the API server: no log of a never-started container
            raise ClusterError(f"container {container!r} in pod {pod!r} is waiting to start")
        assert key is not None
        return self.log(key)  # the real controller, outside the lock: Pods run side by side


class Clock:
    """Shared by the node threads: each poll's sleep moves it on, as the wall clock would."""

    def __init__(self) -> None:
        self.now, self.lock = 0.0, threading.Lock()

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        with self.lock:
            self.now += s


def _jobs(plan: runner.Prepared, nodes: Sequence[str]) -> list[fleetrun.NodeJob]:
    return [
        fleetrun.NodeJob(
            n,
            plan,
            render.render(
                plan,
                f"myorg/torch@{DIGEST}",
                render.PodOptions(namespace="accept", name=f"imagegate-node-check-{n}", deadline_s=600),
            ),
        )
        for n in nodes
    ]


def _attempt(out: Path) -> fleetrun.Attempt:
    def one(job: fleetrun.NodeJob, observer: podrun.PodRunObserver) -> RunRecord:
        return accept.accept(accept.Request(job.prep, observer, out / job.node)).record

    return one


def _unfit(runs: list[fleetrun.NodeRun]) -> list[str]:
    """The nodes with no record, or a record with an ERROR stage (pip check may FAIL anywhere)."""
    return [
        r.node for r in runs if r.record is None or any(s.status is Status.ERROR for s in r.record.stages)
    ]


def _run(
    cluster: FleetCluster,
    plan: runner.Prepared,
    out: Path,
    n: int,
    parallel: int,
    deadline_s: float,
    poll_s: float,
) -> list[fleetrun.NodeRun]:
    clock = Clock()
    waits = podrun.Waits(poll_s=poll_s, clock=clock, sleep=clock.sleep)
    return fleetrun.run_fleet(
        _jobs(plan, NODES[:n]), cluster, _attempt(out), parallel=parallel, deadline_s=deadline_s, waits=waits
    )


def test_one_failing_node_of_five_is_the_one_flagged_then_fit_on_a_re_run(
    tmp_path: Path,
    prep: runner.Prepared,  # noqa: F811
    real_log: Callable[[bytes], bytes],  # noqa: F811
) -> None:
    cluster = FleetCluster(real_log, failing=["imagegate-node-check-gpu-3"])
    runs = _run(cluster, prep, tmp_path / "1", 5, parallel=2, deadline_s=3600, poll_s=2)
    assert [r.node for r in runs] == NODES
    assert _unfit(runs) == ["gpu-3"]
    by_node = {r.node: r for r in runs}
    assert by_node["gpu-3"].record is not None
    details = [s.detail for s in by_node["gpu-3"].record.stages if s.status is Status.ERROR]
    assert details[0] == "the Pod status has no imageID: the container never started", details
    assert details[1:] and all("DeadlineExceeded" in d for d in details[1:]), details
    assert 1 <= cluster.most_alive <= 2, cluster.most_alive  # never more than --jobs at once
    assert not cluster.objects and fleetrun.left_behind(runs) == []
    # The same fleet again, gpu-3 mended: nothing flagged, and the cluster again left empty.
    again = FleetCluster(real_log)
    runs = _run(again, prep, tmp_path / "2", 5, parallel=3, deadline_s=3600, poll_s=2)
    assert _unfit(runs) == [] and 1 <= again.most_alive <= 3 and not again.objects


def test_the_deadline_ends_the_fleet_with_nothing_left(
    tmp_path: Path,
    prep: runner.Prepared,  # noqa: F811
    real_log: Callable[[bytes], bytes],  # noqa: F811
) -> None:
    cluster = FleetCluster(real_log, pending=10**6)  # no Pod ever starts
    runs = _run(cluster, prep, tmp_path, 4, parallel=2, deadline_s=60, poll_s=5)
    assert _unfit(runs) == NODES[:4]
    assert all(r.record is None or r.error is None for r in runs)
    started = [r for r in runs if r.record is not None]
    assert started and all(
        any("no result within" in s.detail for s in r.record.stages) for r in started if r.record
    )
    assert [r.error for r in runs if r.record is None] == ["not started: the fleet's deadline passed"] * (
        4 - len(started)
    )
    assert not cluster.objects and cluster.most_alive <= 2 and fleetrun.left_behind(runs) == []


def test_an_interrupt_stops_every_node_and_deletes_its_objects(
    tmp_path: Path,
    prep: runner.Prepared,  # noqa: F811
    real_log: Callable[[bytes], bytes],  # noqa: F811
) -> None:
    clock = Clock()
    waits = podrun.Waits(poll_s=5, clock=clock, sleep=clock.sleep)
    cluster = FleetCluster(real_log, pending=10**6)
    calls = 0

    def interrupting(job: fleetrun.NodeJob, observer: podrun.PodRunObserver) -> RunRecord:
        nonlocal calls
        calls += 1
        if job.node == "gpu-2":
            raise KeyboardInterrupt
        return _attempt(tmp_path)(job, observer)

    with pytest.raises(accept.Interrupted) as e:
        fleetrun.run_fleet(
            _jobs(prep, NODES), cluster, interrupting, parallel=2, deadline_s=10**6, waits=waits
        )
    assert not cluster.objects and calls <= 3  # the queued nodes never started
    assert e.value.left == accept.NOTHING_LEFT  # each started node deleted its objects


def test_cli_fleet_run_signs_each_nodes_statement_and_reports_the_fleet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fleet run` in-process, FleetCluster standing in for the API server behind kubectl (none
    can start here); each Pod's log is the real controller running the real node check bundle on
    this machine, which has no GPU: every node's check does not pass, so every node is unfit, each
    with its own signed statement naming it, and nothing is left in the cluster."""
    from typer.testing import CliRunner

    from imagegate.attest import keys
    from imagegate.cli import app
    from imagegate.fleet import node_statement as nodecheck
    from imagegate.report.load import load_attempt
    from tests.fleet.test_judge import _k8s_node
    from tests.helpers import controller_output

    gpu_prep = runner.prepare(runner.RunOptions(pipeline="gpu", gpus="8"))  # as fleet run plans it
    cluster = FleetCluster(lambda k: controller_output(gpu_prep, k), pending=0)
    monkeypatch.setattr("imagegate.kube.kubectl.KubectlCluster", lambda context=None: cluster)
    (tmp_path / "nodes.json").write_text(json.dumps({"items": [_k8s_node(n) for n in NODES[:3]]}))
    key = keys.generate()
    (tmp_path / "k.pem").write_bytes(keys.private_pem(key, None))
    args = ["fleet", "run", f"myorg/torch@{DIGEST}", "--nodes", str(tmp_path / "nodes.json"), "--jobs", "2",
            "-o", str(tmp_path / "runs"), "--key", str(tmp_path / "k.pem"), "--format", "json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert [(n["name"], n["verdict"]) for n in doc["nodes"]] == [(n, "unfit") for n in NODES[:3]]
    assert not cluster.objects and cluster.most_alive <= 2
    for node, attempt in doc["attempts"].items():
        raw = (Path(attempt) / nodecheck.NODE_FILE).read_bytes()
        statement = nodecheck.verify_node(raw, key.public)
        assert statement["subject"][0]["name"] == f"node/{node}"
        # the image that ran the check, by the digest the run read, and the check's own verdict
        assert statement["predicate"]["image"] == {"reference": f"myorg/torch@{DIGEST}", "digest": DIGEST}
        stage = next(s for s in load_attempt(Path(attempt)).stages if s.probe == "gpu_preflight")
        assert statement["predicate"]["verdict"] == stage.status.value
    assert all(n["why"][0].startswith("node check DEFERRED") for n in doc["nodes"])  # none refused
    # fleet report --key on what fleet run left: each attempt verified as its own node's; two
    # swapped, each is refused (the Pod ran on the other node, the statement names the other)
    _, pub = keys.write_keypair(tmp_path / "ci", key, None)
    given = [f"{n}={a}" for n, a in doc["attempts"].items()]
    report = CliRunner().invoke(app, ["fleet", "report", *given, "--key", str(pub), "--format", "json"])
    assert report.exit_code == 1, report.output
    assert {n["evidence"] for n in json.loads(report.stdout)["nodes"]} == {"verified"}
    a1, a2 = doc["attempts"]["gpu-1"], doc["attempts"]["gpu-2"]
    swapped = CliRunner().invoke(app, ["fleet", "report", f"gpu-1={a2}", f"gpu-2={a1}", "--key", str(pub)])
    assert swapped.exit_code == 1, swapped.output
    assert (
        "gpu-1: refused: the attempt ran on node 'gpu-2' (its signed environment), not 'gpu-1'"
        in swapped.stdout
    )
    assert "gpu-2: refused: node-check.dsse.json names node 'gpu-1', not 'gpu-2'" in swapped.stdout
    assert "gpu-2: refused: the attempt ran on node 'gpu-1' (its signed environment)" in swapped.stdout


def test_cli_fleet_collect_reads_the_jobs_applied_earlier_and_deletes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fleet render | kubectl apply`, then `fleet collect`: each node's Job found by the name
    render gives it, collected and reported; the objects stay (FleetCluster, as above)."""
    from typer.testing import CliRunner

    from imagegate.cli import app
    from tests.fleet.test_judge import _k8s_node
    from tests.helpers import controller_output

    gpu_prep = runner.prepare(runner.RunOptions(pipeline="gpu", gpus="8"))
    cluster = FleetCluster(lambda k: controller_output(gpu_prep, k), pending=0)
    monkeypatch.setattr("imagegate.kube.kubectl.KubectlCluster", lambda context=None: cluster)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))  # the default key, made on first use
    (tmp_path / "nodes.json").write_text(json.dumps({"items": [_k8s_node(n) for n in NODES[:3]]}))
    image = f"myorg/torch@{DIGEST}"
    args = ["--nodes", str(tmp_path / "nodes.json"), "-o", str(tmp_path / "runs"), "--format", "json"]
    missing = CliRunner().invoke(app, ["fleet", "collect", image, *args])
    assert missing.exit_code == 2, missing.output  # nothing applied yet: no node has a result
    applied = CliRunner().invoke(app, ["fleet", "render", image, "--nodes", str(tmp_path / "nodes.json")])
    for doc in yaml.safe_load_all(applied.stdout):
        cluster.create([doc])
    done = CliRunner().invoke(app, ["fleet", "collect", image, *args])
    assert done.exit_code == 1, done.output  # every node's check ran, on a machine without a GPU
    assert [(n["name"], n["verdict"]) for n in json.loads(done.stdout)["nodes"]] == [
        (n, "unfit") for n in NODES[:3]
    ]
    assert sum(1 for kind, _ in cluster.objects if kind == "job") == 3
