#!/usr/bin/env python3
"""The skip list at the end of a CI log: every skipped test of the JUnit files given, with its
reason, checked against the skips README.md allows (its list between the `allowed-skips` marks).
A skip the README does not allow fails the job: a test that silently stops running is a claim
that silently stops being backed.

Usage: ci-skips.py JUNIT.xml ...    exit 0: only allowed skips; 1: another skip; 3: bad input
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A test (`FILE::NAME`, every parameter of it) or every test of a file (`FILE`).
ALLOWED = re.compile(r"^- `(tests/[^`]+\.py(?:::[^`]+)?)`", re.M)


def allowed(readme: str) -> list[str]:
    """The node ids (without parameters: all of them) and files of the README's allowed-skips list."""
    m = re.search(r"<!-- allowed-skips:begin -->(.*?)<!-- allowed-skips:end -->", readme, re.S)
    return ALLOWED.findall(m.group(1)) if m else []


def skips(junit: Path) -> list[tuple[str, str]]:
    """(node id, reason) of each skipped test case."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        skipped = case.find("skipped")
        if skipped is None:
            continue
        path = (case.get("classname") or "").replace(".", "/") + ".py"
        reason = (skipped.get("message") or "").removeprefix("Skipped: ")
        out.append((f"{path}::{case.get('name')}", reason))
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print("ci-skips: no JUnit file given; pass pytest's --junitxml files", file=sys.stderr)
        return 3
    ok = allowed((ROOT / "README.md").read_text())
    if not ok:
        print("ci-skips: README.md has no allowed-skips list; restore its marks", file=sys.stderr)
        return 3
    missing = [f for f in argv if not Path(f).is_file()]
    if missing:
        print(f"ci-skips: {missing[0]} is missing: that test run did not finish", file=sys.stderr)
        return 1
    found = [s for f in argv for s in skips(Path(f))]
    bad = 0
    print(f"\nci: {len(found)} skipped (README.md, 'Two commands', lists the skips allowed):")
    for node, reason in found:
        known = any(node == a or node.startswith((a + "[", a + "::")) for a in ok)
        bad += not known
        print(f"  {'allowed' if known else 'NOT ALLOWED'}  {node}: {reason}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
