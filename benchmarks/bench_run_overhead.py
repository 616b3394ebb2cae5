#!/usr/bin/env python3
"""Runner overhead: `imagegate run` with the four in-image stages (pip_check, find_spec,
cli under vLLM's CpuPlatform, av_roundtrip) against the same probes run by hand in one
`docker run --rm --network none IMAGE sh -c '...'`, each side twice: imagegate with its default
--jobs against the four probes started at once (`&`, `wait`), and `imagegate run --jobs 1`
against the probes one after another. Prints the medians; goal: <= 1.0 s added against the
baseline of the same parallelism, each; prints PASS or FAIL and exits 1 on a miss.

Then where imagegate's added time goes, each part timed the same way, interleaved: its start-up
(`--version`), the modules a run imports (the command, the use case, the runner, the docker
driver, signing, the reports), and an empty container's life (create, start, wait, remove) in the
image, times the containers imagegate made (one per group of stages, from its evidence).

Usage: benchmarks/bench_run_overhead.py [--image imagegate-test/vllm-like:latest] [--reps 5] [--record F]
(needs the engine and the test image: scripts/setup.sh vllm-like); --record writes the result
as a dated JSON record (benchmarks/records/).
"""

from __future__ import annotations

import argparse
import os
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

# The four probes as a user would write them by hand, each a shell command.
PROBES = [
    "python3 -m pip check",
    """python3 -c 'import importlib.util as u; [print(m, u.find_spec(m) is not None) for m in ("vllm", "vllm.entrypoints.cli.main", "av")]'""",
    """python3 -c '
import sys, vllm.platforms as p
from vllm.platforms.cpu import CpuPlatform
p._current_platform = CpuPlatform()
sys.argv = ["vllm", "serve", "--help=all"]
from vllm.entrypoints.cli.main import main
main()' >/dev/null""",
    """python3 -c '
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
print("AV_ROUNDTRIP_PASS", n)'""",
]
# One after another, stopping at the first that fails.
BY_HAND = "set -e\n" + "\n".join(PROBES) + "\n"
# All at once in the same container (what `cmd &` ... `wait` gives): every exit status checked.
BY_HAND_PARALLEL = (
    'pids=""\n'
    + "".join(f'( {p} ) &\npids="$pids $!"\n' for p in PROBES)
    + 'rc=0\nfor p in $pids; do wait "$p" || rc=1; done\nexit "$rc"\n'
)


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if p.returncode not in (0,):
        sys.exit(
            f"bench: {' '.join(argv[:4])}... exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
        )
    return elapsed


def measure(commands: dict[str, list[str]], reps: int) -> dict[str, list[float]]:
    """Each command `reps` times, interleaved so that the machine's drift hits all alike, after
    one untimed run of each (the page cache and the engine warm)."""
    for argv in commands.values():
        timed(argv)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(reps):
        for name, argv in commands.items():
            times[name].append(timed(argv))
    return times


# What a run imports before its first container, as the command's own lazy imports reach them.
RUN_IMPORTS = (
    "import imagegate.cli.run, imagegate.accept, imagegate.runner, imagegate.drivers.docker, "
    "imagegate.attest.sign, imagegate.report.console"
)


def containers_made(runs: Path) -> int:
    """The containers a default-`--jobs` run made: a controller's events log each in its evidence
    (`--jobs 1` makes one, the fewest: the default's runs have the most)."""
    return max(
        (len(list(a.parent.glob("controller*.events.log"))) for a in runs.glob("*/*/run.json")), default=0
    )


def breakdown(medians: dict[str, float], containers: int) -> dict[str, float]:
    """The added time (default --jobs, against by hand in parallel) and the parts that explain it."""
    added = medians["imagegate (default --jobs)"] - medians["by hand, the probes in parallel"]
    startup = medians["start-up: imagegate --version"]
    imports = medians["start-up and the run's imports"] - startup
    # The by-hand run pays one container's life too: imagegate's extra ones are the rest.
    extra = (containers - 1) * medians["an empty container's life"]
    return {"added_s": added, "start_up_s": startup, "run_imports_s": imports,
            "extra_containers": containers - 1, "extra_containers_s": extra,
            "unexplained_s": added - startup - imports - extra}  # fmt: skip


def goals_of(m: dict[str, float]) -> list[Goal]:
    """Each imagegate run against the by-hand run with the same parallelism."""
    pairs = [
        ("imagegate (default --jobs)", "by hand, the probes in parallel", "parallel"),
        ("imagegate --jobs 1", "by hand, one after another", "serial"),
    ]
    return [
        Goal(
            f"seconds {ours} adds to the probes run by hand ({how})",
            f"<= {GOAL_ADDED_S} s",
            f"{m[ours] - m[hand]:+.2f} s ({m[ours] / m[hand]:.2f}x)",
            m[ours] - m[hand] <= GOAL_ADDED_S,
        )
        for ours, hand, how in pairs
    ]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="imagegate-test/vllm-like:latest")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--record", type=Path, default=None, help="write a dated JSON record here")
    args = ap.parse_args()
    imagegate = str(Path(sys.executable).parent / "imagegate")
    docker = ["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", args.image, "-c"]
    with tempfile.TemporaryDirectory() as tmp:
        pipe = Path(tmp) / "bench.yaml"
        pipe.write_text(PIPELINE)
        ours = [imagegate, "run", args.image, "-p", str(pipe), "-o", str(Path(tmp) / "runs"), "-q"]
        ours += ["--format", "json"]
        times = measure(
            {
                "imagegate (default --jobs)": ours,
                "imagegate --jobs 1": [*ours, "--jobs", "1"],
                "by hand, one after another": [*docker, BY_HAND],
                "by hand, the probes in parallel": [*docker, BY_HAND_PARALLEL],
                "start-up: imagegate --version": [imagegate, "--version"],
                "start-up and the run's imports": [sys.executable, "-c", RUN_IMPORTS],
                "an empty container's life": [*docker, "true"],
            },
            args.reps,
        )
        containers = containers_made(Path(tmp) / "runs")
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"image: {args.image}, {args.reps} runs each, interleaved, medians")
    for name, m in medians.items():
        print(f"  {name:<34} {m:6.2f} s")
    parts = breakdown(medians, containers)
    print(
        f"added {parts['added_s']:+.2f} s: start-up {parts['start_up_s']:.2f} s, the run's imports "
        f"{parts['run_imports_s']:.2f} s, {parts['extra_containers']} more container(s) "
        f"{parts['extra_containers_s']:.2f} s, the rest {parts['unexplained_s']:+.2f} s"
    )
    goals = goals_of(medians)
    code = print_goals(goals)
    if args.record:
        results = {"runs_s": times, "medians_s": medians, "breakdown": parts, "load_average": os.getloadavg()}
        write(args.record, "bench_run_overhead", {"image": args.image, "reps": args.reps}, results, goals)
    return code


if __name__ == "__main__":
    sys.exit(main())
