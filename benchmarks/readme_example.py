#!/usr/bin/env python3
"""The example at the top of README.md, as a record: one real `imagegate run IMAGE -p vllm` on a
real vLLM image, its console output kept verbatim (stdout and stderr as a terminal-less CI log
shows them) with the commit, the tree, the machine's load and the command. README.md copies the
block; tests/test_claims.py checks it is still word for word in the record it names.

Usage: .venv/bin/python benchmarks/readme_example.py [--image imagegate-test/vllm:latest]
(the image: `tests/images/build.py vllm`, vLLM 0.33.0 installed with pip, ~10 GB)
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from record import command

ROOT = Path(__file__).resolve().parents[1]


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="imagegate-test/vllm:latest")
    args = ap.parse_args()
    argv = ["imagegate", "run", args.image, "-p", "vllm", "--no-sign"]
    # what ran: read at the start, so that a commit made meanwhile is not named
    commit = git("rev-parse", "HEAD")
    tree = "dirty" if git("status", "--porcelain", "--", ".", ":(exclude)benchmarks/records") else "clean"
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:  # evidence under ./imagegate-runs, as in a CI job
        done = subprocess.run(
            [str(Path(sys.executable).parent / "imagegate"), *argv[1:]],
            cwd=tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "COLUMNS": ""},
        )
    now = dt.datetime.now(dt.timezone.utc)
    path = ROOT / "benchmarks" / "records" / f"{now:%Y-%m-%d-%H%M}-readme-example.md"
    path.write_text(
        f"# The README's example run, {now:%Y-%m-%d %H:%M} UTC\n\n"
        f"Command: `{command()}`\n\n"
        f"Commit: {commit} (tree {tree}); "
        f"{os.cpu_count()} cores, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} before the run; "
        f"exit {done.returncode}\n\n"
        f"```console\n$ {' '.join(argv)}\n{done.stdout}```\n"
    )
    print(done.stdout, end="")
    print(f"record: {path.relative_to(ROOT)}", file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
