"""SARIF 2.1.0 for code scanning: valid by Microsoft's SARIF validator, a result per stage that
did not pass (errors, deferred ones as notes), and the run's verdict, attempt and image."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from imagegate.report import formats, load
from tests.helpers import imagegate
from tests.report.sarif_check import problems


def test_every_stage_that_did_not_pass_is_a_result(mixed_attempt: Path, tmp_path: Path) -> None:
    text = formats.render(load.load_attempt(mixed_attempt), "sarif")
    assert problems(text, tmp_path) == []
    (run,) = json.loads(text)["runs"]
    assert run["tool"]["driver"]["name"] == "imagegate"
    by_stage = {r["properties"]["stage"]: r for r in run["results"]}
    assert sorted(by_stage) == ["av_roundtrip", "gpu_cli", "layers", "pip_check"]  # not the passed or skipped
    assert (by_stage["pip_check"]["level"], by_stage["av_roundtrip"]["level"]) == ("error", "error")
    assert by_stage["gpu_cli"]["level"] == "note"
    assert by_stage["layers"]["message"]["text"].startswith("LAYERS_FAIL: 1 of 2 layers failed")
    assert run["properties"]["verdict"] == "FAIL"
    assert run["properties"]["image"] == "example/vllm:0.11"


def test_a_broken_report_is_refused_by_the_validator(tmp_path: Path) -> None:
    # The validator can fail: `runs` of the wrong type.
    assert problems(json.dumps({"version": "2.1.0", "runs": "x"}), tmp_path)


def _locations(text: str) -> list[dict[str, Any]]:
    """Each result's first physical location, checked as code scanning needs it: a path relative
    to the repository's root (%SRCROOT%) and a line."""
    (run,) = json.loads(text)["runs"]
    assert run["results"]
    found = []
    for result in run["results"]:
        physical = result["locations"][0]["physicalLocation"]
        uri = physical["artifactLocation"]["uri"]
        assert physical["artifactLocation"]["uriBaseId"] == "%SRCROOT%"
        assert uri and not uri.startswith("/") and ":" not in uri and ".." not in uri.split("/"), uri
        assert physical["region"]["startLine"] >= 1
        found.append(physical)
    return found


def test_every_result_points_at_a_file_of_the_repository(
    mixed_attempt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A built-in pipeline has no file: each result is at the attempt's statement.json, relative
    to where the report is written from (the repository's root in CI)."""
    monkeypatch.chdir(mixed_attempt.parents[2])
    text = formats.render(load.load_attempt(mixed_attempt), "sarif")
    assert problems(text, tmp_path / "check") == []
    statement = (mixed_attempt / "statement.json").relative_to(mixed_attempt.parents[2]).as_posix()
    assert {p["artifactLocation"]["uri"] for p in _locations(text)} == {statement}


def test_a_pipeline_file_puts_each_result_at_its_stage(
    mixed_attempt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ci").mkdir()
    pipeline = tmp_path / "ci" / "gate.yaml"
    stages = ["pip_check", "gpu_cli", "av_roundtrip", "sbom", "layers"]
    pipeline.write_text("apiVersion: imagegate/v1\nname: gate\nstages:\n" + "".join(
        f"  - id: {s}\n    probe: cli\n" for s in stages
    ))  # fmt: skip
    monkeypatch.chdir(tmp_path)
    record = load.load_attempt(mixed_attempt)
    record.pipeline = {**record.pipeline, "source": str(pipeline)}  # as `run -p ci/gate.yaml` names it
    text = formats.render(record, "sarif")
    assert problems(text, tmp_path / "check") == []
    (run,) = json.loads(text)["runs"]
    for result, physical in zip(run["results"], _locations(text), strict=True):
        assert physical["artifactLocation"]["uri"] == "ci/gate.yaml"
        assert physical["region"]["startLine"] == 4 + 2 * stages.index(result["properties"]["stage"])


def test_report_points_every_result_at_the_file_named(mixed_attempt: Path, tmp_path: Path) -> None:
    done = imagegate("report", str(mixed_attempt), "-f", "sarif", "--sarif-location", "docker/Dockerfile")
    assert done.returncode == 0, done.stderr
    assert {p["artifactLocation"]["uri"] for p in _locations(done.stdout)} == {"docker/Dockerfile"}
    refused = imagegate("report", str(mixed_attempt), "-f", "json", "--sarif-location", "Dockerfile")
    assert refused.returncode == 3 and "--sarif-location is for --format sarif" in refused.stderr
