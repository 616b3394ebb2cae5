#!/usr/bin/env python3
"""Runner overhead: `imagegate run` with the four in-image stages (pip_check, find_spec,
cli under vLLM's CpuPlatform, av_roundtrip) against the same probes run by hand in one
`docker run --rm --network none IMAGE sh -c '...'`. Prints medians, the added seconds and the
ratio. Goal: <= 1.0 s added; prints PASS or FAIL and exits 1 on a miss.

Usage: benchmarks/bench_run_overhead.py [--image imagegate-test/vllm-like:latest] [--reps 5] [--record F]
(needs the engine and the test image: scripts/setup.sh vllm-like); --record writes the result
as a dated JSON record (benchmarks/records/).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import Goal, print_goals, write

GOAL_ADDED_S = 1.0

PIPELINE = """\
apiVersion: imagegate/v1
name: bench
stages:
  - id: pip_check
    probe: pip_check
  - id: find_spec
    probe: find_spec
    with: {modules: [vllm, vllm.entrypoints.cli.main, av]}
  - id: cli_cpu
    probe: cli
    with: {command: [vllm], args: [serve, --help=all], platform: vllm-cpu}
  - id: av_roundtrip
    probe: av_roundtrip
"""

BY_HAND = r"""
python3 -m pip check
python3 -c 'import importlib.util as u; [print(m, u.find_spec(m) is not None) for m in ("vllm", "vllm.entrypoints.cli.main", "av")]'
python3 -c '
import sys, vllm.platforms as p
from vllm.platforms.cpu import CpuPlatform
p._current_platform = CpuPlatform()
sys.argv = ["vllm", "serve", "--help=all"]
from vllm.entrypoints.cli.main import main
main()' >/dev/null
python3 -c '
import io, av
buf = io.BytesIO()
with av.open(buf, mode="w", format="mp4") as out:
    s = out.add_stream("mpeg4", rate=24); s.width = s.height = 64; s.pix_fmt = "yuv420p"
    for i in range(8):
        f = av.VideoFrame(64, 64, "yuv420p")
        for pl in f.planes: pl.update(bytes((i + k) % 256 for k in range(pl.buffer_size)))
        f.pts = i
        [out.mux(p) for p in s.encode(f)]
    [out.mux(p) for p in s.encode()]
buf.seek(0)
with av.open(buf) as inp: n = sum(1 for _ in inp.decode(video=0))
assert n == 8, n
print("AV_ROUNDTRIP_PASS", n)'
"""


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if p.returncode not in (0,):
        sys.exit(
            f"bench: {' '.join(argv[:4])}... exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
        )
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="imagegate-test/vllm-like:latest")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--record", type=Path, default=None, help="write a dated JSON record here")
    args = ap.parse_args()
    imagegate = str(Path(sys.executable).parent / "imagegate")
    with tempfile.TemporaryDirectory() as tmp:
        pipe = Path(tmp) / "bench.yaml"
        pipe.write_text(PIPELINE)
        ours_cmd = [
            imagegate,
            "run",
            args.image,
            "-p",
            str(pipe),
            "-o",
            str(Path(tmp) / "runs"),
            "-q",
            "--format",
            "json",
        ]
        hand_cmd = [
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            "sh",
            args.image,
            "-c",
            BY_HAND,
        ]
        timed(ours_cmd), timed(hand_cmd)  # warm the page cache and the engine
        ours, hand = [], []
        for _ in range(args.reps):  # interleaved, so drift hits both
            ours.append(timed(ours_cmd))
            hand.append(timed(hand_cmd))
    o, h = statistics.median(ours), statistics.median(hand)
    print(f"image: {args.image}, {args.reps} runs each, medians")
    print(f"  by hand, one docker run        {h:6.2f} s")
    print(f"  imagegate run (4 stages)       {o:6.2f} s")
    print(f"  added by imagegate             {o - h:+6.2f} s")
    print(f"  ratio imagegate / by hand      {o / h:6.2f}x")
    goals = [
        Goal(
            "seconds imagegate adds to the probes run by hand",
            f"<= {GOAL_ADDED_S} s",
            f"{o - h:+.2f} s",
            o - h <= GOAL_ADDED_S,
        )
    ]
    code = print_goals(goals)
    if args.record:
        results = {"by_hand_s": hand, "imagegate_s": ours, "median_by_hand_s": h, "median_imagegate_s": o}
        write(args.record, "bench_run_overhead", {"image": args.image, "reps": args.reps}, results, goals)
    return code


if __name__ == "__main__":
    sys.exit(main())
