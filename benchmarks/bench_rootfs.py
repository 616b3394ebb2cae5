#!/usr/bin/env python3
"""Time to verdict without an engine: `imagegate run --driver rootfs` (cold root cache, then
warm) against an engine's pull + the same pipeline in that engine's containers, on one image in a
registry on 127.0.0.1, side by side in one run.

  rootfs cold   imagegate run docker://REG/IMAGE -p PIPELINE --driver rootfs   (empty root cache,
                DOCKER_HOST pointing nowhere: every layer read, verified and unpacked, then probed)
  rootfs warm   the same again: the root from the cache (its chainID), the layers stage reading
                the registry's blobs beside the probes
  stages alone  the in-image stages of that warm run (first controller start to last end)
  engine        ENGINE pull REG/IMAGE, then imagegate run REG/IMAGE --driver ENGINE (the pulled
                image removed afterwards). Podman by default: the Docker engine here holds the
                test images' layers already, so its pull would not be a cold one.

Goals (issue 15): cold <= 0.7x (pull + engine run); warm <= 1.2x the in-image stages alone
(here: the warm run's wall time against its in-image stages' wall time, first controller start
to last controller end, from run.json); the runner's own peak RSS (VmHWM) <= 150 MB. A dated record goes to benchmarks/records/ with --record.

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
import threading
import time
from pathlib import Path

from record import Goal, print_goals, write

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.oci.infra import start_registry  # noqa: E402  (the same registry the tests start)

ENGINE_HOST = {"podman": "unix:///run/podman.sock", "docker": "unix:///var/run/docker.sock"}


def run_measured(
    argv: list[str], env: dict[str, str]
) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall seconds, the runner's own peak RSS in MB (VmHWM of that one process, sampled until it
    exits: the image's processes in the sandbox are not the runner's), and its output."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    hwm = [0.0]

    def sample() -> None:
        while p.poll() is None:
            try:
                for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        hwm[0] = max(hwm[0], int(line.split()[1]) / 1024)
            except (OSError, ValueError):
                pass
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = p.communicate()
    wall = time.perf_counter() - t0
    sampler.join()
    return wall, hwm[0], subprocess.CompletedProcess(argv, p.returncode, out, err)


def inside_wall(out: Path) -> float:
    """The in-image stages' wall time: first controller start to last controller end, as the
    attempt's run.json records them (groups of stages run at once)."""
    import datetime as dt

    (run_json,) = out.glob("*/*/run.json")
    controllers = json.loads(run_json.read_text())["run"]["controllers"]

    def at(s: str) -> float:
        return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()

    return max(at(c["finished"]) for c in controllers) - min(at(c["started"]) for c in controllers)


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
        shutil.rmtree(work / "cache", ignore_errors=True)  # cold means cold, also with a kept --work
        rootfs_env = dict(os.environ, DOCKER_HOST="unix:///nonexistent", XDG_CACHE_HOME=str(work / "cache"))
        runs = {}
        for name in ("cold", "warm"):
            shutil.rmtree(work / f"out-{name}", ignore_errors=True)
            wall, rss, p = run_measured(
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
                "inside_stages_s": round(inside_wall(work / f"out-{name}"), 2),
                "prepare_s": st["predicate"]["environment"]["image_source"].get("prepare_s"),
                "cached": st["predicate"]["environment"]["image_source"].get("cached"),
            }
            print(f"rootfs {name}: {runs[name]}", flush=True)
        engine_env = dict(os.environ, DOCKER_HOST=ENGINE_HOST[a.engine])
        tool = a.engine
        had = subprocess.run([tool, "image", "inspect", ref], capture_output=True).returncode == 0
        # An engine that holds the image already (by its ID) pulls nothing: not a cold pull.
        config_id = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Id}}", a.image],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        warm_engine = (
            subprocess.run([tool, "image", "inspect", config_id], capture_output=True).returncode == 0
        )
        t0 = time.perf_counter()
        pull_argv = [tool, "pull", "-q", ref] + (["--tls-verify=false"] if tool == "podman" else [])
        pulled = subprocess.run(pull_argv, capture_output=True, text=True, env=engine_env)
        pull_s = time.perf_counter() - t0
        if pulled.returncode != 0:
            print(
                f"bench: {' '.join(pull_argv)} exited {pulled.returncode}: {pulled.stderr[-2000:]}",
                file=sys.stderr,
            )
            return 2
        try:
            shutil.rmtree(work / "out-engine", ignore_errors=True)
            wall, rss, p = run_measured(
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
            "engine_held_the_image": warm_engine,
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
             f"{cold_ratio:.2f}x ({cold['wall_s']} s vs {eng['pull_s']} + {eng['run_s']} s)"
             + (f"; not a cold pull: {a.engine} held the image already" if eng["engine_held_the_image"] else ""),
             None if eng["engine_held_the_image"] else cold_ratio <= 0.7),
        Goal("rootfs warm vs its in-image stages alone", "<= 1.2x",
             f"{warm_ratio:.2f}x ({warm['wall_s']} s vs {warm['inside_stages_s']} s)", warm_ratio <= 1.2),
        Goal("runner peak RSS (VmHWM)", "<= 150 MB", f"{rss:.0f} MB", rss <= 150),
        Goal("same verdict", "rootfs cold = warm = engine", f"{cold['verdict']}, {warm['verdict']}, {eng['verdict']}", same),
    ]  # fmt: skip
    code = print_goals(goals)
    if a.record:
        write(a.record, "bench_rootfs", vars(a) | {"record": str(a.record)}, results, goals)
    return code


if __name__ == "__main__":
    sys.exit(main())
