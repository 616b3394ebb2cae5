#!/usr/bin/env python3
"""The price of a cached root's subject check: `imagegate run --driver rootfs` on a warm root
cache of an image already verified, with this checkout's code against an earlier revision's
(`--baseline`, by default main), side by side in one run, on one image in a registry on 127.0.0.1.

  baseline   the earlier code (its src/ taken with `git archive`): a cache hit by chainID is
             reused as found (no layer of this manifest looked at)
  current    this checkout: every layer of this manifest must be a verified pair this machine
             recorded (one small file read per layer) or is read now; the root is reused as
             content, the identity is this image's

Each side: one cold run (fills its own cache), then --runs warm runs (the two sides' warm runs
interleaved); the figure compared is the
driver's own time to prepare the root (`prepare_s` in the evidence: resolve, config check,
cache lookup and, now, the pair lookups), and the whole run's wall time beside it. The pair
lookups alone are timed too (the image's layers, --lookups times).

Goal (issue 22): the subject check adds <= 0.2 s to a warm run. A dated record goes to
benchmarks/records/ with --record.

Usage: .venv/bin/python benchmarks/bench_root_cache.py [--image imagegate-test/vllm-like:latest]
           [--baseline main] [--runs 5] [--record FILE]
Needs: docker (to push the image), docker-registry, bubblewrap, git.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import Goal, print_goals, write

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.oci.infra import start_registry  # noqa: E402  (the same registry the tests start)


def baseline_src(rev: str, dest: Path) -> Path:
    """`rev`'s src/ (with the probes and pipelines it finds beside it) unpacked into `dest`: no
    worktree, the repository is left as it is."""
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", rev, "src", "probes", "data"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "src"


def one_run(ref: str, src: Path, cache_home: Path, out: Path) -> dict[str, object]:
    env = dict(os.environ, DOCKER_HOST="unix:///nonexistent", XDG_CACHE_HOME=str(cache_home))
    env["PYTHONPATH"] = str(src)  # ahead of the editable install's path
    argv = [str(ROOT / ".venv/bin/python"), "-m", "imagegate", "run", f"docker://{ref}", "--driver", "rootfs",
            "-p", "python", "-m", "json", "--no-sign", "--format", "json", "-q", "-o", str(out)]  # fmt: skip
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if not p.stdout:
        raise SystemExit(f"bench: {src}: the run said nothing on stdout: {p.stderr[-3000:]}")
    predicate = json.loads(p.stdout)["predicate"]
    source = predicate["environment"]["image_source"]
    return {
        "wall_s": round(wall, 3),
        "prepare_s": source.get("prepare_s"),
        "cached": source.get("cached"),
        "verdict": predicate["verdict"],
        "layers": [x.get("verified") for x in source.get("layers", [])],
    }


def sides(ref: str, srcs: dict[str, Path], work: Path, runs: int) -> dict[str, dict[str, object]]:
    """Each side's cold run, then their warm runs interleaved (baseline, current, baseline, ...):
    a machine whose load drifts weighs on both alike."""
    cold = {
        name: one_run(ref, src, work / f"cache-{name}", work / f"out-{name}-cold")
        for name, src in srcs.items()
    }
    warm: dict[str, list[dict[str, object]]] = {name: [] for name in srcs}
    for i in range(runs):
        for name, src in srcs.items():
            warm[name].append(one_run(ref, src, work / f"cache-{name}", work / f"out-{name}-{i}"))
    out = {}
    for name in srcs:
        w = warm[name]
        out[name] = {
            "cold": cold[name],
            "warm": w,
            "warm_prepare_median_s": statistics.median(float(x["prepare_s"]) for x in w),  # type: ignore[arg-type]
            "warm_wall_median_s": statistics.median(float(x["wall_s"]) for x in w),  # type: ignore[arg-type]
        }
        print(f"{name}: cold {cold[name]['prepare_s']} s to prepare; warm median "
              f"{out[name]['warm_prepare_median_s']} s to prepare, {out[name]['warm_wall_median_s']:.2f} s wall; "
              f"layers {w[-1]['layers']}", flush=True)  # fmt: skip
    return out


def lookups(cache_home: Path, times: int) -> dict[str, float]:
    """The pair lookups alone, for every layer the current side's cache recorded."""
    sys.path.insert(0, str(ROOT / "src"))
    from imagegate.rootfs import RootCache

    with RootCache(str(cache_home / "imagegate" / "roots")) as cache:
        names = sorted(os.listdir(os.path.join(cache.folder, "pairs")))
        digests = [n.replace("-", ":", 1) for n in names]
        t0 = time.perf_counter()
        for _ in range(times):
            for d in digests:
                assert cache.pairs.get(d) is not None
        per_image = (time.perf_counter() - t0) / times
    return {"layers": len(digests), "per_image_s": per_image}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", default="imagegate-test/vllm-like:latest")
    ap.add_argument("--baseline", default="main", help="the revision to compare with")
    ap.add_argument("--runs", type=int, default=5, help="warm runs on each side")
    ap.add_argument("--lookups", type=int, default=1000)
    ap.add_argument("--record", type=Path, default=None)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-root-cache-"))
    reg = start_registry(work / "registry")
    ref = f"{reg.host}/bench/root-cache:1"
    base_rev = subprocess.run(["git", "rev-parse", a.baseline], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
    results: dict[str, object] = {"image": a.image, "baseline": base_rev}
    try:
        subprocess.run(["docker", "tag", a.image, ref], check=True)
        subprocess.run(["docker", "push", "-q", ref], check=True, capture_output=True)
        subprocess.run(["docker", "rmi", ref], capture_output=True)  # the tag only
        both = sides(
            ref, {"baseline": baseline_src(base_rev, work / "base"), "current": ROOT / "src"}, work, a.runs
        )
        results["baseline_side"], results["current_side"] = both["baseline"], both["current"]
        results["pair_lookups"] = lookups(work / "cache-current", a.lookups)
    finally:
        reg.stop()
        shutil.rmtree(work, ignore_errors=True)
    base, cur = results["baseline_side"], results["current_side"]
    added = float(cur["warm_prepare_median_s"]) - float(base["warm_prepare_median_s"])  # type: ignore[index]
    ratio = float(cur["warm_wall_median_s"]) / float(base["warm_wall_median_s"])  # type: ignore[index]
    look = results["pair_lookups"]
    known = all(v == "known_pair" for v in cur["warm"][-1]["layers"])  # type: ignore[index]
    goals = [
        Goal("subject check added to a warm run's root preparation", "<= 0.2 s",
             f"{added:+.3f} s ({cur['warm_prepare_median_s']} s vs {base['warm_prepare_median_s']} s before; "  # type: ignore[index]
             f"the whole warm run {ratio:.2f}x: {cur['warm_wall_median_s']:.2f} s vs {base['warm_wall_median_s']:.2f} s)",  # type: ignore[index]
             added <= 0.2),
        Goal("pair lookups alone, whole image", "<= 0.2 s",
             f"{look['per_image_s'] * 1000:.2f} ms for {look['layers']} layers", look["per_image_s"] <= 0.2),  # type: ignore[index]
        Goal("warm layers vouched for by known pairs (none read again)", "all", str(known), known),
    ]  # fmt: skip
    code = print_goals(goals)
    if a.record:
        write(a.record, "bench_root_cache", vars(a) | {"record": str(a.record)}, results, goals)
    return code


if __name__ == "__main__":
    sys.exit(main())
