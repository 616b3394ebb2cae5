"""Where a bare machine's set-up minutes go: each part of `scripts/setup.sh` (and .ci/run's npm
tools) done from nothing, beside the machine's own caches, and timed.

- `apt`: every Debian package the set-up installs, with all it depends on, installed into a bare
  Debian 12 (mmdebstrap minbase) from nothing, less the same bootstrap without them;
- `venv`: a new virtual environment and `pip install -e '.[test]'` with an empty pip cache;
- `npm`: the three npm tools of .ci/run with an empty npm cache;
- `images`: tests/images/build.py's default set (what the blocking CI runs) built by a private
  Docker engine (its own data root and socket) with empty wheel and pip caches, image by image
  in the order build.py takes them; the conformance images (`--all`) are timed with
  `--conformance`.

Then the sum, beside the 45 minutes the guide gives a bare machine's whole CI (set-up and tests;
the tests' own minutes come from a CI record, `--tests-s`).

Usage: .venv/bin/python benchmarks/bench_setup.py [--conformance] [--tests-s S] [--record FILE]
Needs root (a second dockerd), the network (Debian, PyPI, npm), ~20 GB free under $TMPDIR.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 45 * 60  # the guide's limit for a bare machine's whole CI
NPM_TOOLS = ("tests/attest/sigstore_js", "tests/policies/tools", "tests/report/sarif_tool")


def apt_packages() -> list[str]:
    """The packages scripts/engines.sh installs when their commands are missing, and the list in
    .ci/apt-packages.txt."""
    text = (ROOT / "scripts" / "engines.sh").read_text()
    named = [w.split("+=(")[1].rstrip(")") for w in text.split() if "need_pkgs+=(" in w and "$pkg" not in w]
    listed = (ROOT / ".ci" / "apt-packages.txt").read_text().split()
    return sorted({*named, *(p for p in listed if not p.startswith("#"))})


def timed(what: str, fn: object, results: dict[str, object]) -> float:
    t0 = time.monotonic()
    extra = fn()  # type: ignore[operator]
    took = round(time.monotonic() - t0, 1)
    results[what] = {"seconds": took, **(extra or {})}
    print(f"{what}: {took:.0f} s {extra or ''}", flush=True)
    return took


def apt(tmp: Path) -> dict[str, object]:
    """A bare Debian 12 (mmdebstrap minbase, into a tarball) with and without the packages: the
    difference is what installing them from nothing costs (download, unpack, configure)."""
    sys.path.insert(0, str(ROOT / "tests" / "images"))
    import build  # type: ignore[import-not-found]

    pkgs = apt_packages()

    def bootstrap(include: list[str], out: str) -> float:
        t0 = time.monotonic()
        subprocess.run(
            ["mmdebstrap", "--quiet", "--variant=minbase", *(["--include=" + ",".join(include)] if include else []),
             "bookworm", str(tmp / out), *build.debian_mirrors()],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        took = time.monotonic() - t0
        (tmp / out).unlink()
        return took

    base = bootstrap([], "minbase.tar")
    full = bootstrap(pkgs, "with-packages.tar")
    return {"named": pkgs, "minbase_s": round(base, 1), "minbase_and_packages_s": round(full, 1),
            "packages_s": round(full - base, 1)}  # fmt: skip


def venv(tmp: Path) -> dict[str, object]:
    env = {**os.environ, "PIP_NO_CACHE_DIR": "1", "XDG_CACHE_HOME": str(tmp / "xdg")}
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True)
    pip = [str(tmp / "venv" / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run([*pip, "-e", f"{ROOT}[test]"], check=True, env=env, stdout=subprocess.DEVNULL)
    return {}


def npm(tmp: Path) -> dict[str, object]:
    for tool in NPM_TOOLS:
        folder = tmp / "npm" / Path(tool).name
        folder.mkdir(parents=True)
        shutil.copy(ROOT / tool / "package.json", folder)
        subprocess.run(
            ["npm", "install", "--silent", "--no-audit", "--no-fund", "--cache", str(tmp / "npm-cache"),
             "--prefix", str(folder)],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    return {}


def private_engine(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    sock = f"unix://{tmp}/docker.sock"
    tmp.mkdir(parents=True)
    with open(tmp / "dockerd.log", "wb") as log:
        proc = subprocess.Popen(
            ["dockerd", "--host", sock, "--data-root", str(tmp / "data"), "--exec-root", str(tmp / "exec"),
             "--pidfile", str(tmp / "docker.pid"), "--iptables=false", "--ip6tables=false", "--bridge=none",
             "--exec-opt", "native.cgroupdriver=cgroupfs"],
            stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
    for _ in range(60):
        if subprocess.run(["docker", "-H", sock, "version"], capture_output=True).returncode == 0:
            return proc, sock
        time.sleep(1)
    proc.kill()
    raise SystemExit(
        f"bench_setup: the private engine did not start: {(tmp / 'dockerd.log').read_text()[-2000:]}"
    )


def images(tmp: Path, conformance: bool, results: dict[str, object]) -> dict[str, object]:
    sys.path.insert(0, str(ROOT / "tests" / "images"))
    import build  # type: ignore[import-not-found]

    names = [n for n in {**build.RECIPES, **build.REAL_RECIPES} if conformance or n not in build.CONFORMANCE]
    engine, sock = private_engine(tmp / "engine")
    env = {
        **os.environ,
        "DOCKER_HOST": sock,
        "IMAGEGATE_TEST_CACHE": str(tmp / "test-cache"),
        "XDG_CACHE_HOME": str(tmp / "xdg-images"),
    }
    each: dict[str, float] = {}
    try:
        for name in names:
            t0 = time.monotonic()
            subprocess.run(
                [sys.executable, str(ROOT / "tests" / "images" / "build.py"), name],
                check=True, env=env, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            each[name] = round(time.monotonic() - t0, 1)
            print(f"  image {name}: {each[name]:.0f} s", flush=True)
    finally:
        engine.terminate()
        engine.wait(60)
        # the engine leaves its network namespace mounted under its exec root
        mounts = [ln.split()[1] for ln in Path("/proc/mounts").read_text().splitlines()]
        for m in sorted((m for m in mounts if m.startswith(str(tmp))), key=len, reverse=True):
            subprocess.run(["umount", "-l", m], check=False)
    return {"each": each}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conformance", action="store_true", help="the conformance images too")
    parser.add_argument("--tests-s", type=float, help="the tests' own seconds (from a CI record)")
    parser.add_argument("--record", type=Path, help="write the record here (JSON)")
    parser.add_argument(
        "--skip", action="append", default=[], help="a part not to time (apt, venv, npm, images)"
    )
    args = parser.parse_args()
    results: dict[str, object] = {}
    base = Path(os.environ.get("TMPDIR", "/tmp"))
    with tempfile.TemporaryDirectory(prefix="bench-setup-", dir=base, ignore_cleanup_errors=True) as t:
        tmp = Path(t)
        parts = {
            "apt": lambda: apt(tmp),
            "venv": lambda: venv(tmp),
            "npm": lambda: npm(tmp),
            "images": lambda: images(tmp, args.conformance, results),
        }
        total = sum(timed(k, fn, results) for k, fn in parts.items() if k not in args.skip)
        if "apt" in results:  # the bootstraps' own time is no part of a set-up
            total += float(results["apt"]["packages_s"]) - float(results["apt"]["seconds"])  # type: ignore[index]
    results["setup_s"] = round(total, 1)
    goals = []
    if args.tests_s is not None:
        whole = total + args.tests_s
        results["tests_s"] = args.tests_s
        goals.append(
            record.Goal(
                "a bare machine's CI: set-up from nothing and the tests",
                f"<= {BUDGET_S // 60} min",
                f"{whole / 60:.1f} min (set-up {total / 60:.1f}, tests {args.tests_s / 60:.1f})",
                whole <= BUDGET_S,
            )
        )
    if args.record:
        record.write(args.record, "bench_setup", vars(args) | {"record": str(args.record)}, results, goals)
    print(json.dumps(results, indent=2))
    return record.print_goals(goals)


if __name__ == "__main__":
    sys.exit(main())
