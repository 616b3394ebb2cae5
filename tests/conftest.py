"""Shared fixtures: the real Docker engine, Podman's Docker API, the test images.

`.ci/run` starts the engines (scripts/engines.sh) and builds the images
(tests/images/build.py); the fixtures check they are there and build what is missing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import DOCKER_SOCK, PODMAN_SOCK

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def commands_not_stopped() -> Iterator[None]:
    """A test that stops the work in this process (a hard deadline does, as a signal would)
    leaves the next one free to read: the stop is the command's, and a test is one command."""
    yield
    from imagegate._support import interrupts

    interrupts._stop.clear()
    interrupts._hard_stopped = False


@pytest.fixture(scope="session", autouse=True)
def own_config_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test, and every CLI it starts, keeps its keys in a temporary config folder: never the
    user's (a passphrase-protected key there would otherwise make runs fail), never a key named by
    the environment the suite was started from."""
    folder = tmp_path_factory.mktemp("config")
    names = ("XDG_CONFIG_HOME", "IMAGEGATE_SIGNING_KEY", "IMAGEGATE_KEY_PASSWORD")
    saved = {k: os.environ.get(k) for k in names}
    os.environ["XDG_CONFIG_HOME"] = str(folder)
    for k in names[1:]:
        os.environ.pop(k, None)
    yield folder
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in this process for the test, as in a terminal, whatever the
    test runner inherited (started with SIGINT ignored, Python leaves it ignored); restored after."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _engine_ok(host: str) -> bool:
    return subprocess.run(["docker", "-H", host, "version"], capture_output=True, timeout=30).returncode == 0


@pytest.fixture(scope="session")
def engine() -> str:
    if not _engine_ok(DOCKER_SOCK):
        pytest.fail(f"no Docker engine at {DOCKER_SOCK}: run scripts/engines.sh (.ci/run does)")
    return DOCKER_SOCK


@pytest.fixture(scope="session")
def images(engine: str) -> dict[str, str]:
    """name -> reference of every test image, built if missing (cached by recipe hash)."""
    sys.path.insert(0, str(ROOT / "tests" / "images"))
    import build  # type: ignore[import-not-found]

    refs = {}
    for name in build.RECIPES:
        build.build(name)
        refs[name] = f"imagegate-test/{name}:latest"
    return refs


@pytest.fixture(scope="session")
def podman(images: dict[str, str]) -> Iterator[str]:
    if not _engine_ok(PODMAN_SOCK):
        pytest.fail(f"no Podman API at {PODMAN_SOCK}: run scripts/engines.sh (.ci/run does)")
    ref = images["vllm-like"]
    have = subprocess.run(["podman", "image", "exists", ref], capture_output=True).returncode == 0
    if not have:
        save = subprocess.Popen(["docker", "-H", DOCKER_SOCK, "save", ref], stdout=subprocess.PIPE)
        subprocess.run(["podman", "load", "-q"], stdin=save.stdout, check=True, capture_output=True)
        assert save.wait() == 0
    try:
        yield PODMAN_SOCK
    finally:
        if not have:  # leave Podman's store as the suite found it
            subprocess.run(["podman", "rmi", "-f", ref], capture_output=True)
