#!/usr/bin/env python3
"""The fleet commands at fleet scale, on a real control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler v1.33.13, built by scripts/consumers.py) with kwok's fake
GPU nodes (tests/kube/kwok.py): `fleet render`, `fleet collect` (after the rendered Jobs were
applied and ran), `fleet report` over every node's attempt, and `fleet run --jobs N`, each timed
(wall seconds, peak RSS) at a small fleet and at the full one, the second side by side with what
a user would otherwise run: `kubectl logs` of each node check Pod, one after another.

kwok runs nothing, so the benchmark plays each node's part, as the tests do
(tests/kube/kwok.NodePlayer: the real controller's output for the Job's bundle and event key, run
on this machine, where no GPU is, so every node is unfit; that is the same work for the fleet
commands as a fit node's). The players share the machine with what is timed: the load is in the
record.

Goals: the report over the full fleet within 30 s ("seconds, not minutes"); each command's peak
RSS at the full fleet at most 1.5x its RSS at the small one (flat in the node count, not
proportional: 10x the nodes); `fleet collect` within 3x the `kubectl logs` loop (it reads the Pod,
the Secret and the log of each node, checks, writes and signs an attempt per node).

Usage: benchmarks/bench_fleet.py [--nodes 500] [--small 50] [--jobs 16] [--record F]
(needs Go and the module proxy for a first build of the control plane and kwok, cached after;
GNU time, Debian's `time`, for the peak RSS).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from record import Goal, print_goals, write

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.kube.apiserver import ApiServer, started  # noqa: E402 - the harness of the tests
from tests.kube.kwok import Kwok, NodePlayer  # noqa: E402
from tests.kube.kwok import started as kwok_started  # noqa: E402

DIGEST = "sha256:" + "6e" * 32
IMAGE = f"registry.example/team/torch@{DIGEST}"
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}
LIMIT_S = 3600


@dataclass
class Timed:
    seconds: float
    rss_mib: float
    rc: int
    stdout: str
    stderr: str


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> Timed:
    """One command's wall time and peak RSS, its output kept in files (a fleet's report is large).
    The RSS is GNU time's (%M): a child forked from this process would count this process's own
    pages in its ru_maxrss (Linux keeps the high-water mark across exec), time's are a few MB."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        p = subprocess.run(["/usr/bin/time", "-f", "%M", *argv], stdout=out, stderr=err, env=env, cwd=cwd)
        seconds = time.monotonic() - start
        out.seek(0), err.seek(0)
        stderr = err.read().decode()
        head, _, kib = stderr.rstrip("\n").rpartition("\n")
        return Timed(round(seconds, 2), round(int(kib) / 1024, 1), p.returncode, out.read().decode(), head)


def _why(done: Timed) -> str:
    """What a fleet command that did not end as expected said: its stderr's end and each node
    without a result, with why."""
    try:
        nodes = json.loads(done.stdout)["nodes"]
    except (ValueError, KeyError):
        nodes = []
    lost = [f"{n['name']}: {'; '.join(n['why'])}" for n in nodes if n.get("check") == "ERROR"]
    return f"exit {done.rc}: {done.stderr[-1500:]}\n" + "\n".join(lost[:20])


def imagegate(*args: str) -> list[str]:
    return [sys.executable, "-m", "imagegate", *args]


def listings(api: ApiServer, work: Path) -> list[str]:
    for what, args in (("nodes", ["get", "nodes"]), ("pods", ["get", "pods", "-A"])):
        got = api.kubectl_run(*args, "-o", "json", timeout=300)
        assert got.returncode == 0, got.stderr
        (work / f"{what}.json").write_text(got.stdout)
    return ["--nodes", str(work / "nodes.json"), "--pods", str(work / "pods.json")]


def fleet_at(kwok: Kwok, size: int, jobs: int, work: Path) -> dict[str, Any]:
    """Render, apply, play, collect, report, the kubectl logs loop, then run, at this size."""
    api, env = kwok.api, {**kwok.api.env(), "COLUMNS": "200"}
    work.mkdir()
    assert (
        subprocess.run(imagegate("keygen", "--out", "ci"), cwd=work, env=env, capture_output=True).returncode
        == 0
    )
    ns = api.namespace("restricted")
    given = listings(api, work)
    render = timed(imagegate("fleet", "render", IMAGE, *given, "-n", ns), env, work)
    assert render.rc == 0, render.stderr[-2000:]
    (work / "rendered.yaml").write_text(render.stdout)
    started_at = time.monotonic()
    with NodePlayer(kwok, ns, IMAGE, workers=2, poll_s=1.0) as played:
        applied = api.kubectl_run("apply", "-f", str(work / "rendered.yaml"), timeout=600)
        assert applied.returncode == 0, applied.stderr[-2000:]
        deadline = time.monotonic() + LIMIT_S
        while not played.errors and time.monotonic() < deadline:
            got = api.kubectl_run("get", "jobs", "-n", ns, "-o", "json", timeout=300)
            jobs_now = json.loads(got.stdout)["items"] if got.returncode == 0 else []
            if len(jobs_now) == size and all(j.get("status", {}).get("succeeded") for j in jobs_now):
                break
            time.sleep(2)
    jobs_ran_s = round(time.monotonic() - started_at, 1)
    assert len(played.placed) == size, (len(played.placed), size)
    collect = timed(
        imagegate(
            "fleet", "collect", IMAGE, *given, "-n", ns, "--key", "ci.key", "--format", "json", "-o", "out"
        ),
        env,
        work,
    )
    assert collect.rc == 1, _why(collect)  # unfit: no GPU where the controller ran
    attempts = json.loads(collect.stdout)["attempts"]
    assert len(attempts) == size, len(attempts)
    pairs = [f"{n}={a}" for n, a in sorted(attempts.items())]
    report = timed(imagegate("fleet", "report", *pairs, "--key", "ci.pub", "--format", "json"), env, work)
    assert report.rc == 1, report.stderr[-2000:]
    verified = {n["evidence"] for n in json.loads(report.stdout)["nodes"]}
    assert verified == {"verified"}, verified
    loop_start = time.monotonic()
    for pod in played.placed:
        got = api.kubectl_run("logs", pod, "-n", ns, "-c", "probe")
        assert got.returncode == 0, got.stderr
    logs_loop_s = round(time.monotonic() - loop_start, 2)
    api.kubectl_run("delete", "namespace", ns, "--wait=false")
    run_ns = api.namespace("restricted")
    with NodePlayer(kwok, run_ns, IMAGE, workers=2, poll_s=1.0):
        run = timed(
            imagegate(
                "fleet", "run", IMAGE, *given, "-n", run_ns, "--jobs", str(jobs), "--key", "ci.key",
                "--timeout", str(LIMIT_S // 2), "--format", "json", "-o", "run-out",
            ),
            env,
            work,
        )  # fmt: skip
    assert run.rc == 1, _why(run)
    ran = json.loads(run.stdout)
    assert len(ran["attempts"]) == size, run.stderr[-2000:]
    api.kubectl_run("delete", "namespace", run_ns, "--wait=false")
    return {
        "nodes": size,
        "render": {"seconds": render.seconds, "rss_mib": render.rss_mib},
        "jobs_applied_and_played_s": jobs_ran_s,
        "collect": {"seconds": collect.seconds, "rss_mib": collect.rss_mib},
        "report": {"seconds": report.seconds, "rss_mib": report.rss_mib},
        "kubectl_logs_loop_s": logs_loop_s,
        "run": {"seconds": run.seconds, "rss_mib": run.rss_mib, "jobs": jobs},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--small", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--record", type=Path)
    args = parser.parse_args()
    # SIGTERM ends the benchmark as Ctrl-C does: the control plane and kwok stopped, folders removed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if not 0 < args.small < args.nodes:
        parser.error("--small must be between 0 and --nodes")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="imagegate-bench-fleet-") as tmp:
        t0 = time.monotonic()
        with (
            started(Path(tmp) / "control-plane", controllers=True) as api,
            kwok_started(api, Path(tmp) / "kwok") as kwok,
        ):
            results["cluster_ready_s"] = round(time.monotonic() - t0, 1)
            made = 0
            for size in (args.small, args.nodes):
                names = [f"gpu-{i:04d}" for i in range(made, size)]
                t = time.monotonic()
                kwok.nodes(names, labels=H100, allocatable={"nvidia.com/gpu": "8"})
                kwok.ready([f"gpu-{i:04d}" for i in range(size)], timeout=600)
                made = size
                print(f"{size} nodes Ready ({time.monotonic() - t:.1f} s for {len(names)} new)", flush=True)
                results[str(size)] = at = fleet_at(kwok, size, args.jobs, Path(tmp) / f"fleet-{size}")
                print(json.dumps(at), flush=True)
    small, full = results[str(args.small)], results[str(args.nodes)]
    ratio = round(full["collect"]["seconds"] / full["kubectl_logs_loop_s"], 2)
    results["collect_over_kubectl_logs"] = ratio
    goals = [
        Goal(
            f"fleet report over {args.nodes} nodes",
            "<= 30 s",
            f"{full['report']['seconds']} s",
            full["report"]["seconds"] <= 30,
        ),
        *(
            Goal(
                f"fleet {cmd} peak RSS at {args.nodes} nodes / at {args.small}",
                "<= 1.5x",
                f"{full[cmd]['rss_mib']} / {small[cmd]['rss_mib']} MiB = "
                f"{full[cmd]['rss_mib'] / small[cmd]['rss_mib']:.2f}x",
                full[cmd]["rss_mib"] <= 1.5 * small[cmd]["rss_mib"],
            )
            for cmd in ("render", "collect", "report", "run")
        ),
        Goal(
            f"fleet collect at {args.nodes} nodes / kubectl logs of each Pod",
            "<= 3x",
            f"{full['collect']['seconds']} / {full['kubectl_logs_loop_s']} s = {ratio}x",
            ratio <= 3,
        ),
    ]
    if args.record:
        write(args.record, "fleet", vars(args), results, goals)
    return print_goals(goals)


if __name__ == "__main__":
    sys.exit(main())
