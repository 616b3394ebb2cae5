"""The wheels a GPU machine with no network needs to run imagegate's GPU acceptance
(scripts/gpu-acceptance.py: `run --driver rootfs` of an oci: layout, `complete`, `verify`,
`keygen`), derived from package metadata: imagegate's own requirements and all they require, as
installed here (the versions pinned), without the distributions those commands never import.

    python scripts/gpu-wheels.py                    # NAME==VERSION, one a line
    python scripts/gpu-wheels.py --download .whl    # the cp312 manylinux x86_64 wheels, into .whl
    python scripts/gpu-wheels.py --serve --download .whl   # and what scripts/gpu-serve.sh needs

tests/drivers/test_gpu_wheels.py runs those commands with every other installed distribution
made unimportable.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import subprocess
import sys

# Imported only by commands and stages the GPU acceptance does not run.
NOT_IMPORTED = {
    "docker": "the docker and podman drivers",
    "httpx": "registries (docker:// references, attach)",
    "pip-audit": "the vulnerability audit stage",
    "kubernetes-validate": "pod render",
}
# scripts/gpu-serve.sh: `transformers serve` as the vLLM 0.33.0 test image carries it, less what
# the GPU machine's own Python already holds (torch, tokenizers, huggingface-hub, accelerate, anyio,
# httpx, h11, click, idna, ...): the set its 2026-12-01 record ran with (pinned, no resolver there).
SERVE = (
    "transformers==5.20.2", "openai==3.57.0", "fastapi==0.136.3", "starlette==1.10.0", "uvicorn==0.54.0",
    "jiter==0.19.0", "distro==1.9.0", "sniffio==1.3.1", "python-multipart==0.0.34", "httpx2==2.16.2",
    "httpcore2==2.16.2", "truststore==0.10.5",
)  # fmt: skip
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(dist: md.Distribution) -> list[str]:
    """The names `dist` requires on Linux, CPython 3.10+, without extras."""
    out = []
    for req in dist.requires or []:
        name, _, marker = req.partition(";")
        if "extra" in marker or re.search(
            r"""(sys_platform|platform_system)\s*==\s*["'](win32|Windows|darwin|Darwin)""", marker
        ):
            continue
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", name)
        if m:
            out.append(m.group(1))
    return out


def closure(top: str = "imagegate") -> dict[str, str]:
    """name -> installed version, for every distribution `top` needs at run time (itself aside)."""
    found: dict[str, str] = {}
    todo = [n for n in _requirements(md.distribution(top)) if norm(n) not in NOT_IMPORTED]
    while todo:
        name = norm(todo.pop())
        if name in found:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # a requirement this platform's markers leave out (not installed here)
        found[name] = dist.version
        todo += _requirements(dist)
    return dict(sorted(found.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--download", metavar="DIR", help="fetch the wheels for CPython 3.12 on x86_64 Linux into DIR"
    )
    ap.add_argument("--serve", action="store_true", help="add what scripts/gpu-serve.sh needs (SERVE)")
    args = ap.parse_args()
    pins = ["%s==%s" % kv for kv in closure().items()] + (list(SERVE) if args.serve else [])
    if not args.download:
        print("\n".join(pins))
        return 0
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
            "3.12", "--implementation", "cp", "-d", args.download]  # fmt: skip
    for p in PLATFORMS:
        argv += ["--platform", p]
    return subprocess.run([*argv, *pins]).returncode


if __name__ == "__main__":
    sys.exit(main())
