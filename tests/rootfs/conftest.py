"""Fixtures: a registry on 127.0.0.1, the engine-built layered image pushed to it, a root cache."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagegate.rootfs import RootCache
from tests.oci.infra import Registry, sh, start_registry
from tests.rootfs.infra import build_layered_image


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("rootfs-registry"))
    yield reg
    reg.stop()


@pytest.fixture(scope="session")
def layered(engine: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The multi-layer image built by the engine from a real Dockerfile."""
    return build_layered_image(tmp_path_factory.mktemp("layered"))


@pytest.fixture(scope="session")
def layered_ref(layered: str, registry: Registry) -> str:
    """`layered`, pushed by the engine to the registry: the docker:// source string."""
    ref = f"{registry.host}/rootfs/layered:1"
    sh("docker", "tag", layered, ref)
    sh("docker", "push", "-q", ref)
    subprocess.run(["docker", "rmi", ref], capture_output=True)
    return f"docker://{ref}"


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[RootCache]:
    with RootCache(str(tmp_path / "cache"), 1 << 30) as c:
        yield c
