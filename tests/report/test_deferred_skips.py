"""A stage SKIPPED because a stage it needs was DEFERRED never ran, though the verdict token
names only the deferred stage: the verdict line and every report say which checks that held
back. A real run in the real engine; the token itself is unchanged."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from imagegate.report.github import escape_property
from tests.helpers import imagegate

PIPELINE = """\
apiVersion: imagegate/v1
name: gpu-chain
stages:
  - id: deps
    probe: pip_check
  - id: gpu_cli
    probe: cli
    requires: [gpu]
    with:
      module: json.tool
      args: [--help]
  - id: gpu_smoke
    probe: find_spec
    needs: [gpu_cli]
    with:
      modules: [json]
  - id: gpu_bench
    probe: find_spec
    needs: [gpu_smoke, deps]
    with:
      modules: [json]
  - id: cpu_after
    probe: find_spec
    needs: [deps]
    with:
      modules: [json]
"""

NOTE = "skipped because gpu_cli was deferred: gpu_smoke, gpu_bench"


def test_verdict_line_and_reports_name_what_deferral_held_back(
    images: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "p.yaml").write_text(PIPELINE)
    r = imagegate(
        "run", images["python"], "-p", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-sign",
        "--report", f"markdown={tmp_path / 'r.md'}", "--report", f"junit={tmp_path / 'r.xml'}",
        "--report", f"html={tmp_path / 'r.html'}", "--report", f"json={tmp_path / 'r.json'}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"verdict: CPU_PASS_GPU_CLI_DEFERRED ({NOTE})\n" in r.stdout
    # The token is what it was: the signed statement and the exit code do not change.
    assert (
        json.loads((tmp_path / "r.json").read_text())["predicate"]["verdict"] == "CPU_PASS_GPU_CLI_DEFERRED"
    )
    assert f"**Not run:** {NOTE}" in (tmp_path / "r.md").read_text()
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    assert suite is not None
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["verdict"] == "CPU_PASS_GPU_CLI_DEFERRED" and props["not_run"] == NOTE
    assert f"verdict: CPU_PASS_GPU_CLI_DEFERRED ({NOTE})" in (suite.findtext("system-out") or "")
    assert f'<p id="not-run"><strong>Not run:</strong> {NOTE}</p>' in (tmp_path / "r.html").read_text()
    # Made again from the evidence, the same words.
    (attempt,) = [p.parent for p in (tmp_path / "out").glob("*/*/statement.json")]
    again = imagegate("report", str(attempt), "--format", "markdown")
    assert again.returncode == 0 and f"**Not run:** {NOTE}" in again.stdout, again.stderr


def test_no_note_when_nothing_was_held_back(images: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(PIPELINE.split("  - id: gpu_smoke")[0])
    r = imagegate(
        "run", images["python"], "-p", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-sign"
    )
    assert r.returncode == 0, r.stderr
    assert "verdict: CPU_PASS_GPU_CLI_DEFERRED\n" in r.stdout and "skipped because" not in r.stdout


def test_github_actions_get_a_notice_for_each_check_held_back(images: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(PIPELINE)
    summary = tmp_path / "summary.md"
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    r = imagegate(
        "run", images["python"], "-p", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "out"), "--no-sign", env=env
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    notices = [line for line in r.stderr.splitlines() if line.startswith("::notice ")]
    title = escape_property(f"imagegate GPU_SMOKE_SKIPPED ({images['python']})")
    assert f"::notice title={title}::never ran: skipped because gpu_cli was deferred" in notices
    assert any("GPU_BENCH_SKIPPED" in n for n in notices)
    assert f"**Not run:** {NOTE}" in summary.read_text()
