"""Attempt folders to render: one with every stage status and a layer table (written with the
real evidence store and statement builder), and real runs through the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from imagegate.attest.statement import build_statement
from imagegate.domain.evidence import Attempt
from imagegate.domain.results import ImageFacts, RunRecord, StageResult, Status, verdict
from tests.helpers import imagegate

CONFIG = "sha256:" + "ab" * 32

LAYERS = [
    {
        "index": 0,
        "status": "OK",
        "compression": "gzip",
        "expected_digest": "sha256:" + "11" * 32,
        "actual_digest": "sha256:" + "11" * 32,
        "expected_size": 100,
        "actual_size": 100,
        "expected_diff_id": "sha256:" + "22" * 32,
        "actual_diff_id": "sha256:" + "22" * 32,
        "uncompressed_size": 300,
        "detail": "",
    },
    {
        "index": 1,
        "status": "DIFFID_MISMATCH",
        "compression": "zstd",
        "expected_digest": "sha256:" + "33" * 32,
        "actual_digest": "sha256:" + "33" * 32,
        "expected_size": 200,
        "actual_size": 200,
        "expected_diff_id": "sha256:" + "44" * 32,
        "actual_diff_id": "sha256:" + "55" * 32,
        "uncompressed_size": 900,
        "detail": "decompressed content differs from the config's diffID",
    },
]

# (id, probe, side, status, detail, stdout, stderr)
STAGES = [
    (
        "pip_check",
        "pip_check",
        "inside",
        Status.FAIL,
        "2 problems: a 1.0 requires b; c <3> & d|e",
        "pip says\x1b[31m red\x00\n",
        "",
    ),
    ("find_spec", "find_spec", "inside", Status.PASS, "found vllm (0.11.0)", "", ""),
    (
        "gpu_cli",
        "cli",
        "inside",
        Status.DEFERRED,
        "requires gpu, not present here; ran for the record: exit 1",
        "",
        "RuntimeError: Failed to infer device type\n",
    ),
    ("av_roundtrip", "av_roundtrip", "inside", Status.ERROR, "timed out after 120 s", "", "Killed\n"),
    ("sbom", "find_spec", "inside", Status.SKIPPED, "needs pip_check is FAIL", None, None),
    ("layers", "layers", "outside", Status.FAIL, "1 of 2 layers failed", None, None),
]


def make_attempt(out: Path, stages: list[tuple[object, ...]] = STAGES) -> Path:
    image = ImageFacts("example/vllm:0.11", CONFIG, None, (), "linux/amd64", "example/vllm")
    attempt = Attempt(out, image)
    attempt.write("plan.json", "{}\n")
    attempt.write("controller.stdout.jsonl", "")
    results = []
    for n, (sid, probe, side, status, detail, stdout, stderr) in enumerate(stages, 1):
        folder = f"stages/{n:02d}-{sid}"
        # As the layers stage stores it: the count in its data, the table in its layers.json.
        data = {"layers": len(LAYERS)} if probe == "layers" else {}
        files = []
        if probe == "layers":
            files.append(
                attempt.write_json(f"{folder}/layers.json", {"source": "docker-daemon", "layers": LAYERS})
            )
        if stdout is not None:
            files.append(attempt.write(f"{folder}/stdout.txt", str(stdout)))
            files.append(attempt.write(f"{folder}/stderr.txt", str(stderr)))
        if status is not Status.SKIPPED:
            files.append(
                attempt.write_json(
                    f"{folder}/result.json",
                    {"id": sid, "status": status.value, "detail": detail, "data": data},  # type: ignore[union-attr]
                )
            )
        results.append(StageResult(str(sid), str(probe), side, status, str(detail), 0.25 * n, data, files))  # type: ignore[arg-type]
    env = {"driver": "docker", "engine": "docker", "python": "3.11.2", "gpu": {"present": False}}
    attempt.write_json("run.json", {"environment": env, "bundle_sha256": "cd" * 32, "run": {"exit_code": 0}})
    record = RunRecord(
        attempt_id=attempt.id,
        attempt_dir=str(attempt.dir),
        pipeline={"name": "vllm", "version": "1", "sha256": "ef" * 32, "source": "builtin:vllm"},
        plan={},
        image=image,
        environment=env,
        stages=results,
        started_at="2026-11-29T16:06:43.677Z",
        finished_at="2026-11-29T16:06:46.795Z",
        verdict=verdict(results),
        imagegate_version="0.1.0",
        bundle_sha256="cd" * 32,
    )
    attempt.write(
        "statement.json", json.dumps(build_statement(record).to_json(), indent=2, sort_keys=True) + "\n"
    )
    return attempt.dir


@pytest.fixture
def mixed_attempt(tmp_path: Path) -> Path:
    return make_attempt(tmp_path / "runs")


@pytest.fixture
def here_run(tmp_path: Path) -> Path:
    """A real run in this environment (no engine), every report format written at once."""
    r = imagegate(
        "run", "--here", "--python", sys.executable, "-p", "python", "-m", "json", "-o", "runs",
        "--report", "junit=reports/junit.xml", "--report", "json=reports/statement.json",
        "--report", "markdown=reports/summary.md", "--report", "html=reports/report.html",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return tmp_path
