"""The built-in serve pipelines on the real vLLM and SGLang images (tests/images/build.py's
REAL_RECIPES), on a host without a GPU.

- every start-up phase pattern (probes/serve_engines.py) matches a line of the installed
  package's own code, so a renamed log message fails here instead of silently losing a phase;
- `vllm-serve`: the assembled `vllm serve` argv is parsed by vLLM's own CLI under its
  CpuPlatform (PASS), a bad flag fails there, and the serve stage is DEFERRED with vLLM's own
  failure kept; the model is the tiny offline one of tests/images/transformers-serve, mounted
  with --model;
- `sglang-serve`: the same for `sglang serve` under SGLang's CPU platform (sglang-cpu), with the
  checks of ServerArgs.resolve_once that read no model; a bad flag fails there too, the
  `python3 -m sglang.launch_server` form is parsed the same way, and a model that makes
  `sglang serve` pick its diffusion server is an ERROR with nothing started.

The SGLang tests are conformance tests (`-m conformance`, scripts/conformance.sh), outside the
blocking suite: their images add 11 GB to a bare machine's set-up."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import imagegate
from tests.real.conftest import RealImages

pytestmark = [pytest.mark.engine, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]

# Reads the phase table, then greps each named package's .py files with each regex.
GREP = r"""
import importlib.util, json, os, re, sys
table = json.loads(sys.argv[1])
out = {}
for engine, phases in table.items():
    for name, (package, rx) in phases.items():
        spec = importlib.util.find_spec(package)
        if spec is None:
            out[engine + "." + name] = "package %s not installed" % package
            continue
        root = os.path.dirname(spec.origin)
        hit = None
        for folder, _, files in os.walk(root):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    with open(path, encoding="utf-8", errors="replace") as fh:
                        if re.search(rx, fh.read()):
                            hit = os.path.relpath(path, root)
                            break
            if hit:
                break
        out[engine + "." + name] = hit
print(json.dumps(out))
"""


def engines() -> dict[str, dict[str, list[str]]]:
    src = (ROOT / "probes" / "serve_engines.py").read_text()
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["ENGINES"]:
            return dict(ast.literal_eval(node.value))
    raise AssertionError("no ENGINES table")


@pytest.fixture(scope="module")
def tiny_model(real: RealImages, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny offline model, copied out of its image (no hub, no download)."""
    dest = tmp_path_factory.mktemp("model")
    cid = subprocess.run(
        ["docker", "create", real["transformers-serve"]], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        subprocess.run(["docker", "cp", f"{cid}:/models/tiny-llama", str(dest)], check=True)
    finally:
        subprocess.run(["docker", "rm", cid], capture_output=True, check=True)
    for p in [dest, *dest.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dest / "tiny-llama"


@pytest.mark.parametrize("name", ["vllm", pytest.param("sglang", marks=pytest.mark.conformance)])
def test_phase_patterns_match_the_installed_code(real: RealImages, name: str) -> None:
    table = {e: p for e, p in engines().items() if e == name}
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", real[name], "python3", "-c", GREP, json.dumps(table)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found and all(found.values()), found


def run(image: str, pipeline: str, out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    r = imagegate(
        "run", image, "-p", pipeline, "--format", "json", "--no-sign", "-o", str(out), *extra, timeout=1800
    )
    assert r.stdout, r.stderr
    pred = json.loads(r.stdout)["predicate"]
    return r.returncode, {s["id"]: s for s in pred["stages"]} | {"verdict": pred["verdict"]}


def stage_stderr(out: Path, stage: str) -> str:
    """The stage's stderr as the evidence folder keeps it."""
    return next(out.glob(f"*/*/stages/*-{stage}/stderr.txt")).read_text()


def test_vllm_serve_parses_on_cpu_and_defers_the_server_with_its_failure(
    real: RealImages, tiny_model: Path, tmp_path: Path
) -> None:
    code, s = run(real["vllm"], "vllm-serve", tmp_path, "--model", str(tiny_model))
    assert (code, s["verdict"]) == (0, "CPU_PASS_SERVE_DEFERRED"), s
    argv = s["serve_argv"]
    assert argv["status"] == "PASS"
    assert argv["detail"] == (
        "vllm serve /tmp/imagegate-model --host 127.0.0.1 --port 8000: parsed under platform vllm-cpu"
    )
    serve = s["serve"]
    assert serve["status"] == "DEFERRED"
    assert "ran for the record: the server exited 1" in serve["detail"]
    assert "RuntimeError: Failed to infer device type" in serve["detail"]
    assert serve["facts"]["stopped"]["left_alive"] == []


def argv_stage_with(builtin: str, tmp_path: Path, *extra: str) -> str:
    """A pipeline of the built-in's serve_argv stage alone, its argv with `extra` added."""
    pipeline = yaml.safe_load((ROOT / "data" / "pipelines" / f"{builtin}.yaml").read_text())
    stage = next(st for st in pipeline["stages"] if st["id"] == "serve_argv")
    stage["with"]["command"] = [*stage["with"]["command"], *extra]
    pipeline["stages"] = [stage]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(pipeline))
    return str(tmp_path / "p.yaml")


@pytest.mark.parametrize("name", ["vllm", pytest.param("sglang", marks=pytest.mark.conformance)])
def test_a_serve_argv_with_a_bad_flag_fails_before_any_gpu(
    real: RealImages, name: str, tmp_path: Path
) -> None:
    code, s = run(real[name], argv_stage_with(f"{name}-serve", tmp_path, "--no-such-flag"), tmp_path / "out")
    assert (code, s["serve_argv"]["status"]) == (1, "FAIL"), s
    assert s["serve_argv"]["detail"].endswith("unrecognized arguments: --no-such-flag"), s["serve_argv"]


@pytest.mark.conformance
def test_sglang_serve_parses_on_cpu_and_defers_the_server_with_its_failure(
    real: RealImages, tiny_model: Path, tmp_path: Path
) -> None:
    code, s = run(real["sglang"], "sglang-serve", tmp_path, "--model", str(tiny_model))
    assert (code, s["verdict"]) == (0, "CPU_PASS_SERVE_DEFERRED"), s
    argv = s["serve_argv"]
    assert argv["status"] == "PASS"
    assert argv["detail"] == (
        "sglang serve --model-path /tmp/imagegate-model --host 127.0.0.1 --port 8000: parsed under platform sglang-cpu"
    )
    err = stage_stderr(tmp_path, "serve_argv")
    assert "platform override sglang-cpu applied" in err
    assert "imagegate: parsed, not started: model=/tmp/imagegate-model platform=CpuSRTPlatform" in err
    assert s["serve"]["facts"]["argv"] == [
        "sglang", "serve", "--model-path", "/tmp/imagegate-model", "--host", "127.0.0.1",
        "--port", str(s["serve"]["facts"]["argv"][-1]),
    ]  # fmt: skip
    assert "RuntimeError: No accelerator" in s["serve"]["detail"], s["serve"]


@pytest.mark.conformance
def test_sglang_checks_that_read_no_model_fail_on_cpu(real: RealImages, tmp_path: Path) -> None:
    """A value argparse takes but SGLang's own resolution rejects, without a model or a GPU."""
    pipeline = argv_stage_with("sglang-serve", tmp_path, "--prefill-decode-interval", "-1")
    code, s = run(real["sglang"], pipeline, tmp_path / "out")
    assert (code, s["serve_argv"]["status"]) == (1, "FAIL"), s
    assert s["serve_argv"]["detail"].endswith(
        "exit 1: ValueError: --prefill-decode-interval must be non-negative."
    ), s["serve_argv"]


@pytest.mark.conformance
@pytest.mark.parametrize(
    ("extra", "status", "detail_end"),
    [
        ([], "PASS", "--port 8000: parsed under platform sglang-cpu"),
        (["--tp-size", "two"], "FAIL", "argument --tp-size/--tensor-parallel-size: invalid int value: 'two'"),
    ],
)
def test_the_python_m_sglang_launch_server_argv_is_parsed_the_same_way(
    real: RealImages, tmp_path: Path, extra: list[str], status: str, detail_end: str
) -> None:
    launch = [
        {"id": "serve_argv", "probe": "serve", "timeout": "10m", "with": {"parse_only": "sglang", "command": [
            "python3", "-m", "sglang.launch_server", "--model-path", "{model}", "--port", "{port}", *extra,
        ]}},
    ]  # fmt: skip
    pipeline = {
        "apiVersion": "imagegate/v1",
        "kind": "Pipeline",
        "name": "launch",
        "version": "1",
        "stages": launch,
    }
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(pipeline))
    _, s = run(real["sglang"], str(tmp_path / "p.yaml"), tmp_path / "out")
    assert s["serve_argv"]["status"] == status, s
    assert s["serve_argv"]["detail"].endswith(detail_end), s["serve_argv"]
    assert s["serve_argv"]["facts"]["how"] == "module sglang.launch_server in-process"


@pytest.mark.conformance
def test_sglang_serve_choosing_its_diffusion_backend_is_not_started_and_not_passed(
    real: RealImages, tmp_path: Path
) -> None:
    """A Diffusers model folder makes `sglang serve` pick its diffusion server, which the parse-only
    check does not cover: ERROR, nothing started."""
    model = tmp_path / "diffusion"
    model.mkdir()
    (model / "model_index.json").write_text('{"_class_name": "FluxPipeline", "_diffusers_version": "0.30.0"}')
    for p in (model, model / "model_index.json"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    code, s = run(real["sglang"], "sglang-serve", tmp_path / "out", "--model", str(model), "--skip", "serve")
    assert (code, s["verdict"], s["serve_argv"]["status"]) == (2, "ERROR", "ERROR"), s
    assert s["serve_argv"]["detail"].endswith(
        "not parsed: backend diffusion was selected, parse_only sglang parses the llm server only;"
        " nothing was started"
    ), s["serve_argv"]
