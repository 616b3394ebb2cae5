"""The rendered Job before a real control plane (tests/kube/apiserver.py with kube-controller-manager
and kube-scheduler): in a namespace that enforces Pod Security `restricted`, the Job controller
makes the Job's Pod as rendered by default (through ServiceAccount admission, with no token
mounted), and never the Pod of a render that runs as root: the
Job then only records FailedCreate, what `pod run` now refuses before creating anything. No
kubelet: the Pod is made and stays Pending (no node), which is all admission decides."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml

from tests.helpers import imagegate
from tests.kube.apiserver import ApiServer, started
from tests.kube.test_apiserver import IMAGE
from tests.oci.infra import wait_for

WAIT_S = 60.0  # the Job controller acts within seconds here


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    with started(tmp_path_factory.mktemp("control-plane"), controllers=True) as s:
        yield s


def _applied(cluster: ApiServer, ns: str, *extra: str) -> str:
    r = imagegate("pod", "render", IMAGE, "-p", "python", "-n", ns, *extra)
    assert r.returncode == 0, r.stderr
    applied = cluster.kubectl_run("apply", "-f", "-", stdin=r.stdout)
    assert applied.returncode == 0, applied.stderr
    (job,) = [d for d in yaml.safe_load_all(r.stdout) if d["kind"] == "Job"]
    return str(job["metadata"]["name"])


def test_the_job_controller_makes_the_pod_under_restricted_and_never_a_root_one(cluster: ApiServer) -> None:
    ns = cluster.namespace("restricted")
    name = _applied(cluster, ns)

    def pods(job: str) -> list[str]:
        got = cluster.kubectl_run("get", "pods", "-n", ns, "-l", f"job-name={job}", "-o", "name")
        return got.stdout.split()

    assert wait_for(lambda: bool(pods(name)), WAIT_S), f"no Pod of job/{name} within {WAIT_S:g} s"
    (made,) = pods(name)
    pod = json.loads(cluster.kubectl_run("get", made, "-n", ns, "-o", "json").stdout)
    # ServiceAccount admission ran on it (it names the namespace's default account), and the
    # rendered Pod still mounts no token of it.
    assert pod["spec"]["serviceAccountName"] == "default", pod["spec"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert not any(v.get("projected") for v in pod["spec"].get("volumes", [])), pod["spec"]["volumes"]
    root = _applied(cluster, ns, "--run-as-user", "0")

    def refused() -> str | None:
        got = cluster.kubectl_run(
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            f"involvedObject.name={root},reason=FailedCreate",
            "-o",
            "json",
        )
        messages = [e.get("message", "") for e in json.loads(got.stdout or "{}").get("items", [])]
        return next((m for m in messages if "violates PodSecurity" in m), None)

    assert wait_for(lambda: refused() is not None, WAIT_S), (
        f"no FailedCreate of job/{root} within {WAIT_S:g} s"
    )
    message = refused()
    assert message is not None
    assert 'violates PodSecurity "restricted:latest"' in message and "runAsNonRoot" in message, message
    assert pods(root) == []
