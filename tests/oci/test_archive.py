"""docker-archive (legacy and OCI layouts, compressed), docker-daemon (dockerd and Podman's
Docker API), and archive members that try to escape."""

from __future__ import annotations

import bz2
import io
import json
import lzma
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import zstandard

from tests.helpers import PODMAN_SOCK, imagegate
from tests.oci.conftest import Pushed
from tests.oci.infra import Layout, sh

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def saved(oci_image: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("save") / "img.tar"
    sh("docker", "save", oci_image, "-o", str(path))
    return path


def _image_id(ref: str) -> str:
    return sh("docker", "image", "inspect", "-f", "{{.Id}}", ref).strip()


def test_legacy_docker_save(saved: Path, oci_image: str) -> None:
    r = imagegate("layers", f"docker-archive:{saved}", "--expect-config", _image_id(oci_image))
    assert r.returncode == 0, r.stderr
    assert "manifest: (none: legacy docker save archive)" in r.stdout
    assert "3/3 layers verified" in r.stdout


def _compress(kind: str, src: Path, dest: Path) -> None:
    with src.open("rb") as f, dest.open("wb") as out:
        if kind == "gzip":
            subprocess.run(["pigz", "-c"], stdin=f, stdout=out, check=True)
        elif kind == "zstd":
            zstandard.ZstdCompressor(level=3).copy_stream(f, out)
        else:
            with lzma.open(out, "wb") if kind == "xz" else bz2.open(out, "wb") as z:
                shutil.copyfileobj(f, z)


@pytest.mark.parametrize("kind", ["gzip", "zstd", "xz", "bzip2"])
def test_compressed_docker_save_is_read_in_one_pass_without_a_temp_copy(
    saved: Path, tmp_path: Path, oci_image: str, kind: str
) -> None:
    archive = tmp_path / f"img.tar.{kind}"
    _compress(kind, saved, archive)
    assert archive.read_bytes()[:2] != saved.read_bytes()[:2]  # really compressed
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    r = imagegate(
        "layers", f"docker-archive:{archive}", "--expect-config", _image_id(oci_image), "--format", "json",
        env={"TMPDIR": str(scratch)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["config"]["actual_digest"] == _image_id(oci_image)
    assert [x["status"] for x in doc["layers"]] == ["OK"] * 3
    # streamed front to back: nothing was decompressed into a temporary file
    assert list(scratch.iterdir()) == []


def test_oci_layout_archive_as_docker_25_writes_it(base_layout: Layout, tmp_path: Path) -> None:
    archive = tmp_path / "oci-save.tar"
    m = base_layout.manifest()
    legacy = [
        {
            "Config": f"blobs/sha256/{m['config']['digest'][7:]}",
            "RepoTags": ["team/app:1"],
            "Layers": [f"blobs/sha256/{x['digest'][7:]}" for x in m["layers"]],
        }
    ]
    with tarfile.open(archive, "w") as tf:
        tf.add(base_layout.root / "blobs", "blobs")
        tf.add(base_layout.root / "oci-layout", "oci-layout")
        tf.add(base_layout.root / "index.json", "index.json")
        data = json.dumps(legacy).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    r = imagegate("layers", f"docker-archive:{archive}", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["manifest_digest"] == base_layout.index()["manifests"][0]["digest"]
    assert [x["status"] for x in doc["layers"]] == ["OK"] * 3


def _with_member(saved: Path, dest: Path, info: tarfile.TarInfo, data: bytes = b"") -> Path:
    with tarfile.open(saved) as src, tarfile.open(dest, "w") as out:
        for member in src:
            out.addfile(member, src.extractfile(member) if member.isreg() else None)
        info.size = len(data)
        out.addfile(info, io.BytesIO(data))
    return dest


def test_path_traversal_member_is_refused(saved: Path, tmp_path: Path) -> None:
    evil = _with_member(
        saved, tmp_path / "evil.tar", tarfile.TarInfo("../../etc/cron.d/evil"), b"* * * * * root id\n"
    )
    r = imagegate("layers", f"docker-archive:{evil}")
    assert r.returncode == 3
    assert "member '../../etc/cron.d/evil' escapes the archive (path traversal)" in r.stderr
    assert not Path("/etc/cron.d/evil").exists()
    absolute = _with_member(saved, tmp_path / "abs.tar", tarfile.TarInfo("/tmp/imagegate-evil"), b"x")
    r = imagegate("layers", f"docker-archive:{absolute}")
    assert r.returncode == 3 and "absolute or unsafe path" in r.stderr


def test_symlink_out_of_the_archive_is_refused(saved: Path, tmp_path: Path) -> None:
    link = tarfile.TarInfo("abc/layer.tar")
    link.type, link.linkname = tarfile.SYMTYPE, "../../../../etc/passwd"
    evil = _with_member(saved, tmp_path / "link.tar", link)
    r = imagegate("layers", f"docker-archive:{evil}")
    assert r.returncode == 3 and "escapes the archive" in r.stderr
    gz = tmp_path / "link.tar.gz"
    gz.write_bytes(subprocess.run(["pigz", "-c", str(evil)], capture_output=True, check=True).stdout)
    r = imagegate("layers", f"docker-archive:{gz}")  # the streamed path checks names too
    assert r.returncode == 3 and "escapes the archive" in r.stderr


def test_not_an_archive(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar" * 100)
    r = imagegate("layers", f"docker-archive:{junk}")
    assert r.returncode == 3 and "not a readable tar archive" in r.stderr
    r = imagegate("layers", f"docker-archive:{tmp_path / 'absent.tar'}")
    assert r.returncode == 3 and "no such file" in r.stderr


def test_docker_daemon(oci_image: str) -> None:
    r = imagegate("layers", f"docker-daemon:{oci_image}", "--expect-config", _image_id(oci_image))
    assert r.returncode == 0, r.stderr
    r = imagegate("layers", "docker-daemon:imagegate-oci-test/absent:1")
    assert r.returncode == 3 and "the engine has no image" in r.stderr


@pytest.mark.podman
def test_docker_daemon_through_podman(oci_image: str, saved: Path) -> None:
    if subprocess.run(
        ["curl", "-sf", "--unix-socket", "/run/podman.sock", "http://d/_ping"], capture_output=True
    ).returncode:
        pytest.fail("no Podman API at /run/podman.sock: run scripts/engines.sh")
    had = subprocess.run(["podman", "image", "exists", oci_image], capture_output=True).returncode == 0
    sh("podman", "load", "-q", "-i", str(saved))
    try:
        r = imagegate(
            "layers",
            f"docker-daemon:{oci_image}",
            "--expect-config",
            _image_id(oci_image),
            env={"DOCKER_HOST": PODMAN_SOCK},
        )
        assert r.returncode == 0, r.stderr + r.stdout
    finally:
        if not had:  # leave Podman's store as the test found it
            subprocess.run(["podman", "rmi", "-f", oci_image], capture_output=True)


def test_compare_archive_with_registry(saved: Path, pushed: Pushed) -> None:
    r = imagegate("compare", f"docker-archive:{saved}", pushed.ref)
    assert r.returncode == 0, r.stderr
    # A docker save archive has no registry blobs: the uncompressed layers are what compares.
    assert "same content: config digest equal, 3/3 diffIDs verified; compared uncompressed layers" in r.stdout
    assert "compressed digests differ" not in r.stdout
