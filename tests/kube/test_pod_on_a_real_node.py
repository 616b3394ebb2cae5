"""`pod run` on a real node (tests/kube/kubelet.py): a control plane with its controllers
(tests/kube/apiserver.py) and a kubelet with a containerd of its own, which pulls the image from a
registry on 127.0.0.1 (Debian's docker-registry, plain HTTP) and starts it with runc. The image is
the tests' Python image, made this test's own and pushed there; `pod run` names it by its
manifest digest. The probes run in the Pod the kubelet started, in a namespace enforcing Pod
Security `restricted`; the verdict is collected from the Pod's log as the API server reads it
from the kubelet, and signed. The evidence names the Pod's UID and the container containerd ran,
the image-ID stage passes on containerd's own imageID, `imagegate verify` accepts the attempt, and
two runs of the image side by side in one namespace each get objects and a Pod of their own. A Job
`pod render` wrote and kubectl applied is collected from the node the same way (`pod collect`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from imagegate.domain.results import Status
from imagegate.kube import collect
from imagegate.kube.render import CONTAINER
from imagegate.report.load import read_attempt
from tests.attest.conftest import start_registry
from tests.helpers import image_of_its_own
from tests.kube.apiserver import started
from tests.kube.kubelet import Node
from tests.kube.kubelet import started as node_started

RUN_S = 600  # the pull (~100 MB of layers), unpacking and the probes: about a minute here

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with start_registry(tmp_path_factory.mktemp("registry")) as host:
        yield host


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, registry: str) -> Iterator[Node]:
    with (
        started(tmp_path_factory.mktemp("control-plane"), controllers=True) as api,
        node_started(api, tmp_path_factory.mktemp("node"), registries=[registry]) as n,
    ):
        yield n


@pytest.fixture(scope="module")
def image(images: dict[str, str], registry: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The tests' Python image, made this module's own and pushed: its reference by digest."""
    tag = image_of_its_own(images["python"], "imagegate-test/real-node", tmp_path_factory.mktemp("image"))
    pushed = f"{registry}/team/python:{tag.rpartition(':')[2]}"
    try:
        subprocess.run(["docker", "tag", tag, pushed], check=True)
        subprocess.run(["docker", "push", "-q", pushed], check=True, capture_output=True)
        got = subprocess.run(
            ["docker", "inspect", "--format", "{{json .RepoDigests}}", pushed],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        (digested,) = [d for d in json.loads(got.stdout) if d.startswith(f"{registry}/team/python@")]
        yield digested
    finally:
        subprocess.run(["docker", "rmi", tag, pushed], capture_output=True)


def _imagegate(node: Node, *args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "imagegate", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=cwd, env={**node.api.env(), "COLUMNS": "300"},
    )  # fmt: skip


def _pod_run(node: Node, image: str, ns: str, cwd: Path, *extra: str) -> subprocess.Popen[str]:
    return _imagegate(
        node, "pod", "run", image, "-p", "python", "-m", "json", "-n", ns, "--key", "ci.key",
        "--format", "json", "-o", "out", "--deadline", str(RUN_S), *extra, cwd=cwd,
    )  # fmt: skip


def _finished(p: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = p.communicate(timeout=RUN_S + 120)
    assert p.returncode == 0, out + err
    return json.loads(out)  # type: ignore[no-any-return]


def _attempt(out: Path, statement: dict[str, Any]) -> Path:
    (attempt,) = out.glob("*/" + statement["predicate"]["attempt"]["id"])
    return attempt


def _checked(node: Node, image: str, cwd: Path, statement: dict[str, Any]) -> dict[str, Any]:
    """What every run on the node must show; the Pod as the evidence holds it."""
    assert statement["predicate"]["verdict"] == "PASS", statement["predicate"]["verdict"]
    attempt = _attempt(cwd / "out", statement)
    pod = json.loads((attempt / "pod.json").read_text())
    (status,) = pod["status"]["containerStatuses"]
    # The node that ran it is this kubelet's, the runtime containerd (the containerID's scheme),
    # and the imageID the one containerd gives an image pulled by digest: the reference itself.
    assert pod["spec"]["nodeName"] == node.name
    assert status["containerID"].startswith("containerd://"), status
    assert status["imageID"] == image, status
    assert status["state"]["terminated"]["exitCode"] == 0, status
    facts = json.loads((attempt / "run.json").read_text())
    env = facts["environment"]
    assert (env["engine"], env["node"], env["pod"]) == ("containerd", node.name, pod["metadata"]["name"]), env
    assert env["image_id"] == image, env
    # The run's record names the Pod by its UID and the container containerd ran it in.
    (ran,) = facts["run"]["controllers"]
    assert (ran["pod_uid"], ran["container_id"]) == (pod["metadata"]["uid"], status["containerID"]), ran
    (stage,) = [s for s in read_attempt(attempt).record.stages if s.id == collect.IMAGE_ID_STAGE]
    assert stage.status is Status.PASS, stage.detail
    verified = _imagegate(node, "verify", str(attempt), "--key", "ci.pub", "--image", image, cwd=cwd)
    out, err = verified.communicate(timeout=120)
    assert verified.returncode == 0, out + err
    return pod  # type: ignore[no-any-return]


def test_pod_run_runs_the_probes_in_a_pod_the_kubelet_started(node: Node, image: str, tmp_path: Path) -> None:
    assert _imagegate(node, "keygen", "--out", "ci", cwd=tmp_path).wait(timeout=60) == 0
    ns = node.api.namespace("restricted")
    started_at = time.monotonic()
    # --keep: the Job and its Pod stay, so that containerd can be asked about the container.
    statement = _finished(_pod_run(node, image, ns, tmp_path, "--keep"))
    took = time.monotonic() - started_at
    pod = _checked(node, image, tmp_path, statement)
    (status,) = pod["status"]["containerStatuses"]
    cid = status["containerID"].removeprefix("containerd://")
    # The container of the evidence is the one this node's containerd ran, for that very Pod,
    # from the image it pulled from the registry.
    info = node.ctr("containers", "info", cid)
    assert info.returncode == 0, info.stderr
    container = json.loads(info.stdout)
    assert container["Labels"]["io.kubernetes.pod.uid"] == pod["metadata"]["uid"], container["Labels"]
    assert container["Labels"]["io.kubernetes.container.name"] == CONTAINER
    pulled = node.ctr("images", "ls", "-q")
    assert image in pulled.stdout.split(), pulled.stdout
    print(f"pod run on the real node: {took:.1f} s", file=sys.stderr)


def test_two_runs_side_by_side_in_one_namespace(node: Node, image: str, tmp_path: Path) -> None:
    assert _imagegate(node, "keygen", "--out", "ci", cwd=tmp_path).wait(timeout=60) == 0
    ns = node.api.namespace("restricted")
    first, second = _pod_run(node, image, ns, tmp_path), _pod_run(node, image, ns, tmp_path)
    pods = [_checked(node, image, tmp_path, _finished(p)) for p in (first, second)]
    assert pods[0]["metadata"]["uid"] != pods[1]["metadata"]["uid"]
    assert pods[0]["metadata"]["name"] != pods[1]["metadata"]["name"]
    assert len({p["status"]["containerStatuses"][0]["containerID"] for p in pods}) == 2
    left = node.api.kubectl_run("get", "jobs,secrets,configmaps", "-n", ns, "-o", "name")
    assert not [o for o in left.stdout.split() if "imagegate" in o], left.stdout  # each run deleted its own


def test_pod_collect_reads_a_job_applied_to_the_node(node: Node, image: str, tmp_path: Path) -> None:
    """`pod render | kubectl apply`, as a user without `pod run` does, then `pod collect --job`."""
    assert _imagegate(node, "keygen", "--out", "ci", cwd=tmp_path).wait(timeout=60) == 0
    ns = node.api.namespace("restricted")
    render = _imagegate(node, "pod", "render", image, "-p", "python", "-m", "json", "-n", ns, cwd=tmp_path)
    rendered, said = render.communicate(timeout=120)
    assert render.returncode == 0, said
    applied = node.api.kubectl_run("apply", "-f", "-", stdin=rendered)
    assert applied.returncode == 0, applied.stderr
    (job,) = [d["metadata"]["name"] for d in yaml.safe_load_all(rendered) if d["kind"] == "Job"]
    complete = node.api.kubectl_run(
        "wait", f"job/{job}", "-n", ns, "--for=condition=Complete", f"--timeout={RUN_S}s", timeout=RUN_S + 10
    )
    assert complete.returncode == 0, complete.stderr
    collect_run = _imagegate(
        node, "pod", "collect", "--job", job, "-n", ns, "-p", "python", "-m", "json", "--key", "ci.key",
        "--format", "json", "-o", "out", cwd=tmp_path,
    )  # fmt: skip
    _checked(node, image, tmp_path, _finished(collect_run))
