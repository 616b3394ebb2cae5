"""Every Pod shape, every way to a GPU: the shipped policies (the Kyverno ClusterPolicy's
preconditions by the jmespath library with Kyverno's autogen for the Pod controllers, the Kyverno
ImageValidatingPolicy's CEL by cel-expr-python with its own autogen (ivpol.py),
policy-controller's CUE by the CUE engine) on Pods that reach a GPU by each route a Pod shows, on Pods that reach none, and on
the Pod templates of a Deployment, Job, StatefulSet and CronJob; the VSAs are the real runner's
deferred run (CPU level only) and the GPU-level stand-in (conftest.py)."""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.policies import admission, engines
from tests.policies.admission import not_before
from tests.policies.conftest import Keys, vsa

IMAGE = "registry.example/team/app:1"


def _pod(containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": containers, **spec},
    }


def _c(name: str = "app", **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": IMAGE, **fields}


def _env(value: str) -> list[dict[str, Any]]:
    return [{"name": "LOG_LEVEL", "value": "info"}, {"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]


# Each way a Pod can reach a GPU that the Pod itself shows.
GPU_ROUTES = {
    "limits": _pod([_c("log"), _c(resources={"limits": {"nvidia.com/gpu": "1"}})]),
    "requests only": _pod([_c(resources={"requests": {"nvidia.com/gpu": "1", "cpu": "2"}})]),
    "init container": _pod(
        [_c(resources={"limits": {"cpu": "1"}})],
        initContainers=[_c("warm", resources={"limits": {"nvidia.com/gpu": "1"}})],
    ),
    "MIG slice": _pod([_c(resources={"limits": {"nvidia.com/mig-1g.18gb": "1"}})]),
    "time-sliced": _pod([_c(resources={"limits": {"nvidia.com/gpu.shared": "1"}})]),
    "MIG slice time-sliced": _pod(
        [_c(resources={"requests": {"nvidia.com/mig-3g.71gb.shared": "1"}, "limits": {"memory": "1Gi"}})]
    ),
    "env": _pod([_c(env=_env("all"))]),
    "env in an init container": _pod([_c()], initContainers=[_c("warm", env=_env("0"))]),
    "env from valueFrom": _pod(
        [
            _c(
                env=[
                    {
                        "name": "NVIDIA_VISIBLE_DEVICES",
                        "valueFrom": {"configMapKeyRef": {"name": "g", "key": "d"}},
                    }
                ]
            )
        ]
    ),
    "env in an ephemeral container": _pod(
        [_c()], ephemeralContainers=[_c("debug", env=_env("GPU-0"), targetContainerName="app")]
    ),
    "runtime class": _pod([_c()], runtimeClassName="nvidia"),
    "DRA claim": _pod(
        [_c(resources={"claims": [{"name": "gpu"}]})],
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
    ),
}

# Pods that reach no GPU, among them the fields the routes use, set to what gives none.
CPU_SHAPES = {
    "plain": _pod([_c(), _c("log")]),
    "init container without GPU": _pod(
        [_c(resources={"requests": {"cpu": "1"}, "limits": {"cpu": "1", "memory": "1Gi"}})],
        initContainers=[_c("migrate", resources={"limits": {"cpu": "1"}})],
    ),
    "ephemeral container without GPU env": _pod(
        [_c()], ephemeralContainers=[_c("debug", env=[{"name": "TERM", "value": "xterm"}])]
    ),
    "env void and none": _pod([_c(env=_env("void")), _c("log", env=_env("none"))]),
    "env empty": _pod([_c(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": ""}])]),
    "another runtime class": _pod([_c()], runtimeClassName="gvisor"),
    "another vendor's resource": _pod([_c(resources={"limits": {"example.com/fpga": "1", "cpu": "1"}})]),
    "no resource claims": _pod([_c()], resourceClaims=[]),
}

KINDS = ("Pod", "Deployment", "Job", "StatefulSet", "CronJob")


def _shaped(kind: str, pod: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(pod) if kind == "Pod" else admission.templated(kind, copy.deepcopy(pod))


def _kyverno_now(attempt: Path) -> dt.datetime:
    verified = dt.datetime.fromisoformat(vsa(attempt)["predicate"]["timeVerified"].replace("Z", "+00:00"))
    return verified + dt.timedelta(minutes=5)


# Both Kyverno policies: the ClusterPolicy (JMESPath) and the ImageValidatingPolicy (CEL).
KYVERNO_POLICIES = ("clusterpolicy", "imagevalidatingpolicy")
IVPOL_NO_GPU = "the imagegate VSA lacks level IMAGEGATE_GPU (needed for this Pod)"


def _kyverno(
    policy: str, runs: dict[str, Path], keys: Keys, name: str, obj: dict[str, Any], tmp: Path, **kw: Any
) -> list[str]:
    """What `policy` refuses (the ClusterPolicy: per rule; the IVPOL: its message); empty: admitted."""
    attempt = runs[name]
    args = (obj, attempt, keys.pub.read_text(), _kyverno_now(attempt), tmp)
    if policy == "clusterpolicy":
        return admission.kyverno(*args, **kw)
    said = admission.kyverno_ivpol(*args, **kw)
    return [] if said is None else [said]


def _rule(kind: str, gpu: bool) -> str:
    name = admission.GPU_RULE if gpu else admission.CPU_RULE
    return name if kind == "Pod" else f"{'autogen-cronjob' if kind == 'CronJob' else 'autogen'}-{name}"


def _refused_gpu(policy: str, kind: str) -> list[str]:
    return [f"{_rule(kind, True)}: conditions"] if policy == "clusterpolicy" else [IVPOL_NO_GPU]


@pytest.mark.parametrize("policy", KYVERNO_POLICIES)
@pytest.mark.parametrize("kind", KINDS)
def test_kyverno_refuses_every_gpu_route_on_a_deferred_verdict(
    kind: str, policy: str, runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    """The deferred run (CPU level only): a Pod, or a controller's Pod template, that reaches a
    GPU by any route is refused by the GPU rule (or its autogen copy; the IVPOL: for want of the
    GPU level, through its autogen); one that reaches none is admitted."""
    for route, pod in GPU_ROUTES.items():
        refused = _kyverno(policy, runs, policy_keys, "deferred", _shaped(kind, pod), tmp_path)
        assert refused == _refused_gpu(policy, kind), (kind, route)
    for shape, pod in CPU_SHAPES.items():
        assert _kyverno(policy, runs, policy_keys, "deferred", _shaped(kind, pod), tmp_path) == [], (
            kind,
            shape,
        )


@pytest.mark.parametrize("policy", KYVERNO_POLICIES)
@pytest.mark.parametrize("kind", KINDS)
def test_kyverno_admits_every_shape_on_the_gpu_level(
    kind: str, policy: str, runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    for shape, pod in {**GPU_ROUTES, **CPU_SHAPES}.items():
        assert _kyverno(policy, runs, policy_keys, "gpu_pass", _shaped(kind, pod), tmp_path) == [], (
            kind,
            shape,
        )


@pytest.mark.parametrize("kind", KINDS)
def test_each_shape_meets_exactly_one_kyverno_rule(kind: str) -> None:
    policy = yaml.safe_load(admission.KYVERNO.read_text())
    rules = admission.kyverno_rules(policy, kind)
    now = dt.datetime.now(dt.timezone.utc)
    for gpu, shapes in ((True, GPU_ROUTES), (False, CPU_SHAPES)):
        for shape, pod in shapes.items():
            request = {"request": {"object": _shaped(kind, pod)}}
            applies = [
                r["name"] for r in rules if engines.conditions_hold([r["preconditions"]], request, now)
            ]
            assert applies == [_rule(kind, gpu)], (kind, shape)


def _policy_controller(
    runs: dict[str, Path], keys: Keys, name: str, objs: list[dict[str, Any]], tmp: Path, **kw: Any
) -> list[tuple[bool, list[str]]]:
    floor = not_before(dt.datetime.now(dt.timezone.utc))
    return admission.policy_controller_many(objs, runs[name], keys.pub.read_text(), floor, tmp, **kw)


# What the refusal names, per route: the route the CUE policy saw.
SAID = {
    "limits": "app limits nvidia.com/gpu",
    "requests only": "app requests nvidia.com/gpu",
    "init container": "warm limits nvidia.com/gpu",
    "MIG slice": "app limits nvidia.com/mig-1g.18gb",
    "time-sliced": "app limits nvidia.com/gpu.shared",
    "MIG slice time-sliced": "app requests nvidia.com/mig-3g.71gb.shared",
    "env": "app NVIDIA_VISIBLE_DEVICES=all",
    "env in an init container": "warm NVIDIA_VISIBLE_DEVICES=0",
    "env from valueFrom": "app NVIDIA_VISIBLE_DEVICES from valueFrom",
    "env in an ephemeral container": "debug NVIDIA_VISIBLE_DEVICES=GPU-0",
    "runtime class": "runtimeClassName nvidia",
    "DRA claim": "resourceClaims gpu: its device class cannot be seen here, so every claim counts as a GPU",
}


def test_policy_controller_refuses_every_gpu_route_on_a_deferred_verdict(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    """The deferred run: every route, in a Pod and in the templates of a Deployment, Job,
    StatefulSet and CronJob, is refused, the refusal naming the route (a DRA claim: that its
    device class cannot be seen); every Pod that reaches no GPU is admitted."""
    cases = [(kind, route, True) for kind in KINDS for route in GPU_ROUTES]
    cases += [(kind, shape, False) for kind in KINDS for shape in CPU_SHAPES]
    objs = [_shaped(kind, (GPU_ROUTES if gpu else CPU_SHAPES)[shape]) for kind, shape, gpu in cases]
    judged = _policy_controller(runs, policy_keys, "deferred", objs, tmp_path)
    outcomes = list(zip(cases, judged, strict=True))
    admitted = [(kind, shape) for (kind, shape, gpu), (ok, _) in outcomes if gpu and ok]
    assert admitted == [], admitted
    refused = [(kind, shape, said) for (kind, shape, gpu), (ok, said) in outcomes if not gpu and not ok]
    assert refused == [], refused
    for (kind, shape, gpu), (_, said) in outcomes:
        assert not gpu or f'"a GPU route needs imagegate-gpu"."{SAID[shape]}"' in said[-1], (
            kind,
            shape,
            said,
        )


def test_policy_controller_admits_every_shape_on_the_gpu_level(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    cases = [
        (kind, shape) for kind in KINDS for shape in (*GPU_ROUTES, "plain", "init container without GPU")
    ]
    objs = [_shaped(kind, {**GPU_ROUTES, **CPU_SHAPES}[shape]) for kind, shape in cases]
    for (kind, shape), (ok, said) in zip(
        cases, _policy_controller(runs, policy_keys, "gpu_pass", objs, tmp_path), strict=True
    ):
        assert ok, (kind, shape, said)


RENAMED = "example.com/h200-shared"  # a `rename` in a time-slicing configuration


def test_a_renamed_resource_is_a_gpu_route_once_listed(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    """A resource renamed by the device plugin's configuration is no name a policy can guess:
    admitted on the deferred run as shipped, refused once the user adds it to the list the
    policy's comments name (the Kyverno policies' lists; policy-controller's _gpuResources)."""
    pod = _pod([_c(resources={"limits": {RENAMED: "1"}})])
    listed = '"nvidia.com/gpu", "nvidia.com/gpu.shared"'

    def add(text: str) -> str:
        assert text.count(listed) == 1, "the list of GPU resource names is written once"
        return text.replace(listed, f'{listed}, "{RENAMED}"')

    for policy in KYVERNO_POLICIES:
        assert _kyverno(policy, runs, policy_keys, "deferred", pod, tmp_path) == [], policy
        assert _kyverno(policy, runs, policy_keys, "deferred", pod, tmp_path, edit=add) == _refused_gpu(
            policy, "Pod"
        ), policy
    (shipped,) = _policy_controller(runs, policy_keys, "deferred", [pod], tmp_path / "shipped")
    assert shipped[0], shipped
    (edited,) = _policy_controller(runs, policy_keys, "deferred", [pod], tmp_path / "edited", edit=add)
    assert not edited[0] and f"app limits {RENAMED}" in edited[1][-1], edited
