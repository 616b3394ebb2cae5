"""A built-in pipeline names only framework versions that a dated record of a real run holds
(benchmarks/records/real-frameworks-*.json, written by scripts/real-frameworks.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.real.inputs import inputs

ROOT = Path(__file__).resolve().parents[2]
VERSION = re.compile(r"(?<![\w.])(\d+\.\d+\.\d+(?:\.post\d+)?)(?!\w|\.\d)")


def runs() -> list[dict[str, Any]]:
    """Every recorded run, oldest first: framework, version, pipeline, verdict, stages, the
    commit and the digests of the files it ran (inputs_sha256, from 2026-12-01)."""
    out = []
    for path in sorted((ROOT / "benchmarks" / "records").glob("real-frameworks-*.json")):
        for entry in json.loads(path.read_text())["entries"]:
            for run in entry["runs"]:
                out.append(
                    {"framework": entry["framework"], "version": entry["version"], "target": entry["target"],
                     "commit": entry["imagegate_commit"], "record": path.name,
                     "recorded": entry.get("recorded", ""), **run}
                )  # fmt: skip
    return sorted(out, key=lambda r: str(r["recorded"]))  # oldest first (stable: file order)


def claimed() -> set[tuple[str, str, str]]:
    """(framework, version, pipeline) of every version claim: vllm's cli_cpu override list, and
    each version a built-in pipeline's comments and descriptions name (see below)."""
    out = set()
    doc = yaml.safe_load((ROOT / "data" / "pipelines" / "vllm.yaml").read_text())
    for v in next(s for s in doc["stages"] if s["id"] == "cli_cpu")["with"]["platform_checked_against"]:
        out.add(("vllm", v, "vllm"))
    for framework in ("vllm", "sglang"):
        for path in sorted((ROOT / "data" / "pipelines").glob(f"{framework}*.yaml")):
            for v in VERSION.findall("\n".join(_claim_lines(path))):
                out.add((framework, v, path.stem))
    return out


def _claim_lines(path: Path) -> list[str]:
    return [
        line
        for line in path.read_text().splitlines()
        if not line.strip().lstrip("- ").startswith(("when:", "note:"))
    ]


def stale(framework: str, version: str, pipeline: str, verdict: str | None = None) -> str | None:
    """Why the newest recorded run of VERSION under PIPELINE does not back a claim today: none, or
    a file it ran (the pipeline, a probe, an outside stage) changed since, or the tree it ran from
    held uncommitted changes, or (given VERDICT) it ended otherwise. None when it holds."""
    found = [
        r for r in runs() if (r["framework"], r["version"], r["pipeline"]) == (framework, version, pipeline)
    ]
    if not found:
        return f"no recorded run of {framework} {version} with -p {pipeline}"
    last = found[-1]
    where = f"{last['record']} ({last['target']}, commit {last['commit']})"
    if verdict and last.get("verdict") != verdict:
        return f"{where} ended {last.get('verdict')}, not {verdict}"
    if "+changes" in last["commit"]:
        return f"{where} ran with uncommitted changes"
    if "inputs_sha256" not in last:
        return f"{where} names no digests of what it ran: re-run scripts/real-frameworks.py {last['target']}"
    now = inputs(pipeline)
    changed = sorted(
        f for f in now.keys() | last["inputs_sha256"].keys() if now.get(f) != last["inputs_sha256"].get(f)
    )
    if changed:
        return f"{where}: changed since: {', '.join(changed)}; re-run scripts/real-frameworks.py {last['target']}"
    return None


def test_every_claimed_version_ran_with_the_pipeline_and_probes_as_they_are_now() -> None:
    problems = [why for claim in sorted(claimed()) if (why := stale(*claim))]
    assert not problems, "\n".join(problems)


def test_every_vllm_version_the_override_claims_was_run_and_passed_under_it() -> None:
    doc = yaml.safe_load((ROOT / "data" / "pipelines" / "vllm.yaml").read_text())
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
        for path in sorted((ROOT / "data" / "pipelines").glob(f"{framework}*.yaml")):
            named = set(VERSION.findall("\n".join(_claim_lines(path))))
            assert named <= recorded[framework], (path.name, sorted(named - recorded[framework]))
