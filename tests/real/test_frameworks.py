"""The built-in pipelines on the newest real vLLM and SGLang images (`pip install FRAMEWORK av`
on Debian, from PyPI: tests/images/build.py's REAL_RECIPES, ~10 GB each, cached by recipe).

What a user of each built-in sees on a healthy current image, on a host without a GPU. Older
releases are run by scripts/real-frameworks.py, which keeps the dated record. The SGLang tests
are conformance tests (`-m conformance`, scripts/conformance.sh), outside the blocking suite:
their images add 11 GB to a bare machine's set-up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import imagegate
from tests.real.conftest import RealImages

# The first test may build the images (set-up normally has): ~10 minutes each on 2 cores.
pytestmark = [pytest.mark.engine, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]


def run(image: str, pipeline: str, out: Path, *extra: str) -> tuple[int, dict[str, Any], Path]:
    r = imagegate(
        "run", image, "-p", pipeline, "--format", "json", "--no-sign", "-o", str(out), *extra, timeout=1200
    )
    assert r.stdout, r.stderr
    statement = json.loads(r.stdout)
    (attempt,) = out.glob("*/" + statement["predicate"]["attempt"]["id"])
    return r.returncode, statement["predicate"], attempt


# The layers stage of a 10 GB image costs minutes through the engine; it is proven on the vLLM
# image above, so the SGLang tests (about the server CLI and NIXL) leave it out.
SKIP_LAYERS = ("--skip", "layers")


def stages(predicate: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in predicate["stages"]}


def test_vllm_newest_is_cpu_pass_gpu_cli_deferred_with_the_raw_error_kept(
    real: RealImages, tmp_path: Path
) -> None:
    code, pred, attempt = run(real["vllm"], "vllm", tmp_path)
    s = stages(pred)
    assert (code, pred["verdict"]) == (0, "CPU_PASS_GPU_CLI_DEFERRED"), s
    # The built-in verifies the 10 GB image's layers too (from the engine: it was built here).
    assert s["layers"]["status"] == "PASS" and s["layers"]["detail"].endswith("from engine"), s["layers"]
    assert [s[i]["status"] for i in ("pip_check", "find_spec", "cli_cpu", "av_roundtrip")] == ["PASS"] * 4
    # Without a GPU, vLLM's own parser fails; the run is kept as the deferred stage's evidence.
    assert s["gpu_cli"]["status"] == "DEFERRED"
    assert "RuntimeError: Failed to infer device type" in s["gpu_cli"]["detail"]
    raw = (next(attempt.glob("stages/*-gpu_cli")) / "stderr.txt").read_text()
    assert "RuntimeError: Failed to infer device type" in raw
    version = s["cli_cpu"]["facts"]["version_choice"]["version"]
    assert s["cli_cpu"]["detail"].endswith(f"(platform vllm-cpu) [vllm {version}]")
    # The override really selected CpuPlatform, and the full help came out.
    cpu_err = (next(attempt.glob("stages/*-cli_cpu")) / "stderr.txt").read_text()
    assert "platform override vllm-cpu applied: current_platform=CpuPlatform" in cpu_err
    assert "--tensor-parallel-size" in (next(attempt.glob("stages/*-cli_cpu")) / "stdout.txt").read_text()
    # CI's newest release is one the pipeline says the override was checked against.
    claimed = yaml.safe_load((ROOT / "data" / "pipelines" / "vllm.yaml").read_text())
    cli_cpu = next(st for st in claimed["stages"] if st["id"] == "cli_cpu")
    assert version in cli_cpu["with"]["platform_checked_against"]


@pytest.mark.conformance
def test_sglang_newest_passes_the_sglang_builtins_cpu_stages(real: RealImages, tmp_path: Path) -> None:
    code, pred, _ = run(real["sglang"], "sglang", tmp_path, *SKIP_LAYERS)
    s = stages(pred)
    # No GPU here: the node check (its GPU stage) is deferred, and so is layers (--skip): not run.
    assert (code, pred["verdict"]) == (0, "CPU_PASS_NODE_CHECK_LAYERS_DEFERRED"), s
    assert [s[i]["status"] for i in ("pip_check", "find_spec", "server_cli", "av_roundtrip")] == ["PASS"] * 4
    assert s["server_cli"]["facts"]["argv"] == ["sglang", "serve", "--model-type", "llm", "--help"]


@pytest.mark.conformance
def test_sglang_disagg_rejects_the_standard_image_for_missing_nixl(real: RealImages, tmp_path: Path) -> None:
    code, pred, _ = run(real["sglang"], "sglang-disagg", tmp_path, *SKIP_LAYERS)
    s = stages(pred)
    assert (code, pred["verdict"]) == (1, "FAIL"), s
    assert s["find_spec"]["status"] == "FAIL"
    assert s["find_spec"]["detail"] == (
        "nixl: not found; nixl._api: parent package nixl is not installed; "
        "nixl._bindings: parent package nixl is not installed"
    )
    assert [s[i]["status"] for i in ("pip_check", "server_cli", "av_roundtrip")] == ["PASS"] * 3


@pytest.mark.conformance
def test_sglang_disagg_passes_with_nixl_and_its_cuda_variant(real: RealImages, tmp_path: Path) -> None:
    code, pred, _ = run(real["sglang-nixl"], "sglang-disagg", tmp_path, *SKIP_LAYERS)
    s = stages(pred)
    assert (code, pred["verdict"]) == (0, "CPU_PASS_NODE_CHECK_LAYERS_DEFERRED"), s
    modules = {m["module"]: m for m in s["find_spec"]["facts"]["modules"]}
    # nixl._bindings is the native module of the CUDA variant nixl picked for torch's CUDA major
    # version (this image's torch is built for CUDA 13; both variants are installed).
    assert "/nixl_cu13/_bindings." in modules["nixl._bindings"]["origin"], modules["nixl._bindings"]


@pytest.mark.conformance
def test_sglang_disagg_rejects_nixl_without_the_variant_for_torchs_cuda(
    real: RealImages, tmp_path: Path
) -> None:
    code, pred, _ = run(real["sglang-nixl-cu12-only"], "sglang-disagg", tmp_path, *SKIP_LAYERS)
    s = stages(pred)
    assert (code, pred["verdict"]) == (1, "FAIL"), s
    raised = "importing nixl raised ImportError: detected CUDA 13 but nixl-cu13 is not installed"
    assert s["find_spec"]["detail"] == f"nixl._api: {raised}; nixl._bindings: {raised}"
    assert s["pip_check"]["detail"] == "1 problem: nixl 1.5.1 requires nixl-cu13, which is not installed."
