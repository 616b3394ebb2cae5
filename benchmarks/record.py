"""A benchmark's result as a dated record (JSON): what ran, on what machine, what it measured,
and each stated goal with PASS or FAIL."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass
class Goal:
    name: str  # what is compared, in words
    target: str  # the goal as stated
    measured: str  # what this run measured
    ok: bool | None  # None: not measured in this run (the reason is in `measured`)

    @property
    def verdict(self) -> str:
        return "NOT RUN" if self.ok is None else "PASS" if self.ok else "FAIL"


def print_goals(goals: list[Goal]) -> int:
    """Prints each goal with PASS/FAIL; the exit code: 1 if any goal was missed."""
    print("\ngoals:")
    for g in goals:
        print(f"  {g.verdict:<8} {g.name}: {g.measured} (goal {g.target})")
    return 1 if any(g.ok is False for g in goals) else 0


def command() -> str:
    """The command line that made the record, as typed from the repository's root."""
    script = Path(sys.argv[0]).resolve()
    root = Path(__file__).resolve().parents[1]
    shown = script.relative_to(root) if script.is_relative_to(root) else script.name
    return " ".join(shlex.quote(a) for a in [".venv/bin/python", str(shown), *sys.argv[1:]])


def _git_state() -> tuple[str, str]:
    """HEAD and the changes to it (records written meanwhile, by this or another benchmark, are no
    change to what ran)."""
    if os.environ.get("COMMIT"):  # a copy of the tree with no git (a GPU host): the caller names it
        return os.environ["COMMIT"], ""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", ":(exclude)benchmarks/records"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "", "no git: the tree's state is unknown"
    return commit, changed


# Read when the benchmark starts (it imports this module first): a long run must not name a
# commit made while it ran. The load, by contrast, is read when the record is written.
_AT_START = _git_state()


def write(path: Path, benchmark: str, args: dict[str, Any], results: Any, goals: list[Goal]) -> None:
    commit, changed = _AT_START
    record = {
        "benchmark": benchmark,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit or None,
        "uncommitted_changes": bool(changed),
        "tree": "dirty" if changed else "clean",
        "command": command(),
        "machine": {
            "cores": os.cpu_count(),
            # a loaded machine makes every timing longer: the 1/5/15-minute load when recorded
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "arguments": args,
        "results": results,
        "goals": [{**asdict(g), "verdict": g.verdict} for g in goals],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"record: {path}")
