"""What `pod render` makes, before a real Kubernetes API server (tests/kube/apiserver.py: etcd and
kube-apiserver v1.33, built from source): namespaces labelled with each Pod Security level admit
the Job's Pod by default (it runs as a non-root UID, seccomp RuntimeDefault, no privilege
escalation, every capability dropped), `--run-as-user 0` is refused where `restricted` is
enforced, which the render says before anything is applied, and two runs of one image and
pipeline in one namespace no longer collide on the first one's immutable Secret. `pod run` refuses,
before it creates anything, a Pod that the namespace's enforced level would never let be made."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import imagegate
from tests.kube.apiserver import ApiServer, started

IMAGE = "registry.example/team/app@sha256:" + "a" * 64
LEVELS = ("restricted", "baseline", "privileged")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    with started(tmp_path_factory.mktemp("apiserver")) as s:
        yield s


def _render(namespace: str, *extra: str) -> tuple[str, str]:
    r = imagegate("pod", "render", IMAGE, "-p", "python", "-n", namespace, *extra)
    assert r.returncode == 0, r.stderr
    return r.stdout, r.stderr


def _pod_of(rendered: str) -> dict[str, Any]:
    """The Pod the Job's controller would create: its template, as a Pod of its own."""
    (job,) = [d for d in yaml.safe_load_all(rendered) if d["kind"] == "Job"]
    template = job["spec"]["template"]
    meta = {
        **template["metadata"],
        "name": job["metadata"]["name"],
        "namespace": job["metadata"]["namespace"],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def test_the_pod_is_admitted_at_every_level_and_root_only_where_it_is_allowed(server: ApiServer) -> None:
    for level in LEVELS:
        ns = server.namespace(level)
        rendered, said = _render(ns)
        applied = server.kubectl_run("apply", "-f", "-", stdin=rendered)
        assert applied.returncode == 0, applied.stderr
        assert "PodSecurity" not in applied.stderr, applied.stderr  # no warning for the Job's Pod either
        pod = server.kubectl_run(
            "create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(_pod_of(rendered))
        )
        assert pod.returncode == 0, f"{level}: {pod.stderr}"
        as_root, said = _render(ns, "--run-as-user", "0")
        assert "--run-as-user 0" in said and "`baseline`" in said, said  # said before anything is applied
        root_pod = server.kubectl_run(
            "create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(_pod_of(as_root))
        )
        if level == "restricted":
            assert root_pod.returncode != 0
            assert 'violates PodSecurity "restricted:latest"' in root_pod.stderr, root_pod.stderr
            assert "runAsNonRoot" in root_pod.stderr, root_pod.stderr
        else:
            assert root_pod.returncode == 0, f"{level}: {root_pod.stderr}"


def test_two_runs_of_one_image_and_pipeline_in_one_namespace_both_apply(server: ApiServer) -> None:
    ns = server.namespace("restricted")
    for _ in range(2):
        rendered, _said = _render(ns)
        applied = server.kubectl_run("apply", "-f", "-", stdin=rendered)
        assert applied.returncode == 0, applied.stderr
    jobs = server.kubectl_run("get", "jobs", "-n", ns, "-o", "name")
    assert len(jobs.stdout.split()) == 2, jobs.stdout + jobs.stderr
    # The same name twice (what every render did before): the second fails on the first's Secret.
    for n in range(2):
        rendered, _said = _render(ns, "--name", "same-name")
        applied = server.kubectl_run("apply", "-f", "-", stdin=rendered)
        assert (applied.returncode == 0) == (n == 0), applied.stderr
    assert "immutable" in applied.stderr, applied.stderr


def test_pod_run_refuses_what_the_namespace_would_never_admit_before_creating_anything(
    server: ApiServer, tmp_path: Path
) -> None:
    for level, option, meets, why in (
        ("restricted", ("-p", "python", "--run-as-user", "0"), "baseline", "runs as root"),
        (
            "baseline",
            ("-p", "vllm-serve", "--model-host-path", "/models/x"),
            "privileged",
            "mounts a node's folder",
        ),
    ):
        ns = server.namespace(level)
        r = imagegate(
            "pod", "run", IMAGE, "-n", ns, *option, "-o", str(tmp_path / level), "--no-sign",
            env=server.env(), timeout=120,
        )  # fmt: skip
        assert r.returncode == 3, r.stdout + r.stderr
        assert f"namespace {ns} enforces Pod Security `{level}`" in r.stderr, r.stderr
        assert f"meets only `{meets}`: it {why}" in r.stderr, r.stderr
        left = server.kubectl_run("get", "jobs,configmaps,secrets", "-n", ns, "-o", "name")
        assert "imagegate" not in left.stdout, left.stdout  # nothing was created
