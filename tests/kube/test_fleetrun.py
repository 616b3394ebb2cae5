"""`fleet run`'s orchestration (kube/fleetrun.py) through the Cluster interface, kubelet-style as
tests/kube/test_podrun.py runs one Pod: FakeCluster stands in for the API server only, and each
Pod's log is a real controller run of the real bundle on this machine, with that Pod's own key."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from imagegate import accept, runner
from imagegate.kube import collect, fleetrun, podrun, render
from imagegate.kube.cluster import ClusterError
from imagegate.model import RunRecord, Status
from tests.kube.test_podrun import DIGEST, FakeCluster, prep, real_log  # noqa: F401 (fixtures)

NODES = ["gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"]


class FleetCluster(FakeCluster):
    """FakeCluster for many Jobs at once: each Pod follows its own Job, a Job named in `failing`
    ends DeadlineExceeded with its Pod never started, and the most Jobs alive at once is kept."""

    def __init__(self, log: Callable[[bytes], bytes], failing: Sequence[str] = (), pending: int = 2) -> None:
        super().__init__(log, terminating_polls=1, pending_polls=pending)
        self.lock = threading.Lock()
        self.failing, self.most_alive = set(failing), 0

    def _alive(self) -> int:
        return sum(1 for kind, _ in self.objects if kind == "job")

    def create(self, objects: Sequence[dict[str, Any]]) -> None:
        with self.lock:
            self.calls.append("create")
            for obj in objects:
                key = (obj["kind"].lower(), obj["metadata"]["name"])
                assert key not in self.objects, f"{key} already exists"
                self.objects[key] = copy.deepcopy(obj)
                if obj["kind"] == "Job":
                    self.pod_list.append(self._pod_for(obj))
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
        return accept.accept(job.prep, observer, out / job.node, accept.Outputs()).record

    return one


def _unfit(runs: list[fleetrun.NodeRun]) -> list[str]:
    """The nodes with no record, or a record with an ERROR stage (pip check may FAIL anywhere)."""
    return [
        r.node for r in runs if r.record is None or any(s.status is Status.ERROR for s in r.record.stages)
    ]


def test_one_failing_node_of_five_is_the_one_flagged_then_fit_on_a_re_run(
    tmp_path: Path,
    prep: runner.Prepared,  # noqa: F811
    real_log: Callable[[bytes], bytes],  # noqa: F811
) -> None:
    clock = Clock()
    waits = podrun.Waits(poll_s=2, clock=clock, sleep=clock.sleep)
    cluster = FleetCluster(real_log, failing=["imagegate-node-check-gpu-3"])
    runs = fleetrun.run_fleet(
        _jobs(prep, NODES), cluster, _attempt(tmp_path / "1"), parallel=2, deadline_s=3600, waits=waits
    )
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
    runs = fleetrun.run_fleet(
        _jobs(prep, NODES), again, _attempt(tmp_path / "2"), parallel=3, deadline_s=3600, waits=waits
    )
    assert _unfit(runs) == [] and 1 <= again.most_alive <= 3 and not again.objects


def test_the_deadline_ends_the_fleet_with_nothing_left(
    tmp_path: Path,
    prep: runner.Prepared,  # noqa: F811
    real_log: Callable[[bytes], bytes],  # noqa: F811
) -> None:
    clock = Clock()
    waits = podrun.Waits(poll_s=5, clock=clock, sleep=clock.sleep)
    cluster = FleetCluster(real_log, pending=10**6)  # no Pod ever starts
    runs = fleetrun.run_fleet(
        _jobs(prep, NODES[:4]), cluster, _attempt(tmp_path), parallel=2, deadline_s=60, waits=waits
    )
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

    with pytest.raises(KeyboardInterrupt):
        fleetrun.run_fleet(
            _jobs(prep, NODES), cluster, interrupting, parallel=2, deadline_s=10**6, waits=waits
        )
    assert not cluster.objects and calls <= 3  # the queued nodes never started
