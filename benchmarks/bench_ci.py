"""The whole CI job, timed as CI runs it: a fresh clone of this repository's HEAD, then
`CI=true bash .ci/run` in it, quiet or beside `stress-ng --cpu N` (a busy machine), with where the
minutes go (.ci/run's own "ci: PHASE took Ns" lines) and the slowest test files (its JUnit).

Usage: .venv/bin/python benchmarks/bench_ci.py [--stress N] [--bare] [--record FILE]
The set-up it times is this machine's: cached when the engines, images and tools are here
already (the guide's goal: <= 20 min). With --bare it first makes the machine as a new one is
(<= 45 min): the engines stopped, the Debian packages the set-up installs purged (with what only
they needed) and the package lists dropped, the engines' stores, the test images' wheels and the
pip and npm caches removed. Nothing the machine came with is touched (Node.js, Go, the docker
client); the admission consumers' Go builds (scripts/consumers.py, not in CI) are kept.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record

ROOT = Path(__file__).resolve().parents[1]
CACHED_GOAL_S = 20 * 60
BARE_GOAL_S = 45 * 60
# What scripts/setup.sh installs that a new machine lacks (bench_setup.apt_packages() lists also
# what the machine has, e.g. curl, util-linux and libseccomp2, which are never purged).
NEW_PACKAGES = (
    "apache2-utils", "bubblewrap", "busybox-static", "chromium", "docker-registry", "docker.io",
    "isal", "mmdebstrap", "pigz", "podman", "skopeo", "umoci",
)  # fmt: skip
HOME_CACHES = (".cache/imagegate-test", ".cache/imagegate/roots", ".cache/pip", ".cache/pip-audit", ".npm")
# .ci/run's "ci: PHASE took Ns" and scripts/setup.sh's "setup: PART took Ns"
PHASE = re.compile(r"^(ci|setup): (.+) took (\d+)s$", re.M)


def slowest_files(junit: Path, n: int = 12) -> list[tuple[str, float]]:
    """The test files by the seconds their tests took (summed: three workers run side by side)."""
    per: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        per[(case.get("classname") or "").replace(".", "/") + ".py"] += float(case.get("time") or 0)
    return [(f, round(s, 1)) for f, s in per.most_common(n)]


def counts(junit: Path) -> dict[str, int]:
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    bad = sum(1 for c in cases if c.find("failure") is not None or c.find("error") is not None)
    skipped = sum(1 for c in cases if c.find("skipped") is not None)
    return {"tests": len(cases), "failed": bad, "skipped": skipped, "passed": len(cases) - bad - skipped}


STORES = (Path("/var/lib/docker"), Path("/var/lib/containers"))


def empty(path: Path) -> None:
    """Remove what is inside `path`: the mounts below it first (Podman mounts its overlay store on
    itself), deepest first; `path` itself stays, as it may be a mount point the machine provides."""
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith(f"{path}/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", m], check=False)
    if path.is_dir():
        for child in path.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)


def make_bare() -> None:
    """The machine as a new one is, for the set-up CI does (see the module's docstring)."""
    subprocess.run(["bash", str(ROOT / "scripts" / "engines.sh"), "stop"], check=True)
    for _ in range(120):  # the engines unmount their containers' layers as they stop
        if subprocess.run(
            ["pgrep", "-x", "dockerd|containerd|podman|docker-registry"], capture_output=True
        ).returncode:
            break
        time.sleep(0.5)
    else:
        raise SystemExit("bench_ci: the engines did not stop within 60 s; stop them, then run again")
    installed = [
        p for p in NEW_PACKAGES
        if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode == 0
    ]  # fmt: skip
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if installed:
        subprocess.run(
            ["apt-get", "purge", "-y", "-qq", *installed], check=True, env=env, stdout=subprocess.DEVNULL
        )
    subprocess.run(
        ["apt-get", "autoremove", "--purge", "-y", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL
    )
    subprocess.run(["apt-get", "clean"], check=True)
    home = Path.home()
    for path in [Path("/var/lib/apt/lists"), *STORES, *(home / c for c in HOME_CACHES)]:
        empty(path)
    left = [str(p) for p in STORES if p.exists() and any(p.iterdir())]
    if left:
        raise SystemExit(f"bench_ci: could not empty {', '.join(left)}; stop what uses it, then run again")
    Path("/var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    print(f"bare: purged {' '.join(installed) or 'nothing'}; stores and caches removed", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stress", type=int, default=0, help="run stress-ng --cpu N beside the job")
    parser.add_argument(
        "--bare", action="store_true", help="make the machine as a new one is first (needs root)"
    )
    parser.add_argument("--record", type=Path, help="write the record here (JSON)")
    args = parser.parse_args()
    stress = None
    if args.bare:
        make_bare()
    with tempfile.TemporaryDirectory(prefix="bench-ci-") as tmp:
        # mkdtemp's folder is the user's alone: the tests that run the CLI as another user
        # (setpriv) need to read the clone's venv, as in any CI checkout
        Path(tmp).chmod(0o755)
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        if args.stress:
            stress = subprocess.Popen(["stress-ng", "--cpu", str(args.stress), "--quiet"])
        t0 = time.monotonic()
        with open(Path(tmp) / "ci.log", "w") as log:
            rc = subprocess.run(
                ["bash", ".ci/run"],
                cwd=clone,
                env={**os.environ, "CI": "true"},
                stdout=log,
                stderr=subprocess.STDOUT,
            ).returncode
        took = time.monotonic() - t0
        load = [round(x, 2) for x in os.getloadavg()]
        if stress is not None:
            stress.terminate()
            stress.wait(30)
        text = (Path(tmp) / "ci.log").read_text(errors="replace")
        junit = clone / ".cache" / "ci" / "tests.xml"
        results = {
            "exit_code": rc,
            "seconds": round(took, 1),
            "stress_ng_cpu": args.stress,
            "load_average_at_end": load,
            "phases_s": {
                (m.group(2) if m.group(1) == "ci" else f"set-up: {m.group(2)}"): int(m.group(3))
                for m in PHASE.finditer(text)
            },
            "tests": counts(junit) if junit.is_file() else None,
            "slowest_files_s": slowest_files(junit) if junit.is_file() else None,
            "log_tail": text[-3000:],
        }
    setup = results["phases_s"].get("set-up", 0)  # type: ignore[union-attr]
    goal_s = BARE_GOAL_S if args.bare else CACHED_GOAL_S
    goals = [
        record.Goal("the CI job passes", "exit 0", f"exit {rc}", rc == 0),
        record.Goal(
            "the CI job on a new machine" if args.bare else "the CI job on this machine's caches",
            f"<= {goal_s // 60} min",
            f"{took / 60:.1f} min (set-up {setup} s){' beside stress-ng --cpu %d' % args.stress if args.stress else ''}",
            took <= goal_s,
        ),
    ]
    print({k: v for k, v in results.items() if k != "log_tail"})
    if args.record:
        record.write(args.record, "bench_ci", vars(args) | {"record": str(args.record)}, results, goals)
    return record.print_goals(goals)


if __name__ == "__main__":
    sys.exit(main())
