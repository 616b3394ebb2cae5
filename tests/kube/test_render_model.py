"""pod render with a model: the serve stages' model from a PersistentVolumeClaim (a sub-path of
it) or a node's hostPath, mounted read-only where they look for it; --startup-budget sizes the
serve stages and so the Job's activeDeadlineSeconds. The objects validate against the official
schemas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from imagegate.kube import validate
from tests.helpers import imagegate

DIGEST = "sha256:" + "ab" * 32
SERVE = {
    "apiVersion": "imagegate/v1",
    "kind": "Pipeline",
    "name": "serve",
    "stages": [
        {"id": "pip_check", "probe": "pip_check", "timeout": "5m"},
        {
            "id": "serve",
            "probe": "serve",
            "timeout": "30m",
            "requires": ["gpu"],
            "with": {"command": ["vllm", "serve", "{model}", "--port", "{port}"], "engine": "vllm"},
        },
    ],
}


def rendered(tmp_path: Path, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(SERVE))
    r = imagegate("pod", "render", f"myorg/vllm@{DIGEST}", "-p", str(tmp_path / "p.yaml"), *args)
    return r.returncode, [d for d in yaml.safe_load_all(r.stdout) if d] if r.returncode == 0 else [], r.stderr


def test_a_claim_and_sub_path_are_mounted_read_only_and_the_budget_sizes_the_job(tmp_path: Path) -> None:
    code, objects, err = rendered(tmp_path, "--model-pvc", "models:llama-3-8b", "--startup-budget", "35m")
    assert code == 0, err
    job = objects[2]
    pod = job["spec"]["template"]["spec"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod[
        "volumes"
    ]
    mounts = pod["containers"][0]["volumeMounts"]
    assert {
        "name": "model",
        "mountPath": "/tmp/imagegate-model",
        "readOnly": True,
        "subPath": "llama-3-8b",
    } in mounts
    # 35 min to readiness + 10 min of requests for the serve stage, 5 min pip check, 10 min pull,
    # and the controller's slack: past the 30-minute probe that one SGLang start outlived.
    assert job["spec"]["activeDeadlineSeconds"] >= 35 * 60 + 600 + 300 + 600
    assert validate.validate(objects, validate.DEFAULT_VERSION) == []


def test_the_plan_in_the_bundle_serves_the_mounted_model(tmp_path: Path) -> None:
    from imagegate.kube import render
    from imagegate.usecases import runner

    (tmp_path / "p.yaml").write_text(yaml.safe_dump(SERVE))
    words = render.serve_options(None, "/srv/models/llama", "35m")
    prep = runner.prepare(runner.RunOptions(pipeline=str(tmp_path / "p.yaml"), **words))
    serve = next(s for s in prep.plan.stages if s.id == "serve")
    assert serve.params.model_dump()["model"] == "/tmp/imagegate-model"
    assert serve.params.model_dump()["startup_timeout"] == 2100
    assert serve.timeout == 2100 + 600
    r = render.render(
        prep, f"myorg/vllm@{DIGEST}", render.options_from_args(model_host_path="/srv/models/llama")
    )
    vols = r.job["spec"]["template"]["spec"]["volumes"]
    assert {"name": "model", "hostPath": {"path": "/srv/models/llama", "type": "Directory"}} in vols


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model-pvc", "Models!"], "--model-pvc 'Models!': 'Models!' is not a claim name"),
        (["--model-pvc", "models:../etc"], "the sub-path is relative to the claim, without '..'"),
        (["--model-host-path", "srv/models"], "--model-host-path 'srv/models': an absolute path on the node"),
        (["--model-pvc", "m", "--model-host-path", "/m"], "give --model-pvc or --model-host-path, not both"),
        (["--startup-budget", "soon"], "--startup-budget 'soon': "),
    ],
)
def test_bad_model_options_are_named(tmp_path: Path, args: list[str], message: str) -> None:
    code, _, err = rendered(tmp_path, *args)
    assert code == 3 and message in err and "Traceback" not in err, err


def test_a_model_for_a_pipeline_without_a_serve_stage_is_refused(tmp_path: Path) -> None:
    r = imagegate("pod", "render", f"myorg/vllm@{DIGEST}", "-p", "python", "--model-pvc", "models")
    assert r.returncode == 3
    assert (
        "a model given (--model, --model-pvc, --model-host-path), but pipeline 'python' has no serve stage"
        in r.stderr
    )
