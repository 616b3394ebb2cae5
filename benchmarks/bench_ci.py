"""The whole CI job, timed as CI runs it: a fresh clone of this repository's HEAD, then
`CI=true bash .ci/run` in it, quiet or beside `stress-ng --cpu N` (a busy machine), with where the
minutes go (.ci/run's own "ci: PHASE took Ns" lines) and the slowest test files (its JUnit).

Usage: .venv/bin/python benchmarks/bench_ci.py [--stress N] [--record FILE]
The set-up it times is this machine's: cached when the engines, images and tools are here
already (the guide's goal: <= 20 min), bare on a new machine (<= 45 min; benchmarks/bench_setup.py
times a bare set-up's parts beside the caches).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record

ROOT = Path(__file__).resolve().parents[1]
CACHED_GOAL_S = 20 * 60
PHASE = re.compile(r"^ci: (.+) took (\d+)s$", re.M)


def slowest_files(junit: Path, n: int = 12) -> list[tuple[str, float]]:
    """The test files by the seconds their tests took (summed: three workers run side by side)."""
    per: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        per[(case.get("classname") or "").replace(".", "/") + ".py"] += float(case.get("time") or 0)
    return [(f, round(s, 1)) for f, s in per.most_common(n)]


def counts(junit: Path) -> dict[str, int]:
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    bad = sum(1 for c in cases if c.find("failure") is not None or c.find("error") is not None)
    skipped = sum(1 for c in cases if c.find("skipped") is not None)
    return {"tests": len(cases), "failed": bad, "skipped": skipped, "passed": len(cases) - bad - skipped}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stress", type=int, default=0, help="run stress-ng --cpu N beside the job")
    parser.add_argument("--record", type=Path, help="write the record here (JSON)")
    args = parser.parse_args()
    stress = None
    with tempfile.TemporaryDirectory(prefix="bench-ci-") as tmp:
        # mkdtemp's folder is the user's alone: the tests that run the CLI as another user
        # (setpriv) need to read the clone's venv, as in any CI checkout
        Path(tmp).chmod(0o755)
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        if args.stress:
            stress = subprocess.Popen(["stress-ng", "--cpu", str(args.stress), "--quiet"])
        t0 = time.monotonic()
        with open(Path(tmp) / "ci.log", "w") as log:
            rc = subprocess.run(
                ["bash", ".ci/run"],
                cwd=clone,
                env={**os.environ, "CI": "true"},
                stdout=log,
                stderr=subprocess.STDOUT,
            ).returncode
        took = time.monotonic() - t0
        load = [round(x, 2) for x in os.getloadavg()]
        if stress is not None:
            stress.terminate()
            stress.wait(30)
        text = (Path(tmp) / "ci.log").read_text(errors="replace")
        junit = clone / ".cache" / "ci" / "tests.xml"
        results = {
            "exit_code": rc,
            "seconds": round(took, 1),
            "stress_ng_cpu": args.stress,
            "load_average_at_end": load,
            "phases_s": {m.group(1): int(m.group(2)) for m in PHASE.finditer(text)},
            "tests": counts(junit) if junit.is_file() else None,
            "slowest_files_s": slowest_files(junit) if junit.is_file() else None,
            "log_tail": text[-3000:],
        }
    setup = results["phases_s"].get("set-up", 0)  # type: ignore[union-attr]
    goals = [
        record.Goal("the CI job passes", "exit 0", f"exit {rc}", rc == 0),
        record.Goal(
            "the CI job on this machine's caches",
            f"<= {CACHED_GOAL_S // 60} min",
            f"{took / 60:.1f} min (set-up {setup} s){' beside stress-ng --cpu %d' % args.stress if args.stress else ''}",
            took <= CACHED_GOAL_S,
        ),
    ]
    print({k: v for k, v in results.items() if k != "log_tail"})
    if args.record:
        record.write(args.record, "bench_ci", vars(args) | {"record": str(args.record)}, results, goals)
    return record.print_goals(goals)


if __name__ == "__main__":
    sys.exit(main())
