"""Fixtures of the run tests."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator

import pytest

from tests.oci.infra import build_offline


@pytest.fixture(scope="module")
def own_image(images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The python test image under a name and ID of its own (a label unique to the module): no
    other test pushes, pulls or tags it, so what the engine says of it (its ID, its RepoDigests)
    stays as the module found it. Removed at the end."""
    token = secrets.token_hex(6)
    ctx = tmp_path_factory.mktemp("own-image")
    (ctx / "Dockerfile").write_text(f'FROM {images["python"]}\nLABEL org.example.own="{token}"\n')
    tag = f"imagegate-own/python:{token}"
    build_offline(ctx, tag)
    try:
        yield tag
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
