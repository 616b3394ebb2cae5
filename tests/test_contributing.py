"""CONTRIBUTING.md stays true to the code: every file it names is there, and the names it tells a
contributor to find in them (a class, a table, a function) are in those files. A guide that
sends someone to a file that moved is worse than none."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "CONTRIBUTING.md").read_text()
# What the guide says each file holds, in its own words.
ANCHORS = {
    "src/imagegate/pipeline/probes.py": ["FactRules"],
    "src/imagegate/drivers/interface.py": ["class Driver", "cancel"],
    "src/imagegate/drivers/select.py": ["DriverName", "def make_driver"],
    "src/imagegate/cli/_accept.py": ["class Accepting", "--driver"],
    "src/imagegate/cli/run.py": ["class Placement"],
    "src/imagegate/cli/_checks.py": ["UsageError"],
    "tests/cli/test_options.py": ["MEANINGS"],
    "src/imagegate/domain/statements.py": ["READERS", "def to_json", "def from_json"],
    "src/imagegate/attest/predicates.py": ["verify --type"],
    "src/imagegate/_support/jsontypes.py": ["def obj", "def items"],
    "src/imagegate/usecases/runner/judging.py": ["def judge"],
    "src/imagegate/usecases/runner/concluding.py": ["def conclude"],
    "src/imagegate/domain/evidence.py": ["def write_conclusion"],
}


def _named_paths() -> set[str]:
    """Each path in backticks that names a file or folder of this repository (a NAME placeholder
    is the contributor's own file, not one that exists)."""
    found = set()
    for token in re.findall(r"`([^`\s]+)`", GUIDE):
        if "/" in token and "NAME" not in token and not token.startswith(("-", "imagegate ")):
            found.add(token.rstrip("/"))
    return found


def test_every_file_the_guide_names_is_there() -> None:
    named = _named_paths()
    assert len(named) >= 15, named  # the guide names its files; a parse that finds none proves nothing
    missing = sorted(
        p for p in named if not (ROOT / p).exists() and not (ROOT / "src/imagegate" / p).exists()
    )
    assert missing == []


def test_what_the_guide_says_a_file_holds_is_in_it() -> None:
    absent = [
        f"{path}: {anchor}"
        for path, anchors in ANCHORS.items()
        for anchor in anchors
        if (path not in GUIDE and Path(path).name not in GUIDE) or anchor not in (ROOT / path).read_text()
    ]
    assert absent == []
