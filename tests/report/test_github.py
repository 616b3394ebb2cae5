"""GitHub Actions: the step summary is appended to GITHUB_STEP_SUMMARY, the stages that did not
pass become `::error` annotations on stderr, and stdout is left alone."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

from imagegate.report import formats, github, load, markdown
from tests.helpers import imagegate


def test_summary_and_annotations_in_a_real_run(tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    pipe = tmp_path / "p.yaml"
    pipe.write_text(
        "apiVersion: imagegate/v1\nkind: Pipeline\nname: broken\nversion: '1'\n"
        "stages:\n  - id: find_spec\n    probe: find_spec\n    with: {modules: [json, no_such_module_xyz]}\n"
    )
    r = imagegate(
        "run",
        "--here",
        "--python",
        sys.executable,
        "-p",
        str(pipe),
        "-o",
        "runs",
        "--format",
        "json",
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 1, r.stderr
    assert "::" not in r.stdout  # stdout is the statement alone
    errors = [line for line in r.stderr.splitlines() if line.startswith("::error ")]
    assert len(errors) == 1
    assert errors[0].startswith("::error title=imagegate FIND_SPEC_FAIL (local)::")
    assert "no_such_module_xyz" in errors[0]
    text = summary.read_text()
    assert text.startswith("earlier step\n")  # appended, never overwritten
    assert "## ❌ imagegate: FAIL: `local`" in text
    assert "| find_spec | ❌ FAIL | `FIND_SPEC_FAIL` |" in text


def test_nothing_outside_github_actions(mixed_attempt: Path) -> None:
    err = io.StringIO()
    github.publish(load.load_attempt(mixed_attempt), err, env={})
    assert err.getvalue() == ""


def test_annotations_escape_and_levels(mixed_attempt: Path) -> None:
    lines = github.annotation_lines(load.load_attempt(mixed_attempt))
    kinds = [line.split(" ", 1)[0] for line in lines]
    assert kinds == ["::error", "::notice", "::error", "::error"]  # FAIL, DEFERRED, ERROR, FAIL
    first = lines[0]
    # Properties escape ':' and ','; the message keeps them but escapes newlines.
    assert first.startswith("::error title=imagegate PIP_CHECK_FAIL (example/vllm%3A0.11)::")
    assert "%0A" in first and "\n" not in first


def test_markdown_table_cells_cannot_break_the_table(mixed_attempt: Path) -> None:
    md = markdown.render(load.load_attempt(mixed_attempt))
    row = next(line for line in md.splitlines() if line.startswith("| pip_check |"))
    assert row.count(" | ") == 4  # 5 cells: the '|' in the detail is escaped
    assert "c &lt;3&gt; &amp; d\\|e" in row
    assert "### Reasons" in md and "- **gpu_cli** DEFERRED" in md


def test_markdown_report_file_equals_rerender(here_run: Path) -> None:
    attempt = next((here_run / "runs").glob("*/*/"))
    r = imagegate("report", str(attempt.relative_to(here_run)), "-f", "markdown", cwd=here_run)
    assert r.returncode == 0, r.stderr
    # The same report, and under its heading what vouches for it (nothing was checked: no --key).
    banner = "> ⚠️ **Attestation:** signed; signature not checked — pass --key PUB to check it\n\n"
    assert banner in r.stdout
    # The run's own report says its signature was checked, right after signing.
    written = (here_run / "reports/summary.md").read_text()
    checked = re.search(
        r"> 🔏 \*\*Attestation:\*\* signature verified with key sha256:[0-9a-f]{64}\n\n", written
    )
    assert checked, written
    assert r.stdout.replace(banner, checked.group(0), 1) == written
    statement = (here_run / "reports/statement.json").read_text()
    r = imagegate("report", str(attempt.relative_to(here_run)), "-f", "json", cwd=here_run)
    assert json.loads(r.stdout) == json.loads(statement)
    assert formats.FORMATS.keys() >= {"json", "junit", "markdown", "html"}
