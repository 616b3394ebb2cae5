"""Fake nodes for the cluster tests: kwok (sigs.k8s.io/kwok at the version
tests/consumers/kwok/go.mod pins, built by scripts/consumers.py `build --tool kwok`), started
beside a real control plane (tests/kube/apiserver.py with its controllers): the nodes are Node
objects the real scheduler places Pods on, and kwok plays their kubelet's part in the API (Ready,
leases, a Pod's status), with no kubelet and no container behind them.

kwok runs nothing, so a test plays each node's part itself, named so (`Kwok.play`): it writes the
log a node's runtime would keep for the container (CRI format, served by kwok's kubelet API as
`kubectl logs` reads it through the API server, a Logs object per Pod), then sets the image ID and
the exit code the runtime would report; only then does the Pod complete (kwok/pod-stages.yaml).
Everything started is stopped, and its folder removed, whatever happens."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from imagegate.kube import collect
from imagegate.kube.render import GPU_RESOURCE
from imagegate.usecases import runner
from tests.helpers import controller_output, go_tools
from tests.kube.apiserver import ApiServer, stop
from tests.oci.infra import free_port

STAGES = Path(__file__).parent / "kwok" / "pod-stages.yaml"
MANAGED = "kwok.x-k8s.io/node"  # the annotation (value "fake") of the nodes this kwok manages
READY_S = 60.0
PLAYED_S = 30.0  # kwok serves a new Logs object within a second here


def binary() -> tuple[Path, Path]:
    """kwok, built if missing, and its module's source (the CRDs it reads come from there)."""
    script = go_tools("kwok")
    source = script.GO_CACHE / "mod" / "sigs.k8s.io" / f"kwok@{script.KWOK.version}"
    return Path(script.exe(script.KWOK)), source


@dataclass(frozen=True)
class Kwok:
    api: ApiServer
    folder: Path
    server: str  # kwok's kubelet API (containerLogs), as the API server reaches it

    def node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        allocatable: Mapping[str, str] | None = None,
        cordoned: bool = False,
    ) -> None:
        """A fake node (kwok makes it Ready) with these labels and allocatable resources."""
        self.nodes([name], labels=labels, allocatable=allocatable, cordoned=cordoned)

    def nodes(
        self,
        names: list[str],
        *,
        labels: Mapping[str, str] | None = None,
        allocatable: Mapping[str, str] | None = None,
        cordoned: bool = False,
    ) -> None:
        """Fake nodes alike, made in one request (a fleet's worth at once)."""
        resources = {"cpu": "32", "memory": "256Gi", "pods": "110", **(allocatable or {})}
        items: list[dict[str, Any]] = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {MANAGED: "fake"},
                    "labels": {"kubernetes.io/hostname": name, "type": "kwok", **(labels or {})},
                },
                "spec": {"unschedulable": cordoned},
                "status": {"allocatable": resources, "capacity": resources},
            }
            for name in names
        ]
        doc = {"apiVersion": "v1", "kind": "List", "items": items}
        done = self.api.kubectl_run("create", "-f", "-", stdin=json.dumps(doc), timeout=300)
        assert done.returncode == 0, done.stderr

    def ready(self, names: list[str], timeout: float = READY_S) -> None:
        """Wait until kwok has made each node Ready."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.api.kubectl_run("get", "nodes", "-o", "json", timeout=120)
            ready = {
                n["metadata"]["name"]
                for n in json.loads(got.stdout)["items"]
                if any(
                    c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (n.get("status") or {}).get("conditions") or []
                )
            }
            if set(names) <= ready:
                return
            time.sleep(0.2)
        raise AssertionError(f"kwok made {names} Ready? not within {timeout:g} s: {_tail(self.folder)}")

    def play(self, pod: Mapping[str, Any], log: bytes, image_id: str, exit_code: int = 0) -> None:
        """Play the node's part for `pod` (kwok runs nothing): the container's log as its runtime
        keeps it (CRI format, every line stdout), served by kwok's kubelet API; then the image ID
        and the exit code the runtime would report, which completes the Pod."""
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        (container,) = [c["name"] for c in pod["spec"]["containers"]]
        logs = self.folder / "logs" / f"{ns}_{name}_{container}.log"
        logs.parent.mkdir(exist_ok=True)
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
        logs.write_bytes(b"".join(f"{stamp} stdout F ".encode() + line + b"\n" for line in log.splitlines()))
        spec = {"logs": [{"containers": [container], "logsFile": str(logs)}]}
        kind = {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Logs"}
        made = self.api.kubectl_run(
            "create",
            "-f",
            "-",
            stdin=json.dumps({**kind, "metadata": {"name": name, "namespace": ns}, "spec": spec}),
        )
        assert made.returncode == 0, made.stderr
        self._served(ns, name, container)
        done = self.api.kubectl_run(
            "annotate", "pod", name, "-n", ns,
            f"imagegate.test/image-id={image_id}", f"imagegate.test/exit-code={exit_code}",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    def _served(self, ns: str, name: str, container: str) -> None:
        """Wait until kwok serves the log: the Pod must not complete before its log can be read."""
        url = f"{self.server}/containerLogs/{ns}/{name}/{container}"
        deadline = time.monotonic() + PLAYED_S
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, verify=False, timeout=2).status_code == 200:
                    return
            time.sleep(0.1)
        raise AssertionError(f"kwok did not serve {url} within {PLAYED_S:g} s: {_tail(self.folder)}")


class NodePlayer:
    """Plays each node's part for the node check Pods in `ns` (kwok runs nothing; named so): once
    the scheduler has placed a Pod and kwok started it, the log its container would print (the
    real controller's output for the Job's bundle, as `fleet render` makes it for the Pod's GPU
    count, and the event key in the Job's Secret, run on this machine, where no GPU is), and
    `image_id` as the node's runtime would report it. Records where each Pod ran; `workers` Pods
    played at once."""

    def __init__(self, kwok: Kwok, ns: str, image_id: str, *, workers: int = 1, poll_s: float = 0.3) -> None:
        self.kwok, self.ns, self.image_id, self.poll_s = kwok, ns, image_id, poll_s
        self.placed: dict[str, str] = {}  # Pod name -> the node the scheduler bound it to
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.preps: dict[str, runner.Prepared] = {}
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="node")
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> NodePlayer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        self.pool.shutdown(wait=True)
        assert not self.errors, self.errors

    def _loop(self) -> None:
        try:
            while not self.stop.wait(self.poll_s):
                got = self.kwok.api.kubectl_run("get", "pods", "-n", self.ns, "-o", "json", timeout=120)
                for pod in json.loads(got.stdout)["items"] if got.returncode == 0 else []:
                    name = pod["metadata"]["name"]
                    if name in self.placed or pod.get("status", {}).get("phase") != "Running":
                        continue
                    self.placed[name] = pod["spec"]["nodeName"]
                    self.pool.submit(self._play, pod)
        except BaseException as e:  # said by __exit__, in the test's thread
            self.errors.append(e)

    def _play(self, pod: dict[str, Any]) -> None:
        try:
            self.kwok.play(pod, self._log(pod), self.image_id)
        except BaseException as e:  # said by __exit__, in the test's thread, and now: the run waits
            self.errors.append(e)
            print(f"node player: {pod['metadata']['name']}: {e!r}", file=sys.stderr, flush=True)

    def _log(self, pod: dict[str, Any]) -> bytes:
        ref = collect.key_secret(pod)
        assert ref is not None, pod["spec"]
        got = self.kwok.api.kubectl_run("get", "secret", ref[0], "-n", self.ns, "-o", "json")
        key = collect.event_key(pod, json.loads(got.stdout))
        assert key is not None, got.stderr
        (container,) = pod["spec"]["containers"]
        gpus = container["resources"]["limits"][GPU_RESOURCE]
        with self.lock:  # one plan and bundle per GPU count, as fleet render makes them
            if gpus not in self.preps:
                self.preps[gpus] = runner.prepare(runner.RunOptions(pipeline="gpu", gpus=gpus))
            prep = self.preps[gpus]
        return controller_output(prep, key)


def _tail(folder: Path) -> str:
    log = folder / "kwok.log"
    return log.read_text(errors="replace")[-1500:] if log.exists() else "(no log)"


@contextlib.contextmanager
def started(api: ApiServer, folder: Path) -> Iterator[Kwok]:
    """kwok managing the nodes annotated kwok.x-k8s.io/node=fake, with Logs objects enabled; stopped
    and its folder removed at the end."""
    exe, source = binary()
    folder.mkdir(parents=True, exist_ok=True)
    crd = source / "kustomize" / "crd" / "bases" / "kwok.x-k8s.io_logs.yaml"
    applied = api.kubectl_run("apply", "-f", str(crd))
    assert applied.returncode == 0, applied.stderr
    established = api.kubectl_run(
        "wait", "--for=condition=Established", "crd/logs.kwok.x-k8s.io", "--timeout=60s"
    )
    assert established.returncode == 0, established.stderr
    port = free_port()
    argv = [
        str(exe), f"--kubeconfig={api.kubeconfig}", f"--config={STAGES}",
        "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={MANAGED}=fake",
        "--node-ip=127.0.0.1", f"--node-port={port}", f"--server-address=127.0.0.1:{port}",
        "--enable-crds=Logs",
    ]  # fmt: skip
    env = {**os.environ, "HOME": str(folder)}  # kwok's own files (~/.kwok) stay in the folder
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=(folder / "kwok.log").open("wb"), env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        server = f"https://127.0.0.1:{port}"
        deadline = time.monotonic() + READY_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"kwok exited {proc.returncode}: {_tail(folder)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{server}/healthz", verify=False, timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"kwok was not ready within {READY_S:g} s: {_tail(folder)}")
            time.sleep(0.2)
        yield Kwok(api, folder, server)
    finally:
        stop([proc])
        shutil.rmtree(folder, ignore_errors=True)
