"""Session fixtures: the test image, three registries (official, mirror, Basic auth), the
image pushed by the engine and re-compressed into the mirror by skopeo."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.oci.infra import Layout, Registry, build_test_image, sh, skopeo, start_registry


@pytest.fixture(autouse=True)
def own_root_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test reads registries as a fresh machine would: its own root cache, so no verified pair
    another test recorded stands in for a blob this one tampers in place (tests/oci/
    test_known_blobs.py is where the pairs are the point)."""
    folder = tmp_path / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    return folder / "imagegate" / "roots"


@pytest.fixture(scope="session")
def oci_image(engine: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_test_image(tmp_path_factory.mktemp("image"))


@pytest.fixture(scope="session")
def official(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("official"))
    yield reg
    reg.stop()


@pytest.fixture(scope="session")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("mirror"))
    yield reg
    reg.stop()


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    d = tmp_path_factory.mktemp("auth")
    htpasswd = d / "htpasswd"
    htpasswd.write_text(sh("htpasswd", "-Bbn", "alice", "s3cret-pass"))
    reg = start_registry(d, htpasswd=htpasswd)
    yield reg
    reg.stop()


@dataclass(frozen=True)
class Pushed:
    ref: str  # registry reference (no transport)
    config_digest: str  # the image ID


@pytest.fixture(scope="session")
def pushed(oci_image: str, official: Registry) -> Pushed:
    """The test image pushed by the real engine (gzip layers, Docker schema 2)."""
    ref = f"{official.host}/team/app:1"
    sh("docker", "tag", oci_image, ref)
    sh("docker", "push", "-q", ref)
    image_id = sh("docker", "image", "inspect", "-f", "{{.Id}}", oci_image).strip()
    subprocess.run(["docker", "rmi", ref], capture_output=True)
    return Pushed(ref, image_id)


def _recompress(pushed: Pushed, mirror: Registry, workdir: Path, tag: str, *compress: str) -> str:
    """Decompress into a dir:, then push re-compressed into the mirror (ENGINE.md's recipe)."""
    d = workdir / "dir"
    skopeo("copy", "-q", "--src-tls-verify=false", "--dest-decompress", f"docker://{pushed.ref}", f"dir:{d}")
    ref = f"{mirror.host}/team/app:{tag}"
    skopeo(
        "copy", "-q", "--dest-tls-verify=false", "--dest-compress", *compress, f"dir:{d}", f"docker://{ref}"
    )
    return ref


@pytest.fixture(scope="session")
def recompressed(pushed: Pushed, mirror: Registry, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same image re-compressed (gzip -9) into the mirror: same config, other blobs."""
    args = ("--dest-compress-format", "gzip", "--dest-compress-level", "9")
    return _recompress(pushed, mirror, tmp_path_factory.mktemp("gzip9"), "gzip9", *args)


@pytest.fixture(scope="session")
def zstd_mirror(pushed: Pushed, mirror: Registry, tmp_path_factory: pytest.TempPathFactory) -> str:
    """gzip -> zstd: skopeo 1.9 writes an OCI manifest and a rewritten config for it."""
    return _recompress(
        pushed, mirror, tmp_path_factory.mktemp("zstd"), "zstd", "--dest-compress-format", "zstd"
    )


@pytest.fixture(scope="session")
def base_layout(pushed: Pushed, tmp_path_factory: pytest.TempPathFactory) -> Layout:
    """The pushed image as an OCI layout (skopeo), read-only: tests copy it before editing."""
    root = tmp_path_factory.mktemp("layout") / "oci"
    skopeo("copy", "-q", "--src-tls-verify=false", f"docker://{pushed.ref}", f"oci:{root}:1")
    return Layout(root)


@pytest.fixture
def layout(base_layout: Layout, tmp_path: Path) -> Layout:
    return base_layout.copy(tmp_path / "oci")
