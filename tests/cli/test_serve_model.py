"""A serve stage that would start its server here with no model is refused before any work
(exit 3, naming --model); one that is deferred (no GPUs given) waits for `complete --model`."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagegate import pipeline
from imagegate.domain.plan import build_plan
from imagegate.errors import UsageError
from tests.helpers import imagegate


@pytest.mark.parametrize("name", ["sglang-serve", "vllm-serve"])
def test_a_gpu_run_of_a_serve_pipeline_without_a_model_is_refused_first(name: str, tmp_path: Path) -> None:
    r = imagegate("run", "--here", "-p", name, "--gpus", "all", "-o", str(tmp_path / "runs"))
    assert r.returncode == 3, r.stdout + r.stderr
    assert "stage serve would start its server on the GPUs given (--gpus)" in r.stderr
    assert "give --model PATH" in r.stderr
    assert not (tmp_path / "runs").exists()  # nothing was started, no attempt made


def test_the_plan_refuses_only_a_server_that_would_start() -> None:
    loaded = pipeline.load("sglang-serve")
    with pytest.raises(UsageError, match="stage serve would start its server"):
        build_plan(loaded, gpus=True)
    deferred = build_plan(loaded, gpus=False)  # no GPUs: serve is DEFERRED, the model comes later
    assert [s.id for s in deferred.stages] == ["find_spec", "serve_argv", "serve"]
    assert build_plan(loaded, gpus=True, model="/models/m").stages[-1].params.model == "/models/m"  # type: ignore[union-attr]
    assert build_plan(loaded, gpus=True, skip=["serve"]).stages[-1].user_skipped
