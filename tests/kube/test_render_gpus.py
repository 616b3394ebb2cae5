"""pod render --gpus N: `nvidia.com/gpu: N`, nothing hiding the GPUs, an optional runtime class,
the node check first; still valid against the official Kubernetes schemas."""

from __future__ import annotations

import json

import pytest
import yaml

from imagegate.kube import render, validate
from imagegate.usecases import runner
from tests.helpers import imagegate
from tests.kube.test_render import DIGEST, VERSIONS


@pytest.mark.parametrize("version", VERSIONS)
def test_gpu_pod_requests_gpus_and_validates(version: str) -> None:
    prep = runner.prepare(runner.RunOptions(pipeline="vllm", gpus="2"))
    r = render.render(prep, f"myorg/vllm@{DIGEST}", render.PodOptions(gpus=2, runtime_class="nvidia"))
    assert validate.validate(r.objects, version) == []
    spec = r.job["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "nvidia.com/gpu" not in c["resources"]["requests"]
    names = {e["name"] for e in c["env"]}
    assert "NVIDIA_VISIBLE_DEVICES" not in names and "CUDA_VISIBLE_DEVICES" not in names
    assert spec["runtimeClassName"] == "nvidia"
    # the bundle's plan starts with the node check, and the image's GPU stage needs it
    stages = prep.inside.stages
    assert stages[0].probe == "gpu_preflight" and stages[0].id == "node_check"
    gpu_cli = next(s for s in stages if s.id == "gpu_cli")
    assert gpu_cli.needs == ("node_check",)


def test_zero_gpus_stays_the_default() -> None:
    prep = runner.prepare(runner.RunOptions(pipeline="vllm"))
    r = render.render(prep, f"myorg/vllm@{DIGEST}", render.PodOptions())
    assert "nvidia.com/gpu" not in json.dumps(r.job) and "runtimeClassName" not in json.dumps(r.job)
    assert all(s.probe != "gpu_preflight" for s in prep.inside.stages)


def test_cli_render_with_gpus() -> None:
    res = imagegate(
        "pod", "render", "myorg/vllm:0.11", "-p", "vllm", "--digest", DIGEST, "--gpus", "1",
        "--runtime-class", "nvidia", "--toleration", "nvidia.com/gpu:NoSchedule",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    objs = list(yaml.safe_load_all(res.stdout))
    c = objs[-1]["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert validate.validate(objs, validate.DEFAULT_VERSION) == []
    bad = imagegate("pod", "render", "myorg/vllm:0.11", "--gpus", "-1")
    assert bad.returncode == 3 and "invalid value for '--gpus'" in bad.stderr
