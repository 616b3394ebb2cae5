#!/usr/bin/env python3
"""The serve stage's cost: readiness as the stage sees it against the same server started by
hand in the same image and engine, its readiness polled every 0.05 s (python's urllib: the
image has no curl), runs interleaved. Goals: the stage's time to readiness adds <= 1.0 s to the
by-hand one (medians); the stage notices readiness <= 0.5 s after the server's first 200 (uvicorn's
access-log line of it, time-stamped by the stage as the line arrives). Also recorded: readiness
after the socket was bound ("Uvicorn running on"), which includes the server's own first answer.

The server is `transformers serve` with the tiny offline model of tests/images/transformers-serve
(CPU), in its image through the engine; with --here, in this environment (its python3 has
transformers[serving]) with --model PATH, as scripts/gpu-serve.sh runs it on a GPU host
(--device cuda --gpus all).

Usage: benchmarks/bench_serve.py [--image imagegate-test/transformers-serve:latest] [--reps 3]
       [--here --model PATH] [--device cpu] [--gpus all] [--record F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from record import Goal, print_goals, write

GOAL_ADDED_S = 1.0
GOAL_NOTICE_S = 0.5
MODEL = "/models/tiny-llama"

BY_HAND = r"""
import subprocess, sys, time, urllib.request
argv = ["transformers", "serve", "--host", "127.0.0.1", "--port", "8123", "--device", sys.argv[1], sys.argv[2]]
start = time.monotonic()
server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=sys.stderr)
while True:
    if server.poll() is not None or time.monotonic() - start > 600:  # no endless poll of a dead server
        sys.exit("the server exited %s before /health answered" % server.returncode)
    try:
        with urllib.request.urlopen("http://127.0.0.1:8123/health", timeout=1) as r:
            if r.status == 200:
                break
    except OSError:
        pass
    time.sleep(0.05)
print(round(time.monotonic() - start, 3))
server.kill()
"""


def pipeline(device: str, model: str) -> str:
    stage = {
        "id": "serve",
        "probe": "serve",
        "timeout": "10m",
        "with": {
            "command": [
                "transformers",
                "serve",
                "--host",
                "{host}",
                "--port",
                "{port}",
                "--device",
                device,
                "{model}",
            ],
            "model": model,
            "engine": "transformers",
        },
    }
    return json.dumps({"apiVersion": "imagegate/v1", "name": "bench-serve", "stages": [stage]})


def by_hand(args: argparse.Namespace) -> float:
    """Seconds from starting the server to its first 200 on /health, polled every 0.05 s."""
    here = ["python3", "-c", BY_HAND, args.device, args.model]
    gpu = ["--gpus", args.gpus] if args.gpus else []
    engine = ["docker", "run", "--rm", "--network", "none", *gpu, args.image]
    argv = here if args.here else [*engine, *here]
    return float(subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()[-1])


def by_stage(args: argparse.Namespace, pipeline_file: Path, out: Path) -> dict[str, float]:
    gpu = ["--gpus", args.gpus] if args.gpus else []
    where = ["--here", "--model", args.model] if args.here else [args.image]
    argv = [sys.executable, "-m", "imagegate", "run", *where, "-p", str(pipeline_file), *gpu]
    r = subprocess.run(
        [*argv, "--no-sign", "--format", "json", "-o", str(out)], capture_output=True, text=True
    )
    stage = next(s for s in json.loads(r.stdout)["predicate"]["stages"] if s["id"] == "serve")
    facts = stage["facts"]
    return {
        "status": stage["status"],
        "ready_s": facts["timeline"]["ready_s"],
        "first_token_s": facts["timeline"].get("first_token_s"),
        "listening_logged_s": facts["phases"]["listening"],
        "first_200_logged_s": facts["phases"]["first_200"],
        "startup_probe": facts["startup_probe"],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="imagegate-test/transformers-serve:latest")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--gpus", default=None)
    ap.add_argument("--here", action="store_true", help="this environment, no engine (needs --model)")
    ap.add_argument("--model", default=MODEL, help="the model's path (in the image; with --here, here)")
    ap.add_argument("--record", type=Path)
    args = ap.parse_args()
    hand: list[float] = []
    stage: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        pfile = Path(tmp) / "serve.yaml"
        pfile.write_text(pipeline(args.device, args.model))
        for n in range(args.reps):  # interleaved: the machine's load falls on both sides
            hand.append(by_hand(args))
            stage.append(by_stage(args, pfile, Path(tmp) / f"out{n}"))
            print(f"rep {n + 1}: by hand {hand[-1]:.3f}s, stage {stage[-1]}", flush=True)
    added = statistics.median(s["ready_s"] for s in stage) - statistics.median(hand)
    notice = max(s["ready_s"] - s["first_200_logged_s"] for s in stage)
    after_bind = [round(s["ready_s"] - s["listening_logged_s"], 3) for s in stage]
    goals = [
        Goal(
            "stage readiness over by hand (medians)",
            f"<= {GOAL_ADDED_S} s added",
            f"{added:+.3f} s",
            added <= GOAL_ADDED_S,
        ),
        Goal(
            "readiness noticed after the server's first 200 (worst run)",
            f"<= {GOAL_NOTICE_S} s",
            f"{notice:.3f} s",
            notice <= GOAL_NOTICE_S,
        ),
    ]
    results = {
        "by_hand_ready_s": hand,
        "stage": stage,
        "added_s": round(added, 3),
        "notice_s": round(notice, 3),
        "ready_after_socket_bound_s": after_bind,  # the server's own first answer included
    }
    if args.record:
        write(args.record, "bench_serve", vars(args) | {"record": str(args.record)}, results, goals)
    return print_goals(goals)


if __name__ == "__main__":
    sys.exit(main())
