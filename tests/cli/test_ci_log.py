"""What a CI log holds: outside a terminal nothing is cut to 80 columns, the verdict line says
when an option rejected an accepting verdict, `--format json` still says where the evidence went,
a stage's reason is split into problems only between problems, and `report` refuses a folder
that is not an attempt or an image's folder of attempts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import imagegate, overall_deadline_s

# COLUMNS unset, stdout a pipe: what a CI runner gives (rich would assume 80 columns).
CI = {"COLUMNS": ""}
LONG = "the-whole-reason-" + "x" * 140 + "-end"


def _pipeline(tmp_path: Path) -> str:
    path = tmp_path / "p.yaml"
    path.write_text(
        "apiVersion: imagegate/v1\nname: t\nstages:\n"
        f"  - id: long\n    probe: cli\n    with: {{command: [python3, -c, 'raise SystemExit(\"{LONG}\")']}}\n"
        "  - id: hang\n    probe: cli\n    timeout: 5\n"
        "    with: {command: [python3, -c, 'import time; time.sleep(60)']}\n"
    )
    return str(path)


def test_a_ci_log_carries_every_reason_whole(images: dict[str, str], tmp_path: Path) -> None:
    pipeline = _pipeline(tmp_path)
    r = imagegate("run", images["python"], "-p", pipeline, "-o", str(tmp_path / "o"), "--no-sign", env=CI)
    assert r.returncode == 1, r.stdout + r.stderr
    table = r.stdout.split("verdict:")[0]
    row = next(ln for ln in table.splitlines() if " long " in ln)
    assert LONG in row, row  # the table's row itself holds the whole reason
    assert "…" not in table
    # The timed-out command stays one problem: its '; ' is inside the quoted argument.
    assert "  - python3 -c 'import time; time.sleep(60)': timed out after" in r.stdout, r.stdout
    assert "  - time.sleep(60)" not in r.stdout


def test_require_complete_says_so_on_the_verdict_line(images: dict[str, str], tmp_path: Path) -> None:
    r = imagegate(
        "run",
        images["vllm-like"],
        "-p",
        "vllm",
        "-o",
        str(tmp_path),
        "--require-complete",
        "--no-sign",
        env=CI,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "verdict: CPU_PASS_GPU_CLI_DEFERRED → rejected: --require-complete" in r.stdout
    plain = imagegate("run", images["vllm-like"], "-p", "vllm", "-o", str(tmp_path), "--no-sign", env=CI)
    assert plain.returncode == 0
    assert "rejected" not in plain.stdout.split("verdict:")[1].splitlines()[0]


def test_format_json_says_where_the_evidence_went(images: dict[str, str], tmp_path: Path) -> None:
    r = imagegate("run", images["python"], "-o", str(tmp_path), "--format", "json", "--no-sign")
    assert r.returncode == 0, r.stderr
    assert r.json()["predicate"]["verdict"] == "PASS"  # stdout is the statement alone
    attempt = next(p for p in tmp_path.glob("*/*") if p.is_dir())
    assert f"imagegate: evidence: {attempt}" in r.stderr


@pytest.fixture
def attempt(images: dict[str, str], tmp_path: Path) -> Path:
    r = imagegate("run", images["python"], "-o", str(tmp_path / "runs"), "--no-sign")
    assert r.returncode == 0, r.stderr
    return next(p for p in (tmp_path / "runs").glob("*/*") if p.is_dir())


def test_report_refuses_a_folder_that_is_not_an_attempt(attempt: Path, tmp_path: Path) -> None:
    unrelated = tmp_path / "unrelated"
    shutil.copytree(attempt, unrelated / "somewhere" / "copied")  # an attempt two levels below
    shutil.copytree(attempt, unrelated / "renamed")  # one level below, not named as an attempt
    r = imagegate("report", str(unrelated))
    assert r.returncode == 3, r.stdout
    assert "neither an attempt folder (no statement.json) nor an image's folder of attempts" in r.stderr
    assert r.stdout == ""
    # An attempt folder and its image's folder still render.
    for folder in (attempt, attempt.parent):
        ok = imagegate("report", str(folder))
        assert ok.returncode == 0, ok.stderr
        assert "verdict: PASS" in ok.stdout


def test_a_stage_cut_by_the_overall_deadline_shows_the_time_it_ran(
    images: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "apiVersion: imagegate/v1\nname: t\nstages:\n"
        "  - id: hang\n    probe: cli\n    timeout: 600\n"
        "    with: {command: [python3, -c, 'import time; time.sleep(600)']}\n"
    )
    out = tmp_path / "o"
    # Scaled from a run measured now: on a busy machine the stage must still begin, and run for
    # more than a second, before the deadline cuts it.
    limit = overall_deadline_s(images["python"], tmp_path / "measured")
    r = imagegate(
        "run", images["python"], "-p", str(path), "-o", str(out), "--timeout", str(limit), "--no-sign", env=CI
    )
    assert r.returncode == 2, r.stdout + r.stderr
    row = next(ln for ln in r.stdout.splitlines() if " hang " in ln)
    # The controller announced the stage before it ran: its time is how long it really ran.
    assert "0.00s" not in row and "it was running for" in row, row
    shown = float(row.split("s │")[0].split()[-1]) if "s │" in row else None
    assert shown is not None and shown > 1, row


def test_the_audit_table_keeps_every_detail_in_a_log(engine: str, tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    name = "imagegate-test/absent-for-the-audit-log-test:1"
    inventory.write_text(
        f"apiVersion: imagegate/v1\nkind: Inventory\nimages:\n  - {{image: {name}, pipeline: python}}\n"
    )
    r = imagegate("audit", str(inventory), "-o", str(tmp_path / "runs"), env=CI)
    assert r.returncode == 3, r.stdout + r.stderr
    row = next(ln for ln in r.stdout.splitlines() if name in ln)
    assert "…" not in row
    # the whole detail: the message, then its hint, both to the end
    assert "not found in the docker engine, and pulling it failed:" in row
    assert row.rstrip().endswith("your credentials (docker login))"), row


def test_a_runs_layers_stage_shows_its_layers_in_a_ci_log(images: dict[str, str], tmp_path: Path) -> None:
    """`run -p vllm` (its layers stage reads the image from the engine): a CI log gets a line per
    blob read, each whole on one line, where a terminal shows bars: the display reaches the stage."""
    r = imagegate("run", images["vllm-like"], "-p", "vllm", "-o", str(tmp_path), "--no-sign", env=CI)
    assert r.returncode == 0, r.stdout + r.stderr
    # The engine's export is read once, each blob hashed as it passes: a line per blob read.
    lines = [ln for ln in r.stderr.splitlines() if "/layer.tar: hashed, " in ln and " MB in " in ln]
    assert len(lines) >= 2, r.stderr


def test_a_count_of_problems_is_told_apart_from_the_problems(images: dict[str, str], tmp_path: Path) -> None:
    """pip_check's '2 problems: a; b': the count heads the list, never glued to its first item."""
    r = imagegate("run", images["conflict"], "-p", "python", "-o", str(tmp_path), "--no-sign", env=CI)
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("pip_check FAIL:"))
    count = int(lines[head].split(": ")[1].split()[0])
    assert lines[head] == f"pip_check FAIL: {count} problems", lines[head]
    items = lines[head + 1 : head + 1 + count]
    assert all(ln.startswith("  - ") and ("requires" in ln or "has requirement" in ln) for ln in items), items
    assert "  - nixl 1.2.0 requires nixl-cu12, which is not installed." in items
    assert not any("problems" in ln for ln in items)


@pytest.mark.parametrize("colours", [{}, {"FORCE_COLOR": "1"}, {"TTY_COMPATIBLE": "1"}])
def test_progress_lines_come_whole_into_a_log_of_80_columns(
    colours: dict[str, str], images: dict[str, str], tmp_path: Path
) -> None:
    """stderr a pipe at COLUMNS=80, with the colours a CI runner may force: every progress line
    whole on one line (a digest never split), no bar redrawn into the log."""
    import re

    out = tmp_path / "imagegate-runs"
    r = imagegate("run", images["python"], "-o", str(out), "--no-sign", env={"COLUMNS": "80", **colours})
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr
    lines = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", ln) for ln in r.stderr.splitlines()]
    attempt = next(p for p in out.glob("*/*") if p.is_dir())
    assert f"imagegate: attempt {attempt}" in lines, lines
    assert re.search(r"/sha256-[0-9a-f]{64}/", str(attempt))
    assert all(ln.startswith("imagegate: ") for ln in lines), lines
    assert f"evidence: {attempt}" in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", r.stdout)
