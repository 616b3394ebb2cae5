#!/usr/bin/env python3
"""How long imagegate takes to answer what only prints (`--version`, `--help`, a command's
`--help`, a shell completion request), against importing typer and rich alone: the least a typer
CLI pays before it can print anything.

imagegate's modules are compiled to bytecode first, as an installed package has them (pip compiles
a wheel's on install): with PYTHONDONTWRITEBYTECODE set, an editable install would otherwise compile
every module it imports on every call, a cost no user pays and typer and rich (compiled) do not.

Each round runs every case once, one after another in the same order, so that a change in the
machine's load falls on all of them alike (interleaved); the medians over the rounds are compared.

Usage: .venv/bin/python benchmarks/bench_startup.py [--rounds 9] [--record FILE]
"""

from __future__ import annotations

import argparse
import compileall
import datetime as dt
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from record import Goal, print_goals, write

ROOT = Path(__file__).resolve().parents[1]
GOAL_RATIO = 1.5  # each case may take this many times the import of typer and rich (medians)
BASELINE = "import typer, rich"
# case name -> (the console script's arguments, extra environment)
CASES: dict[str, tuple[list[str], dict[str, str]]] = {
    "--version": (["--version"], {}),
    "--help": (["--help"], {}),
    "run --help": (["run", "--help"], {}),
    "verify --help": (["verify", "--help"], {}),
    "complete --help": (["complete", "--help"], {}),
    # bash asking for the commands after `imagegate `: every command module is loaded for it
    "completion": (
        [],
        {"_IMAGEGATE_COMPLETE": "complete_bash", "COMP_WORDS": "imagegate ", "COMP_CWORD": "1"},
    ),
}


def timed(argv: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, env=dict(os.environ, **env), cwd=ROOT)
    took = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"{argv} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return took


def compile_package() -> str:
    """imagegate's bytecode written beside its sources; the folder it compiled."""
    spec = importlib.util.find_spec("imagegate")
    assert spec is not None and spec.submodule_search_locations, "imagegate is not installed here"
    folder = spec.submodule_search_locations[0]
    if not compileall.compile_dir(folder, quiet=1):
        raise SystemExit(f"compiling {folder} failed")
    return folder


def measure(rounds: int) -> dict[str, list[float]]:
    imagegate = str(Path(sys.executable).parent / "imagegate")
    runs: dict[str, list[float]] = {"baseline": [], **{name: [] for name in CASES}}
    for _ in range(rounds):
        runs["baseline"].append(timed([sys.executable, "-c", BASELINE], {}))
        for name, (args, env) in CASES.items():
            runs[name].append(timed([imagegate, *args], env))
    return runs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9, help="Rounds, each case once a round (at least 7).")
    ap.add_argument(
        "--record",
        type=Path,
        default=ROOT
        / "benchmarks"
        / "records"
        / f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d-%H%M}-bench_startup.json",
    )
    args = ap.parse_args()
    if args.rounds < 7:
        ap.error("--rounds: at least 7, for a median that one slow round does not move")
    compile_package()
    runs = measure(args.rounds)
    medians = {name: round(statistics.median(times), 4) for name, times in runs.items()}
    base = medians["baseline"]
    print(f"baseline `python -c '{BASELINE}'`: {base:.3f} s (median of {args.rounds})")
    goals = []
    for name in CASES:
        ratio = medians[name] / base
        print(f"  imagegate {name:<16} {medians[name]:.3f} s  {ratio:.2f}x")
        goals.append(
            Goal(f"imagegate {name}", f"<= {GOAL_RATIO}x the baseline", f"{ratio:.2f}x", ratio <= GOAL_RATIO)
        )
    results = {
        "baseline": f"python -c '{BASELINE}'",
        "bytecode": "imagegate's compiled before timing, as installed",
        "median_s": medians,
        "ratio_to_baseline": {name: round(medians[name] / base, 2) for name in CASES},
        "runs_s": {name: [round(t, 4) for t in times] for name, times in runs.items()},
    }
    write(args.record, "bench_startup", vars(args) | {"record": str(args.record)}, results, goals)
    return print_goals(goals)


if __name__ == "__main__":
    sys.exit(main())
