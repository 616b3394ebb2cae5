#!/usr/bin/env python3
"""Build the image of imagegate (image/Dockerfile) into the Docker engine.

No image is pulled: the base is a Debian 12 root made with mmdebstrap from the machine's own
Debian sources and `docker import`ed (kept, tagged by its package list, for the next build);
imagegate's wheel is built from this tree and every dependency downloaded as a wheel here, so the
build itself needs no network.

Usage: python scripts/build-image.py [--tag TAG] [--suite SUITE]
  --tag    the image's tag (default: imagegate:VERSION)
  --suite  the Debian release of the root: bookworm (12, Python 3.11; the default) or trixie
           (13, Python 3.13)
  --base-only  make (or find) the Debian root alone (CI makes both beside its tests)
Needs: mmdebstrap, a Docker engine (DOCKER_HOST is honoured), pip's index for the dependencies.
Prints the tag built.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "images"))
from build import PLATFORMS, debian_mirrors, image_exists  # noqa: E402  (as the test images use them)

# python3-venv for the install; bubblewrap, libseccomp2 and util-linux (prlimit) for --driver rootfs;
# passwd for its user (Debian 13's apt variant leaves it out)
PACKAGES = ["python3", "python3-venv", "bubblewrap", "libseccomp2", "util-linux", "passwd", "ca-certificates"]
# Debian release -> its python3 (the dependencies' wheels are downloaded for it)
PYTHONS = {"bookworm": "3.11", "trixie": "3.13"}


def sh(*argv: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(
            f"build-image: {argv[0]} {argv[1]} failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
        )
    return done.stdout.strip()


def base_image(tmp: Path, suite: str) -> str:
    tag = "imagegate-base:" + suite + "-" + hashlib.sha256(",".join(PACKAGES).encode()).hexdigest()[:12]
    if image_exists(tag):
        return tag
    root = tmp / "root.tar"
    sh("mmdebstrap", "--quiet", "--variant=apt", "--include=" + ",".join(PACKAGES), suite, str(root),
       *debian_mirrors(suite))  # fmt: skip
    sh("docker", "import", str(root), tag)
    return tag


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", help="the image's tag (default: imagegate:VERSION)")
    parser.add_argument(
        "--suite", choices=sorted(PYTHONS), default="bookworm", help="the root's Debian release"
    )
    parser.add_argument("--base-only", action="store_true", help="make (or find) the Debian root alone")
    args = parser.parse_args()
    if args.base_only:
        with tempfile.TemporaryDirectory(prefix="imagegate-base-") as t:
            print(base_image(Path(t), args.suite))
        return 0
    with tempfile.TemporaryDirectory(prefix="imagegate-image-") as t:
        tmp = Path(t)
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", "-q"]
        subprocess.run([*pip, "--no-deps", "-w", str(tmp / "dist"), str(ROOT)], check=True)
        (wheel,) = (tmp / "dist").glob("imagegate-*.whl")
        # Every dependency as a wheel, for the root's Python (whatever this host's is).
        python = PYTHONS[args.suite]
        download = [sys.executable, "-m", "pip", "--disable-pip-version-check", "download", "-q",
                    "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
                    *(f"--platform={p}" for p in PLATFORMS), "-d", str(tmp / "ctx" / "wheels"), str(wheel)]  # fmt: skip
        subprocess.run(download, check=True)
        (tmp / "ctx" / "Dockerfile").write_bytes((ROOT / "image" / "Dockerfile").read_bytes())
        version = wheel.name.split("-")[1]
        tag = args.tag or f"imagegate:{version.replace('+', '-')}"
        # The classic builder, with no network: everything the RUN installs is in the context.
        sh("docker", "build", "-q", "--force-rm", "--network", "none", "--build-arg", f"BASE={base_image(tmp, args.suite)}",
           "-t", tag, str(tmp / "ctx"), env=dict(os.environ, DOCKER_BUILDKIT="0"))  # fmt: skip
    print(tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
