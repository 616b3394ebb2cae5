"""Hostile JSON from an archive or a registry: too deep or too large is an input error named
by where it came from, never a RecursionError traceback. The registry is the real one on
127.0.0.1; the archives are real tar files."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from imagegate.domain.digest import digest_of
from imagegate.oci import untrusted_json
from imagegate.oci.registry import RegistryClient
from tests.helpers import imagegate
from tests.oci.infra import Registry

DEEP = "[" * 5000 + "]" * 5000  # CPython's parser recurses per level: 1000 is its limit
DIFF_ID = "sha256:" + "0" * 64


def test_helper_bounds_depth_and_size() -> None:
    assert untrusted_json.loads('{"a": [1, {"b": "[[[[[[[["}]}') == {"a": [1, {"b": "[[[[[[[["}]}
    assert untrusted_json.nesting_depth('{"k": "\\"[[[", "l": [[]]}') == 3
    with pytest.raises(untrusted_json.UntrustedJSONError, match="nested more than 64 levels deep"):
        untrusted_json.loads(DEEP)
    with pytest.raises(untrusted_json.UntrustedJSONError, match=r"larger than 4194304 bytes"):
        untrusted_json.loads(b" " * (4 << 20) + b"{}")
    with pytest.raises(untrusted_json.UntrustedJSONError, match=r"not JSON \(Expecting"):
        untrusted_json.loads("{x}")


def _archive(path: Path, manifest: str) -> Path:
    with tarfile.open(path, "w") as tar:
        data = manifest.encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def test_archive_with_a_deep_manifest_json(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "deep.tar", DEEP)
    r = imagegate("layers", f"docker-archive:{archive}")
    assert r.returncode == 2, r.stderr
    assert f"docker-archive:{archive}: manifest.json is nested more than 64 levels deep" in r.stderr
    assert "Traceback" not in r.stderr and "please report" not in r.stderr


def _push(official: Registry, repo: str, config: bytes, manifest_extra: str = "") -> str:
    """An image with no layers, pushed as is (the registry keeps unknown keys verbatim)."""
    with RegistryClient(official.host) as client:
        client.upload_blob(repo, config)
        body = (
            '{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", '
            f'"config": {{"mediaType": "application/vnd.oci.image.config.v1+json", '
            f'"digest": "{digest_of(config)}", "size": {len(config)}}}, "layers": []{manifest_extra}}}'
        )
        client.put_manifest(repo, "1", body.encode(), "application/vnd.oci.image.manifest.v1+json")
    return f"{official.host}/{repo}:1"


def test_registry_manifest_too_deep(official: Registry) -> None:
    config = json.dumps(
        {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}
    )
    ref = _push(official, "hostile/deep-manifest", config.encode(), f', "x": {DEEP}')
    r = imagegate("layers", ref)
    assert r.returncode == 2, r.stderr
    assert "the manifest is nested more than 64 levels deep" in r.stderr
    assert "Traceback" not in r.stderr and "please report" not in r.stderr


def test_registry_config_too_deep(official: Registry) -> None:
    config = (
        '{"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}, '
        f'"x": {DEEP}}}'
    )
    ref = _push(official, "hostile/deep-config", config.encode())
    r = imagegate("layers", ref)
    assert r.returncode == 1, r.stdout + r.stderr  # the config is the image's: a FAIL, named
    assert "the config has no readable rootfs.diff_ids (nested more than 64 levels deep)" in r.stdout
    assert "Traceback" not in r.stderr


def test_gzip_is_not_a_way_around_it(tmp_path: Path) -> None:
    # A compressed docker save is read as a stream: same bound, same message.
    archive = _archive(tmp_path / "deep.tar", DEEP)
    gz = tmp_path / "deep.tar.gz"
    gz.write_bytes(gzip.compress(archive.read_bytes()))
    r = imagegate("layers", f"docker-archive:{gz}")
    assert r.returncode == 2, r.stderr
    assert "manifest.json is nested more than 64 levels deep" in r.stderr
