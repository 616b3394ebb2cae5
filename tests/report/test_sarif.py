"""SARIF 2.1.0 for code scanning: valid by Microsoft's SARIF validator, a result per stage that
did not pass (errors, deferred ones as notes), and the run's verdict, attempt and image."""

from __future__ import annotations

import json
from pathlib import Path

from imagegate.report import formats, load
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
