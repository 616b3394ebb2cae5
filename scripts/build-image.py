#!/usr/bin/env python3
"""Build the image of imagegate (image/Dockerfile) into the Docker engine.

No image is pulled: the base is a Debian 12 root made with mmdebstrap from the machine's own
Debian sources and `docker import`ed (kept, tagged by its package list, for the next build);
imagegate's wheel is built from this tree and every dependency downloaded as a wheel here, so the
build itself needs no network.

Usage: python scripts/build-image.py [--tag TAG]    (default: imagegate:VERSION)
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
from build import debian_mirrors  # noqa: E402  (the machine's Debian sources, as the test images use)

# python3-venv for the install; bubblewrap, libseccomp2 and util-linux (prlimit) for --driver rootfs
PACKAGES = ["python3", "python3-venv", "bubblewrap", "libseccomp2", "util-linux", "ca-certificates"]
SUITE = "bookworm"


def sh(*argv: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(
            f"build-image: {argv[0]} {argv[1]} failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
        )
    return done.stdout.strip()


def base_image(tmp: Path) -> str:
    tag = "imagegate-base:" + SUITE + "-" + hashlib.sha256(",".join(PACKAGES).encode()).hexdigest()[:12]
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0:
        return tag
    root = tmp / "root.tar"
    sh("mmdebstrap", "--quiet", "--variant=apt", "--include=" + ",".join(PACKAGES), SUITE, str(root),
       *debian_mirrors(SUITE))  # fmt: skip
    sh("docker", "import", str(root), tag)
    return tag


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", help="the image's tag (default: imagegate:VERSION)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="imagegate-image-") as t:
        tmp = Path(t)
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", "-q"]
        subprocess.run([*pip, "--no-deps", "-w", str(tmp / "dist"), str(ROOT)], check=True)
        (wheel,) = (tmp / "dist").glob("imagegate-*.whl")
        # Every dependency as a wheel, for the Debian 12 Python this host shares (3.11, x86_64).
        subprocess.run([*pip, "-w", str(tmp / "ctx" / "wheels"), str(wheel)], check=True)
        (tmp / "ctx" / "Dockerfile").write_bytes((ROOT / "image" / "Dockerfile").read_bytes())
        version = wheel.name.split("-")[1]
        tag = args.tag or f"imagegate:{version.replace('+', '-')}"
        # The classic builder, with no network: everything the RUN installs is in the context.
        sh("docker", "build", "-q", "--force-rm", "--network", "none", "--build-arg", f"BASE={base_image(tmp)}",
           "-t", tag, str(tmp / "ctx"), env=dict(os.environ, DOCKER_BUILDKIT="0"))  # fmt: skip
    print(tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
