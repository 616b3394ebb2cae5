#!/usr/bin/env python3
"""The tests' cluster, from one command: the Kubernetes control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler v1.33.13) and kwok's fake nodes, built by
scripts/consumers.py at the versions tests/consumers/{kube,kwok}/go.mod pin (cached outside the
clone), started as the tests start them (tests/kube/apiserver.py, tests/kube/kwok.py).

  up      start it, print the kubeconfig to use (KUBECONFIG=...), wait for Ctrl-C, then stop
          everything and remove its folder
  test    the cluster tests (tests/kube/test_apiserver.py, test_controllers.py,
          test_fleet_kwok.py, test_pod_on_a_real_node.py, with the kubelet and CNI plugins it
          runs, and, where present, test_admission_*.py) with pytest, then a dated
          record: benchmarks/records/YYYY-MM-DD-HHMM-cluster.json (each tool's build: cached or
          its time and size; the time to a ready control plane with kwok, cold processes and
          warm cache; each test's outcome and time)

Usage: .venv/bin/python scripts/cluster.py [up | test]
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


def test() -> int:
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
    commit = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "src", "tests", "scripts"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    now = dt.datetime.now(dt.timezone.utc)
    record = {
        "date": now.isoformat(timespec="seconds"),
        "commit": commit.stdout.strip(),
        "tree": "dirty" if dirty.stdout.strip() else "clean",
        "cores": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "builds": built,
        "ready_seconds_cached": seconds,
        "tests_seconds": round(time.monotonic() - start, 1),
        "exit": done.returncode,
        "tests": cases,
    }
    path = ROOT / "benchmarks" / "records" / f"{now:%Y-%m-%d-%H%M}-cluster.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    passed = sum(c["outcome"] == "passed" for c in cases)
    print(
        f"cluster: ready in {seconds} s (cached); {passed}/{len(cases)} passed; record {path.relative_to(ROOT)}"
    )
    return done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("up", "test"))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped and removed, as on Ctrl-C
    return up() if args.what == "up" else test()


if __name__ == "__main__":
    sys.exit(main())
