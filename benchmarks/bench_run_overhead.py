#!/usr/bin/env python3
"""Runner overhead: `imagegate run` with the four in-image stages (pip_check, find_spec,
cli under vLLM's CpuPlatform, av_roundtrip) against the same probes run by hand in one
`docker run --rm --network none IMAGE sh -c '...'`, each side twice: imagegate with its default
--jobs against the four probes started at once (`&`, `wait`), and `imagegate run --jobs 1`
against the probes one after another. Prints the medians; goal: <= 1.0 s added against the
baseline of the same parallelism, each; prints PASS or FAIL and exits 1 on a miss.

Then where imagegate's added time goes, each part timed the same way, interleaved: its start-up
(`--version`), the modules a run imports (the command, the use case, the runner, the docker
driver, signing, the reports), the libraries no run can do without (typer, rich, pydantic, the
Docker SDK, PyYAML), and an empty container's life (create, start, wait, remove) in the image,
times the containers imagegate made (one per group of stages, from its evidence). And each
default run's own timeline, from its evidence against the wall clock around it: before the
attempt (start-up, imports, the plan, the engine asked about the image), to the first stage's
start (the containers created and started, the bundle sent, the controller up), the stages,
after them (the controllers' end, the containers removed), after the attempt (signing, reports).

With --rootfs, the `--driver rootfs` warm path too: the image pushed to a registry on
127.0.0.1, one cold run to fill a root cache, then `imagegate run docker://REG/IMAGE --driver
rootfs` with that cache warm (no engine: DOCKER_HOST points nowhere), against the same probes by
hand in bubblewrap on the cached root (read-only, network and every namespace unshared), both in
parallel, timed interleaved with the rest and held to the same goal.

Usage: benchmarks/bench_run_overhead.py [--image imagegate-test/vllm-like:latest] [--reps 5]
       [--stress] [--rootfs] [--record F]
(needs the engine and the test image: scripts/setup.sh vllm-like; --rootfs: docker-registry and
bubblewrap too); --stress runs `stress-ng --cpu N` (N: the CPU count) beside every measurement;
--record writes the result as a dated JSON record (benchmarks/records/).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
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

GOAL_ADDED_S = 0.5

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


def timed(argv: list[str], spans: list[tuple[float, float]] | None = None) -> float:
    t0, w0 = time.perf_counter(), time.time()
    p = subprocess.run(argv, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if spans is not None:
        spans.append((w0, w0 + elapsed))
    if p.returncode not in (0,):
        sys.exit(
            f"bench: {' '.join(argv[:4])}... exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
        )
    return elapsed


def measure(
    commands: dict[str, list[str]], reps: int, traced: dict[str, Path]
) -> tuple[dict[str, list[float]], dict[str, list[dict[str, float]]]]:
    """Each command `reps` times, interleaved so that the machine's drift hits all alike, after
    one untimed run of each (the page cache and the engine warm); and the timeline of each timed
    run of the `traced` ones (imagegate runs, each writing into its folder)."""
    for argv in commands.values():
        timed(argv)
    times: dict[str, list[float]] = {name: [] for name in commands}
    lines: dict[str, list[dict[str, float]]] = {name: [] for name in traced}
    for _ in range(reps):
        for name, argv in commands.items():
            spans: list[tuple[float, float]] = []
            times[name].append(timed(argv, spans))
            if name in traced:
                lines[name].append(timeline(newest_attempt(traced[name]), *spans[0]))
    return times, lines


def newest_attempt(runs: Path) -> Path:
    return max((p.parent for p in runs.glob("*/*/statement.json")), key=lambda p: p.stat().st_mtime)


def _wall(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def timeline(attempt: Path, spawned: float, exited: float) -> dict[str, float]:
    """Where one run's seconds went, from its statement (startedOn, finishedOn, each stage's
    start and duration, on the run's clock) against the wall clock around the process."""
    pred = json.loads((attempt / "statement.json").read_text())["predicate"]
    began, ended = _wall(pred["startedOn"]), _wall(pred["finishedOn"])
    stages = [s for s in pred["stages"] if s.get("startedSeconds") is not None]
    first = min(s["startedSeconds"] for s in stages)
    last = max(s["startedSeconds"] + s["durationSeconds"] for s in stages)
    return {
        "before_attempt_s": began - spawned,
        "to_first_stage_s": first,
        "stages_s": last - first,
        "after_stages_s": (ended - began) - last,
        "after_attempt_s": exited - ended,
    }


# What a run imports before its first container, as the command's own lazy imports reach them.
RUN_IMPORTS = (
    "import imagegate.cli.run, imagegate.usecases.accept, imagegate.usecases.runner, imagegate.drivers.docker, "
    "imagegate.attest.sign, imagegate.report.console"
)
# The libraries no run can do without: the command line, the pipeline's models, the engine's API.
FLOOR_IMPORTS = "import typer, rich.console, pydantic, docker, yaml"


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


ROOTFS_WARM = "imagegate --driver rootfs, warm"
ROOTFS_BY_HAND = "by hand in bwrap on the root, in parallel"


def goals_of(m: dict[str, float]) -> list[Goal]:
    """Each imagegate run against the by-hand run with the same parallelism."""
    pairs = [
        ("imagegate (default --jobs)", "by hand, the probes in parallel", "parallel"),
        ("imagegate --jobs 1", "by hand, one after another", "serial"),
    ]
    if ROOTFS_WARM in m:
        pairs.append((ROOTFS_WARM, ROOTFS_BY_HAND, "rootfs, parallel"))
    return [
        Goal(
            f"seconds {ours} adds to the probes run by hand ({how})",
            f"<= {GOAL_ADDED_S} s",
            f"{m[ours] - m[hand]:+.2f} s ({m[ours] / m[hand]:.2f}x)",
            m[ours] - m[hand] <= GOAL_ADDED_S,
        )
        for ours, hand, how in pairs
    ]


@contextlib.contextmanager
def rootfs_commands(image: str, work: Path, pipe: Path):  # type: ignore[no-untyped-def]
    """The warm `--driver rootfs` run and its by-hand twin: the image pushed to a registry on
    127.0.0.1, one cold run filling the root cache (untimed), the cached root found by its
    python3."""
    sys.path.insert(0, str(ROOT))
    from tests.oci.infra import start_registry  # the same registry the tests start

    reg = start_registry(work / "registry")
    try:
        ref = f"{reg.host}/bench/{image.rsplit('/', 1)[-1]}"
        for argv in (["docker", "tag", image, ref], ["docker", "push", "-q", ref], ["docker", "rmi", ref]):
            subprocess.run(argv, check=True, capture_output=True)
        env = ["env", f"XDG_CACHE_HOME={work / 'cache'}", "DOCKER_HOST=unix:///nonexistent"]
        ours = [*env, str(Path(sys.executable).parent / "imagegate"), "run", f"docker://{ref}"]
        ours += [
            "--driver",
            "rootfs",
            "-p",
            str(pipe),
            "-o",
            str(work / "runs-rootfs"),
            "-q",
            "--format",
            "json",
        ]
        timed(ours)  # cold: fills the cache
        root = next((work / "cache").glob("**/roots/*/**/usr/local/bin/python3"), None) or next(
            (work / "cache").glob("**/roots/*/**/usr/bin/python3")
        )
        top = root.parents[3] if "local" in root.parts[-3:] else root.parents[2]
        bwrap = ["bwrap", "--ro-bind", str(top), "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
                 "--unshare-all", "--die-with-parent", "--clearenv", "--setenv", "HOME", "/tmp",
                 "--setenv", "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                 "sh", "-c", BY_HAND_PARALLEL]  # fmt: skip
        yield {ROOTFS_WARM: ours, ROOTFS_BY_HAND: bwrap}
    finally:
        reg.stop()


@contextlib.contextmanager
def stressed(on: bool):  # type: ignore[no-untyped-def]
    """stress-ng --cpu N (every CPU busy) for the block's length, when asked."""
    if not on:
        yield
        return
    exe = shutil.which("stress-ng")
    if exe is None:
        sys.exit("bench: --stress needs stress-ng (apt-get install stress-ng)")
    p = subprocess.Popen([exe, "--cpu", str(os.cpu_count() or 1), "--quiet"])
    try:
        time.sleep(2)  # the load is there before the first measurement
        yield
    finally:
        p.terminate()
        p.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="imagegate-test/vllm-like:latest")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--record", type=Path, default=None, help="write a dated JSON record here")
    ap.add_argument("--stress", action="store_true", help="run stress-ng --cpu N beside it")
    ap.add_argument("--rootfs", action="store_true", help="the --driver rootfs warm path too")
    args = ap.parse_args()
    # The machine's own load, before this benchmark adds its own (the record's end figure has both).
    load_before = [round(x, 2) for x in os.getloadavg()]
    imagegate = str(Path(sys.executable).parent / "imagegate")
    docker = ["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", args.image, "-c"]
    with tempfile.TemporaryDirectory() as tmp:
        pipe = Path(tmp) / "bench.yaml"
        pipe.write_text(PIPELINE)
        ours = [imagegate, "run", args.image, "-p", str(pipe), "-o", str(Path(tmp) / "runs"), "-q"]
        ours += ["--format", "json"]
        with contextlib.ExitStack() as stack:
            extra = stack.enter_context(rootfs_commands(args.image, Path(tmp), pipe)) if args.rootfs else {}
            stack.enter_context(stressed(args.stress))
            times, lines = measure(
                {
                    **extra,
                    "imagegate (default --jobs)": ours,
                    "imagegate --jobs 1": [*ours, "--jobs", "1"],
                    "by hand, one after another": [*docker, BY_HAND],
                    "by hand, the probes in parallel": [*docker, BY_HAND_PARALLEL],
                    "start-up: imagegate --version": [imagegate, "--version"],
                    "start-up and the run's imports": [sys.executable, "-c", RUN_IMPORTS],
                    "start-up and the libraries alone": [sys.executable, "-c", FLOOR_IMPORTS],
                    "an empty container's life": [*docker, "true"],
                },
                args.reps,
                {"imagegate (default --jobs)": Path(tmp) / "runs"}
                | ({ROOTFS_WARM: Path(tmp) / "runs-rootfs"} if args.rootfs else {}),
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
    phases = {
        name: {k: statistics.median(line[k] for line in runs) for k in runs[0]}
        for name, runs in lines.items()
    }
    for name, medians_of in phases.items():
        print(
            f"{name}: a run's timeline (medians): "
            + ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in medians_of.items())
        )
    goals = goals_of(medians)
    code = print_goals(goals)
    if args.record:
        results = {"runs_s": times, "medians_s": medians, "breakdown": parts, "timeline_medians_s": phases,
                   "timelines_s": lines, "load_average": os.getloadavg(),
                   "load_average_before": load_before}  # fmt: skip
        arguments = {"image": args.image, "reps": args.reps, "stress": args.stress, "rootfs": args.rootfs}
        write(args.record, "bench_run_overhead", arguments, results, goals)
    return code


if __name__ == "__main__":
    sys.exit(main())
