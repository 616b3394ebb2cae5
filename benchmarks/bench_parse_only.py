#!/usr/bin/env python3
"""How long the sglang-serve built-in's parse-only stage (serve_argv, `parse_only: sglang`) takes
on the real SGLang image, against SGLang's own parse of the same argv by hand in a container.

Each round, interleaved: `imagegate run IMAGE -p sglang-serve --model MODEL --no-sign` (the whole
built-in: find_spec, serve_argv, and serve, DEFERRED without a GPU), the same argv with a bogus
flag (serve_argv alone, FAIL), and by hand `docker run --network none IMAGE python3 -c` doing the
stage's work without imagegate: prepare_server_args on that argv under SGLANG_USE_CPU_ENGINE=1,
then resolve_once with the model path "dummy" (the checks that read no model). The model is the tiny offline
one of tests/images/transformers-serve, copied out of its image.

Usage: .venv/bin/python benchmarks/bench_parse_only.py [--rounds 3] [--record FILE]
(the images: `tests/images/build.py sglang transformers-serve`)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from record import Goal, print_goals, write

ROOT = Path(__file__).resolve().parents[1]
# The stage's own work, by hand: parse, then the resolution checks that read no model.
BY_HAND = (
    "import sys; from sglang.srt.server_args import prepare_server_args; "
    "a = prepare_server_args(sys.argv[1:]); a.model_path = 'dummy'; a.resolve_once()"
)
ARGV = ["--model-path", "/tmp/imagegate-model", "--host", "127.0.0.1", "--port", "8000"]
GOAL_ADDED_S = 3.0  # the stage may add this to the same parse and checks by hand (medians)


def timed(argv: list[str], cwd: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    t = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=1800)
    return round(time.monotonic() - t, 3), done


def run_stage(image: str, pipeline: str, model: Path, tmp: str) -> dict[str, Any]:
    imagegate = str(Path(sys.executable).parent / "imagegate")
    argv = [imagegate, "run", image, "-p", pipeline, "--model", str(model), "--no-sign", "--format", "json"]
    wall, done = timed([*argv, "-o", f"{tmp}/runs"], tmp)
    pred = json.loads(done.stdout)["predicate"]
    stage = next(s for s in pred["stages"] if s["id"] == "serve_argv")
    return {
        "wall_s": wall,
        "verdict": pred["verdict"],
        "serve_argv": {k: stage[k] for k in ("status", "durationSeconds", "detail")},
    }


def bad_flag_pipeline(tmp: str) -> str:
    pipeline = yaml.safe_load((ROOT / "data" / "pipelines" / "sglang-serve.yaml").read_text())
    stage = next(st for st in pipeline["stages"] if st["id"] == "serve_argv")
    stage["with"]["command"] = [*stage["with"]["command"], "--no-such-flag"]
    pipeline["stages"] = [stage]
    (Path(tmp) / "bad.yaml").write_text(yaml.safe_dump(pipeline))
    return str(Path(tmp) / "bad.yaml")


def tiny_model(tmp: str) -> Path:
    cid = subprocess.run(
        ["docker", "create", "imagegate-test/transformers-serve:latest"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        subprocess.run(["docker", "cp", f"{cid}:/models/tiny-llama", tmp], check=True)
    finally:
        subprocess.run(["docker", "rm", cid], capture_output=True, check=True)
    for p in [Path(tmp) / "tiny-llama", *(Path(tmp) / "tiny-llama").rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return Path(tmp) / "tiny-llama"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="imagegate-test/sglang:latest")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--record", type=Path)
    args = ap.parse_args()
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model, bad = tiny_model(tmp), bad_flag_pipeline(tmp)
        hand = ["docker", "run", "--rm", "--network", "none", "-e", "SGLANG_USE_CPU_ENGINE=1"]
        hand += ["-v", f"{model}:/tmp/imagegate-model:ro"]
        for i in range(args.rounds):
            by_hand_s, done = timed([*hand, args.image, "python3", "-c", BY_HAND, *ARGV], tmp)
            one = {
                "builtin": run_stage(args.image, "sglang-serve", model, tmp),
                "bad_flag": run_stage(args.image, bad, model, tmp),
                "by_hand_s": by_hand_s,
                "by_hand_exit": done.returncode,
            }
            rounds.append(one)
            print(f"round {i + 1}: {json.dumps(one)}")
    stage_s = statistics.median(r["builtin"]["serve_argv"]["durationSeconds"] for r in rounds)
    hand_s = statistics.median(r["by_hand_s"] for r in rounds)
    results = {
        "rounds": rounds,
        "median_stage_s": stage_s,
        "median_bad_flag_stage_s": statistics.median(
            r["bad_flag"]["serve_argv"]["durationSeconds"] for r in rounds
        ),
        "median_builtin_wall_s": statistics.median(r["builtin"]["wall_s"] for r in rounds),
        "median_by_hand_s": hand_s,
    }
    ok = all(r["builtin"]["serve_argv"]["status"] == "PASS" and r["by_hand_exit"] == 0 for r in rounds)
    goals = [
        Goal("serve_argv PASS and the parse by hand exit 0, every round", "all", f"{ok}", ok),
        Goal(
            "serve_argv added to the same parse and checks by hand (medians)",
            f"≤ {GOAL_ADDED_S} s",
            f"{stage_s - hand_s:+.2f} s ({stage_s:.2f} s vs {hand_s:.2f} s)",
            stage_s - hand_s <= GOAL_ADDED_S,
        ),
    ]
    if args.record:
        write(args.record, "bench_parse_only", vars(args) | {"record": str(args.record)}, results, goals)
    return print_goals(goals)


if __name__ == "__main__":
    raise SystemExit(main())
