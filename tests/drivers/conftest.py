"""Roots for the rootfs driver's tests: a real image's files as the engine itself lays them out
(`docker export` of a container, unpacked by tar), with its config from `docker image inspect`."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from imagegate.drivers.rootfs import PreparedRoot
from tests.oci.infra import Registry, sh, start_registry


def export_root(ref: str, dest: Path) -> PreparedRoot:
    """The image's root as the engine exports it: real bytes, but not verified (the rootfs
    driver's own unpacking verifies; these tests look at the sandbox and the driver)."""
    dest.mkdir(parents=True)
    cid = subprocess.run(["docker", "create", ref], capture_output=True, text=True, check=True).stdout.strip()
    try:
        export = subprocess.Popen(["docker", "export", cid], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(dest)], stdin=export.stdout, check=True)
        assert export.wait() == 0
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    inspect = json.loads(
        subprocess.run(["docker", "image", "inspect", ref], capture_output=True, check=True).stdout
    )[0]
    return PreparedRoot(
        dest, inspect["Config"] or {}, inspect["Id"], None, f"docker-daemon:{ref}", platform="linux/amd64"
    )


@pytest.fixture(scope="session")
def exported(
    images: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], PreparedRoot]]:
    """name -> that test image's exported root (made once per session)."""
    made: dict[str, PreparedRoot] = {}
    base = tmp_path_factory.mktemp("roots")

    def get(name: str) -> PreparedRoot:
        if name not in made:
            made[name] = export_root(images[name], base / name)
        return made[name]

    yield get
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def root_cache(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a CLI run whose root cache is this session's (never the user's)."""
    return {"XDG_CACHE_HOME": str(tmp_path_factory.mktemp("xdg-cache"))}


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("registry"))
    yield reg
    reg.stop()


def push(image: str, ref: str) -> str:
    """`image` of the engine pushed by the engine as `ref`; the tag is dropped again (the image
    stays)."""
    sh("docker", "tag", image, ref)
    try:
        sh("docker", "push", "-q", ref)
    finally:
        subprocess.run(["docker", "rmi", ref], capture_output=True)
    return ref


@pytest.fixture(scope="session")
def pushed_vllm(images: dict[str, str], registry: Registry) -> str:
    """The vllm-like test image pushed by the engine into a registry on 127.0.0.1."""
    return push(images["vllm-like"], f"{registry.host}/team/vllm:0.11")
