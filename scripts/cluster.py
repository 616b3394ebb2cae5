#!/usr/bin/env python3
"""The tests' cluster, from one command: the Kubernetes control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler v1.33.13) and kwok's fake nodes, built by
scripts/consumers.py at the versions tests/consumers/{kube,kwok}/go.mod pin (cached outside the
clone), started as the tests start them (tests/kube/apiserver.py, tests/kube/kwok.py).

  up      start it, print the kubeconfig to use (KUBECONFIG=...), wait for Ctrl-C, then stop
          everything and remove its folder
  ready   start it, print the seconds to ready, stop it
  test    the cluster tests (tests/kube/test_apiserver.py, test_controllers.py,
          test_fleet_kwok.py, test_pod_on_a_real_node.py, with the kubelet and CNI plugins it
          runs, and, where present, test_admission_*.py) with pytest, then a dated
          record: benchmarks/records/YYYY-MM-DD-HHMM-cluster.json (each tool's build: cached or
          its time and size; the time to a ready control plane with kwok, cold processes and
          warm cache; each test's outcome and time); with --bare, first the tools built into an
          empty cache (Go toolchain and modules downloaded, nothing shared) and a cluster started
          from those binaries: the time from nothing cached to ready (the empty cache removed after)

Usage: .venv/bin/python scripts/cluster.py [up | ready | test [--bare]]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import load_script  # noqa: E402 - the tests' harness, run from the repository root
from tests.kube.apiserver import started  # noqa: E402
from tests.kube.kwok import started as kwok_started  # noqa: E402

TESTS = [
    "tests/kube/test_apiserver.py",
    "tests/kube/test_controllers.py",
    "tests/kube/test_fleet_kwok.py",
    "tests/kube/test_pod_on_a_real_node.py",
]


def builds() -> dict[str, object]:
    """Each tool built or found: the build's record, and whether it was cached."""
    script = load_script(ROOT / "scripts" / "consumers.py")
    return {t.name: script.build(t) for t in (script.KUBE, script.KWOK, script.KUBELET, script.CNI)}


def ready_time(folder: Path) -> float:
    """Seconds from nothing running to a control plane with its controllers and kwok, ready."""
    start = time.monotonic()
    with started(folder / "control-plane", controllers=True) as api, kwok_started(api, folder / "kwok"):
        return round(time.monotonic() - start, 1)


def up() -> int:
    with tempfile.TemporaryDirectory(prefix="imagegate-cluster-") as tmp:
        built = builds()
        print(
            ", ".join(
                f"{n} {b['version']} ({'cached' if b['cached'] else 'built'})" for n, b in built.items()
            )
        )
        with (
            started(Path(tmp) / "control-plane", controllers=True) as api,
            kwok_started(api, Path(tmp) / "kwok") as kwok,
        ):
            print(f"ready: export KUBECONFIG={api.kubeconfig} PATH={Path(api.kubectl).parent}:$PATH")
            print(f"kwok manages the nodes annotated kwok.x-k8s.io/node=fake; its kubelet API: {kwok.server}")
            print("Ctrl-C stops everything and removes the folder", flush=True)
            try:
                signal.pause()
            except KeyboardInterrupt:
                print("stopping", flush=True)
    return 0


def ready() -> int:
    with tempfile.TemporaryDirectory(prefix="imagegate-cluster-") as tmp:
        print(json.dumps({"ready_seconds": ready_time(Path(tmp))}))
    return 0


def bare() -> dict[str, object]:
    """The tools built into an empty cache, then a cluster started from them: from nothing to ready."""
    with tempfile.TemporaryDirectory(prefix="imagegate-bare-cache-", dir=Path.home()) as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        start = time.monotonic()
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "consumers.py"), "build"]
            + [a for t in BARE_TOOLS for a in ("--tool", t)],
            cwd=ROOT,
            env=env,
            check=True,
        )
        built = time.monotonic() - start
        started_at = time.monotonic()
        out = subprocess.run(
            [sys.executable, __file__, "ready"], cwd=ROOT, env=env, check=True, capture_output=True, text=True
        )
        started_seconds = time.monotonic() - started_at
        records = {
            p.parent.name: json.loads(p.read_text())
            for p in sorted(Path(cache, "imagegate", "consumers").glob("*/build.json"))
        }
        return {
            "tools": BARE_TOOLS,
            "build_seconds": round(built, 1),
            "start_seconds": round(started_seconds, 1),
            "ready_seconds": json.loads(out.stdout.strip().splitlines()[-1])["ready_seconds"],
            "nothing_to_ready_seconds": round(built + started_seconds, 1),
            "builds": records,
        }


# what a cluster needs from nothing: its control plane and kwok (the kubelet and CNI are for the
# node test only, and are timed in the cached builds' records)
BARE_TOOLS = ["kube", "kwok"]


def test(from_nothing: bool) -> int:
    # the tree as it is when the run starts: what the tests import and build
    commit = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "src", "tests", "scripts"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    cold = bare() if from_nothing else None
    built = builds()
    with tempfile.TemporaryDirectory(prefix="imagegate-cluster-") as tmp:
        seconds = ready_time(Path(tmp))
        junit = Path(tmp) / "junit.xml"
        tests = TESTS + sorted(
            str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "kube").glob("test_admission_*.py")
        )
        start = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *tests],
            cwd=ROOT,
        )
        cases = [
            {
                "test": f"{c.get('classname', '').replace('.', '/')}.py::{c.get('name')}",
                "outcome": "failed"
                if c.find("failure") is not None or c.find("error") is not None
                else "skipped"
                if c.find("skipped") is not None
                else "passed",
                "seconds": float(c.get("time") or 0),
            }
            for c in ET.parse(junit).getroot().iter("testcase")
        ]
    now = dt.datetime.now(dt.timezone.utc)
    record = {
        "date": now.isoformat(timespec="seconds"),
        "commit": commit.stdout.strip(),
        "tree": "dirty" if dirty.stdout.strip() else "clean",
        "cores": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "builds": built,
        "ready_seconds_cached": seconds,
        **({"from_nothing": cold} if cold else {}),
        "tests_seconds": round(time.monotonic() - start, 1),
        "exit": done.returncode,
        "tests": cases,
    }
    path = ROOT / "benchmarks" / "records" / f"{now:%Y-%m-%d-%H%M}-cluster.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    passed = sum(c["outcome"] == "passed" for c in cases)
    if cold:
        print(f"cluster: from nothing cached to ready in {cold['nothing_to_ready_seconds']} s")
    print(
        f"cluster: ready in {seconds} s (cached); {passed}/{len(cases)} passed; record {path.relative_to(ROOT)}"
    )
    return done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("up", "ready", "test"))
    parser.add_argument(
        "--bare", action="store_true", help="test: first build into an empty cache and time nothing → ready"
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped and removed, as on Ctrl-C
    if args.what == "up":
        return up()
    return ready() if args.what == "ready" else test(args.bare)


if __name__ == "__main__":
    sys.exit(main())
