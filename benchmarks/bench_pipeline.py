#!/usr/bin/env python3
"""The whole built-in pipeline on a real-size image: `imagegate run IMAGE -p vllm` (in-image
stages in parallel containers, the layers stage beside them) against its own slowest stage, and
against the same checks by hand: the probes in one `docker run` plus `docker save IMAGE |
sha256sum`, one after the other as a script would. Runner peak RSS from a launcher (ru_maxrss of
the child). Goals: whole run <= 1.3x its slowest stage; peak RSS <= 100 MB.

Usage: benchmarks/bench_pipeline.py [--image imagegate-test/vllm:latest] [--record F]
(the image: `tests/images/build.py vllm`, a real vLLM release installed with pip, ~10 GB).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_run_overhead import BY_HAND
from record import Goal, print_goals, write

GOAL_OVER_SLOWEST = 1.3
GOAL_RSS_MB = 100

# ru_maxrss of the child alone: Linux carries ru_maxrss over fork+exec from a large parent.
LAUNCHER = (
    "import os, subprocess, sys, time\n"
    "t = time.perf_counter()\n"
    "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)\n"
    "out = p.stdout.read()\n"
    "_, status, usage = os.wait4(p.pid, 0)\n"
    "sys.stdout.write('%d %d %.3f\\n' % (os.waitstatus_to_exitcode(status), usage.ru_maxrss, time.perf_counter() - t))\n"
    "sys.stdout.write(out.decode())\n"
)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="imagegate-test/vllm:latest")
    ap.add_argument("--pipeline", default="vllm")
    ap.add_argument("--record", type=Path, default=None)
    args = ap.parse_args()
    imagegate = str(Path(sys.executable).parent / "imagegate")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [imagegate, "run", args.image, "-p", args.pipeline, "-o", tmp, "--no-sign", "--format", "json"]
        head, _, body = subprocess.run(
            [sys.executable, "-c", LAUNCHER, *cmd], capture_output=True, text=True, check=True
        ).stdout.partition("\n")
    code, rss_kib, wall = head.split()
    statement = json.loads(body)["predicate"]
    stages = {s["id"]: s["durationSeconds"] for s in statement["stages"]}
    slowest_id = max(stages, key=stages.__getitem__)
    wall_s, slowest = float(wall), stages[slowest_id]
    t0 = time.perf_counter()
    subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", args.image, "-c", BY_HAND],
        capture_output=True,
    )
    probes_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run(f"docker save {args.image} | sha256sum", shell=True, capture_output=True, check=True)
    save_s = time.perf_counter() - t0
    by_hand = probes_s + save_s
    print(f"image {args.image}, pipeline {args.pipeline}: verdict {statement['verdict']} (exit {code})")
    for sid, d in stages.items():
        print(f"  {sid:<14} {d:8.2f} s")
    print(f"  whole run      {wall_s:8.2f} s   ({wall_s / slowest:.2f}x its slowest stage, {slowest_id})")
    print(
        f"  by hand        {by_hand:8.2f} s   (probes in one docker run {probes_s:.1f} s + docker save | sha256sum {save_s:.1f} s)"
    )
    print(f"  imagegate / by hand {wall_s / by_hand:.2f}x; runner peak RSS {int(rss_kib) / 1024:.0f} MiB")
    goals = [
        Goal(
            "whole pipeline / its slowest stage",
            f"<= {GOAL_OVER_SLOWEST}",
            f"{wall_s / slowest:.2f}",
            wall_s / slowest <= GOAL_OVER_SLOWEST,
        ),
        Goal(
            "runner peak RSS",
            f"<= {GOAL_RSS_MB} MB",
            f"{int(rss_kib) / 1024:.0f} MiB",
            int(rss_kib) / 1024 <= GOAL_RSS_MB,
        ),
    ]
    rc = print_goals(goals)
    if args.record:
        results = {"stages_s": stages, "wall_s": wall_s, "slowest": slowest_id, "by_hand_s": by_hand,
                   "by_hand_probes_s": probes_s, "docker_save_sha256_s": save_s, "peak_rss_kib": int(rss_kib),
                   "verdict": statement["verdict"]}  # fmt: skip
        write(args.record, "bench_pipeline", vars(args) | {"record": str(args.record)}, results, goals)
    return rc


if __name__ == "__main__":
    sys.exit(main())
