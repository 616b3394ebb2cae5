#!/usr/bin/env python3
"""The whole built-in pipeline on a real-size image: `imagegate run IMAGE -p vllm` (in-image
stages in parallel containers, the layers stage beside them) against its own slowest stage, and
against the same checks by hand: the probes in one `docker run` and `docker save IMAGE |
sha256sum`, one after the other as a script would, and both at once with the probes in parallel
(`&`, `wait`), as imagegate runs them. Runner peak RSS from a launcher (ru_maxrss of the child).
Goals: whole run <= 1.1x the checks by hand in parallel, <= 1.3x its slowest stage; peak RSS
<= 100 MB.

Usage: benchmarks/bench_pipeline.py [--image imagegate-test/vllm:latest] [--record F]
(the image: `tests/images/build.py vllm`, a real vLLM release installed with pip, ~10 GB).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_run_overhead import BY_HAND, BY_HAND_PARALLEL
from record import Goal, print_goals, write

GOAL_OVER_SLOWEST = 1.3
GOAL_OVER_BY_HAND = 1.1
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


def by_hand(image: str) -> dict[str, float]:
    """The same checks by hand: the probes in one `docker run` and `docker save | sha256sum`, one
    after the other as a script would, then both at once (`&`, `wait`) as imagegate runs them."""
    probes = ["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c"]
    save = f"docker save {shlex.quote(image)} | sha256sum"
    t0 = time.perf_counter()
    subprocess.run([*probes, BY_HAND], capture_output=True, check=True)
    probes_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run(save, shell=True, capture_output=True, check=True)
    save_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    both = [
        subprocess.Popen([*probes, BY_HAND_PARALLEL], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen(save, shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]
    if any(p.wait() != 0 for p in both):
        raise SystemExit("bench: the checks by hand in parallel failed")
    parallel_s = time.perf_counter() - t0
    return {"by_hand_probes_s": probes_s, "docker_save_sha256_s": save_s, "by_hand_s": probes_s + save_s,
            "by_hand_parallel_s": parallel_s}  # fmt: skip


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
    hand = by_hand(args.image)
    print(f"image {args.image}, pipeline {args.pipeline}: verdict {statement['verdict']} (exit {code})")
    for sid, d in stages.items():
        print(f"  {sid:<14} {d:8.2f} s")
    print(f"  whole run      {wall_s:8.2f} s   ({wall_s / slowest:.2f}x its slowest stage, {slowest_id})")
    print(
        f"  by hand        {hand['by_hand_s']:8.2f} s   one after the other (probes in one docker run "
        f"{hand['by_hand_probes_s']:.1f} s + docker save | sha256sum {hand['docker_save_sha256_s']:.1f} s)"
    )
    print(f"  by hand        {hand['by_hand_parallel_s']:8.2f} s   both at once, the probes in parallel")
    print(f"  runner peak RSS {int(rss_kib) / 1024:.0f} MiB")
    goals = goals_of(wall_s, slowest, hand["by_hand_parallel_s"], int(rss_kib) / 1024)
    rc = print_goals(goals)
    if args.record:
        results = {"stages_s": stages, "wall_s": wall_s, "slowest": slowest_id, **hand,
                   "peak_rss_kib": int(rss_kib), "verdict": statement["verdict"]}  # fmt: skip
        write(args.record, "bench_pipeline", vars(args) | {"record": str(args.record)}, results, goals)
    return rc


def goals_of(wall_s: float, slowest: float, parallel_s: float, rss_mib: float) -> list[Goal]:
    return [
        Goal(
            "whole run / the same checks by hand in parallel",
            f"<= {GOAL_OVER_BY_HAND}",
            f"{wall_s / parallel_s:.2f}",
            wall_s / parallel_s <= GOAL_OVER_BY_HAND,
        ),
        Goal(
            "whole pipeline / its slowest stage",
            f"<= {GOAL_OVER_SLOWEST}",
            f"{wall_s / slowest:.2f}",
            wall_s / slowest <= GOAL_OVER_SLOWEST,
        ),
        Goal("runner peak RSS", f"<= {GOAL_RSS_MB} MB", f"{rss_mib:.0f} MiB", rss_mib <= GOAL_RSS_MB),
    ]


if __name__ == "__main__":
    sys.exit(main())
