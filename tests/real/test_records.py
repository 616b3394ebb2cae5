"""A built-in pipeline names only framework versions that a dated record of a real run holds
(benchmarks/records/real-frameworks-*.json, written by scripts/real-frameworks.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
VERSION = re.compile(r"(?<![\w.])(\d+\.\d+\.\d+(?:\.post\d+)?)(?!\w|\.\d)")


def runs() -> list[dict[str, Any]]:
    """Every recorded run: framework, version, pipeline, verdict, stages."""
    out = []
    for path in sorted((ROOT / "benchmarks" / "records").glob("real-frameworks-*.json")):
        for entry in json.loads(path.read_text())["entries"]:
            for run in entry["runs"]:
                out.append({"framework": entry["framework"], "version": entry["version"], **run})
    return out


def test_every_vllm_version_the_override_claims_was_run_and_passed_under_it() -> None:
    doc = yaml.safe_load((ROOT / "pipelines" / "vllm.yaml").read_text())
    claimed = next(s for s in doc["stages"] if s["id"] == "cli_cpu")["with"]["platform_checked_against"]
    passed = {
        r["version"]
        for r in runs()
        if r["framework"] == "vllm"
        and r["pipeline"] == "vllm"
        and (r["verdict"], r["exit_code"]) == ("CPU_PASS_GPU_CLI_DEFERRED", 0)
        and {s["id"]: s["status"] for s in r["stages"]}["cli_cpu"] == "PASS"
    }
    assert claimed and set(claimed) <= passed, sorted(set(claimed) - passed)


def test_pipelines_name_only_recorded_versions() -> None:
    """Comments, descriptions and claims name only versions that ran; an args_by_version case's
    `when` and `note` say where a case starts, which is no claim of a run."""
    recorded: dict[str, set[str]] = {}
    for r in runs():
        recorded.setdefault(r["framework"], set()).add(r["version"])
    for framework in ("vllm", "sglang"):
        for path in sorted((ROOT / "pipelines").glob(f"{framework}*.yaml")):
            claims = [
                line
                for line in path.read_text().splitlines()
                if not line.strip().lstrip("- ").startswith(("when:", "note:"))
            ]
            named = set(VERSION.findall("\n".join(claims)))
            assert named <= recorded[framework], (path.name, sorted(named - recorded[framework]))
