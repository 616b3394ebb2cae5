#!/usr/bin/env python3
"""Time to verdict without an engine: `imagegate run --driver rootfs` (cold root cache, then
warm) against an engine's pull + the same pipeline in that engine's containers, on one image in a
registry on 127.0.0.1, side by side in one run.

  rootfs cold   imagegate run docker://REG/IMAGE -p PIPELINE --driver rootfs   (empty root cache,
                DOCKER_HOST pointing nowhere: every layer read, verified and unpacked, then probed)
  rootfs warm   the same again: the root from the cache (its chainID), the layers stage reading
                the registry's blobs beside the probes
  stages alone  the in-image stages of that warm run (their own durations, as the attestation
                records them, laid end to end by controller)
  engine        ENGINE pull REG/IMAGE, then imagegate run REG/IMAGE --driver ENGINE (the pulled
                image removed afterwards). Podman by default: the Docker engine here holds the
                test images' layers already, so its pull would not be a cold one.

Goals (issue 15): cold <= 0.7x (pull + engine run); warm <= 1.2x the in-image stages alone
(here: the warm run's wall time against its in-image stages' wall time); the runner's peak RSS
<= 150 MB. A dated record goes to benchmarks/records/ with --record.

Usage: .venv/bin/python benchmarks/bench_rootfs.py [--image imagegate-test/vllm:latest]
           [--pipeline vllm] [--engine podman|docker] [--work DIR] [--record FILE]
Needs: docker (to push the image), docker-registry, bubblewrap, and Podman's API at
/run/podman.sock (or --engine docker).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import Goal, print_goals, write

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.oci.infra import start_registry  # noqa: E402  (the same registry the tests start)

ENGINE_HOST = {"podman": "unix:///run/podman.sock", "docker": "unix:///var/run/docker.sock"}


def peak_rss(argv: list[str], env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """As timed(), with the peak RSS of this one process tree from wait4."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None and p.stderr is not None
    out_chunks: list[str] = []
    err_chunks: list[str] = []
    import threading

    ts = [
        threading.Thread(target=lambda: out_chunks.append(p.stdout.read())),  # type: ignore[union-attr]
        threading.Thread(target=lambda: err_chunks.append(p.stderr.read())),  # type: ignore[union-attr]
    ]
    for t in ts:
        t.start()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    for t in ts:
        t.join()
    p.returncode = os.waitstatus_to_exitcode(status)
    return (
        wall,
        usage.ru_maxrss / 1024,
        subprocess.CompletedProcess(argv, p.returncode, "".join(out_chunks), "".join(err_chunks)),
    )


def inside_wall(statement: dict) -> float:  # type: ignore[type-arg]
    """The in-image stages' own time: the sum of their durations (one controller at a time)."""
    return sum(
        float(s.get("durationSeconds") or s.get("duration_s") or 0)
        for s in statement["predicate"]["stages"]
        if s.get("side", "inside") == "inside"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", default="imagegate-test/vllm:latest")
    ap.add_argument("--pipeline", default="vllm")
    ap.add_argument("--engine", choices=list(ENGINE_HOST), default="podman")
    ap.add_argument("--work", default=None, help="registry storage and the root cache (default: a temp dir)")
    ap.add_argument("--record", type=Path, default=None)
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="bench-rootfs-"))
    py = str(ROOT / ".venv/bin/python")
    reg = start_registry(work / "registry")
    ref = f"{reg.host}/bench/rootfs:1"
    results: dict[str, object] = {"image": a.image, "pipeline": a.pipeline, "engine": a.engine}
    try:
        size = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Size}}", a.image],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        results["image_bytes"] = int(size)
        subprocess.run(["docker", "tag", a.image, ref], check=True)
        t0 = time.perf_counter()
        subprocess.run(["docker", "push", "-q", ref], check=True, capture_output=True)
        results["push_s"] = round(time.perf_counter() - t0, 1)
        subprocess.run(["docker", "rmi", ref], capture_output=True)  # the tag only
        common = ["-p", a.pipeline, "--no-sign", "--format", "json", "-q"]
        rootfs_env = dict(os.environ, DOCKER_HOST="unix:///nonexistent", XDG_CACHE_HOME=str(work / "cache"))
        runs = {}
        for name in ("cold", "warm"):
            wall, rss, p = peak_rss(
                [py, "-m", "imagegate", "run", f"docker://{ref}", "--driver", "rootfs", *common,
                 "-o", str(work / f"out-{name}")],
                rootfs_env,
            )  # fmt: skip
            if not p.stdout:
                print(p.stderr[-3000:], file=sys.stderr)
                return 2
            st = json.loads(p.stdout)
            runs[name] = {
                "wall_s": round(wall, 2),
                "peak_rss_mb": round(rss, 1),
                "verdict": st["predicate"]["verdict"],
                "inside_stages_s": round(inside_wall(st), 2),
                "prepare_s": st["predicate"]["environment"]["image_source"].get("prepare_s"),
                "cached": st["predicate"]["environment"]["image_source"].get("cached"),
            }
            print(f"rootfs {name}: {runs[name]}", flush=True)
        engine_env = dict(os.environ, DOCKER_HOST=ENGINE_HOST[a.engine])
        tool = a.engine
        had = subprocess.run([tool, "image", "inspect", ref], capture_output=True).returncode == 0
        t0 = time.perf_counter()
        pull_argv = [tool, "pull", "-q", ref] + (["--tls-verify=false"] if tool == "podman" else [])
        subprocess.run(pull_argv, check=True, capture_output=True, env=engine_env)
        pull_s = time.perf_counter() - t0
        try:
            wall, rss, p = peak_rss(
                [py, "-m", "imagegate", "run", ref, "--driver", a.engine, "--pull", "never", *common,
                 "-o", str(work / "out-engine")],
                engine_env,
            )  # fmt: skip
        finally:
            if not had:
                subprocess.run([tool, "rmi", ref], capture_output=True, env=engine_env)
        st = json.loads(p.stdout)
        runs["engine"] = {
            "pull_s": round(pull_s, 2),
            "run_s": round(wall, 2),
            "peak_rss_mb": round(rss, 1),
            "verdict": st["predicate"]["verdict"],
            "image_was_present": had,
        }
        print(f"{a.engine} pull + run: {runs['engine']}", flush=True)
        results["runs"] = runs
    finally:
        reg.stop()
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    cold, warm, eng = runs["cold"], runs["warm"], runs["engine"]
    engine_total = float(eng["pull_s"]) + float(eng["run_s"])  # type: ignore[arg-type]
    cold_ratio = float(cold["wall_s"]) / engine_total  # type: ignore[arg-type]
    warm_ratio = float(warm["wall_s"]) / max(0.01, float(warm["inside_stages_s"]))  # type: ignore[arg-type]
    rss = max(float(cold["peak_rss_mb"]), float(warm["peak_rss_mb"]))  # type: ignore[arg-type]
    same = cold["verdict"] == warm["verdict"] == eng["verdict"]
    goals = [
        Goal("rootfs cold vs pull + engine run", "<= 0.7x",
             f"{cold_ratio:.2f}x ({cold['wall_s']} s vs {eng['pull_s']} + {eng['run_s']} s)", cold_ratio <= 0.7),
        Goal("rootfs warm vs its in-image stages alone", "<= 1.2x",
             f"{warm_ratio:.2f}x ({warm['wall_s']} s vs {warm['inside_stages_s']} s)", warm_ratio <= 1.2),
        Goal("runner peak RSS (wait4)", "<= 150 MB", f"{rss:.0f} MB", rss <= 150),
        Goal("same verdict", "rootfs cold = warm = engine", f"{cold['verdict']}, {warm['verdict']}, {eng['verdict']}", same),
    ]  # fmt: skip
    code = print_goals(goals)
    if a.record:
        write(a.record, "bench_rootfs", vars(a) | {"record": str(a.record)}, results, goals)
    return code


if __name__ == "__main__":
    sys.exit(main())
