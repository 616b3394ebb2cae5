"""`imagegate compare` on two real registries: the same image pushed by the engine and
re-compressed into the mirror by skopeo."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from imagegate.oci.manifest import DOCKER_MANIFEST
from imagegate.oci.registry import RegistryClient
from tests.helpers import imagegate
from tests.oci.conftest import Pushed
from tests.oci.infra import Registry, build_offline, free_port, other_gzip_layer, sh, skopeo

pytestmark = pytest.mark.engine


def test_identical_copy_reads_no_blob(pushed: Pushed, mirror: Registry) -> None:
    copy = f"{mirror.host}/team/app:identical"
    skopeo(
        "copy",
        "-q",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
        f"docker://{pushed.ref}",
        f"docker://{copy}",
    )
    r = imagegate("compare", pushed.ref, copy)
    assert r.returncode == 0, r.stderr
    assert "identical: manifest digest equal (sha256:" in r.stdout and "no blob read" in r.stdout
    r = imagegate("compare", pushed.ref, copy, "--deep")
    assert (
        r.returncode == 0
        and "identical: manifest digest equal" in r.stdout
        and "3/3 diffIDs verified" in r.stdout
    )


def test_recompressed_mirror_is_same_content(pushed: Pushed, recompressed: str) -> None:
    r = imagegate("compare", pushed.ref, recompressed)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith(
        "same content: config digest equal, 3/3 diffIDs verified; compressed digests differ for 3 layers "
        "(different compression); blobs are not byte-identical"
    )
    doc = json.loads(imagegate("compare", pushed.ref, recompressed, "--format", "json").stdout)
    assert doc["verdict"] == "SAME_CONTENT" and doc["compressed_digests_differ"] == 3
    assert doc["official"]["config_digest"] == doc["mirror"]["config_digest"] == pushed.config_digest


def test_zstd_mirror_is_a_different_image_with_equal_diffids(pushed: Pushed, zstd_mirror: str) -> None:
    r = imagegate("compare", pushed.ref, zstd_mirror)
    assert r.returncode == 1
    assert "different image: config digests differ" in r.stdout
    assert "all 3 diffIDs equal (as the configs list them; no layer read)" in r.stdout
    assert "env, entrypoint, cmd, labels, user, workdir, platform equal" in r.stdout
    r = imagegate("compare", pushed.ref, zstd_mirror, "--deep")
    assert r.returncode == 1 and "all 3 diffIDs equal (recomputed from the layers' bytes)" in r.stdout


def push_tampered(pushed: Pushed, mirror: Registry, tag: str) -> tuple[str, dict[str, Any]]:
    """The official image copied into the mirror with its second layer replaced by other
    (valid gzip) content under the same config; its reference and manifest."""
    with RegistryClient(mirror.host) as c, RegistryClient(pushed.ref.split("/")[0]) as o:
        got = o.get_manifest("team/app", "1")
        manifest = json.loads(got.raw)
        evil = other_gzip_layer("mirror")
        for blob in [manifest["config"], *manifest["layers"]]:
            with o.open_blob("team/app", blob["digest"]) as s:
                data = b"".join(iter(lambda: s.read(1 << 20), b""))
            c.upload_blob("team/app", data, blob["digest"])
        manifest["layers"][1].update({"digest": c.upload_blob("team/app", evil), "size": len(evil)})
        c.put_manifest("team/app", tag, json.dumps(manifest).encode(), DOCKER_MANIFEST)
    return f"{mirror.host}/team/app:{tag}", manifest


def test_tampered_mirror_names_the_layer(pushed: Pushed, mirror: Registry) -> None:
    """Same config, one layer replaced by other (valid gzip) content: corrupt, exit 1."""
    ref, manifest = push_tampered(pushed, mirror, "tampered")
    r = imagegate("compare", pushed.ref, ref)
    assert r.returncode == 1
    assert "corrupt: config digest equal" in r.stdout
    assert f"layer 2 ({manifest['layers'][1]['digest']}) DIFFID_MISMATCH" in r.stdout


def test_different_image_lists_fields_and_layers(
    pushed: Pushed, oci_image: str, official: Registry, tmp_path: Path
) -> None:
    ref = f"{official.host}/team/app:other"
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {oci_image}\nENV EXTRA=1\nUSER 1000\nCOPY Dockerfile /x\n")
    build_offline(ctx, ref)
    sh("docker", "push", "-q", ref)
    subprocess.run(["docker", "rmi", ref], capture_output=True)  # the registry keeps it; the engine need not
    r = imagegate("compare", pushed.ref, ref)
    assert r.returncode == 1
    assert "different image: config digests differ" in r.stdout
    assert "diffIDs differ for 1 of 4 layers: 4" in r.stdout
    assert "config fields that differ: env, user" in r.stdout
    assert 'config user: null (official) vs "1000" (mirror)' in r.stdout


def test_compare_unreachable_is_undecided(pushed: Pushed) -> None:
    r = imagegate("compare", pushed.ref, f"127.0.0.1:{free_port()}/team/app:1")
    assert r.returncode == 2


def test_docker_save_and_the_engine_compare_exactly(pushed: Pushed, oci_image: str, tmp_path: Path) -> None:
    """A docker save archive (and the engine's export) has no registry blobs: compared with itself
    or with the registry copy it came from, it is the same content over its uncompressed layers,
    never "compressed digests differ … not byte-identical", and never "manifest None"."""
    archive = tmp_path / "saved.tar"
    sh("docker", "save", "-o", str(archive), oci_image)
    pairs = [
        (f"docker-archive:{archive}", f"docker-archive:{archive}"),
        (pushed.ref, f"docker-archive:{archive}"),
        (f"docker-daemon:{oci_image}", f"docker-daemon:{oci_image}"),
        (f"docker-daemon:{oci_image}", pushed.ref),
    ]
    for official, mirror in pairs:
        r = imagegate("compare", official, mirror)
        assert r.returncode == 0, (official, mirror, r.stdout, r.stderr)
        assert "same content: config digest equal, 3/3 diffIDs verified" in r.stdout, r.stdout
        assert "compared uncompressed layers" in r.stdout
        assert "not byte-identical" not in r.stdout and "compressed digests differ" not in r.stdout
        assert "None" not in r.stdout
    r = imagegate("compare", f"docker-archive:{archive}", pushed.ref, "--format", "json")
    doc = r.json()
    assert doc["compared"] == "uncompressed layers" and doc["compressed_digests_differ"] == 0
    assert doc["official"]["manifest_digest"] is None


def test_uncompressed_copy_against_its_registry_copy(
    pushed: Pushed, mirror: Registry, tmp_path: Path
) -> None:
    """Layers stored uncompressed (digest = diffID), as docker save writes them: the blobs differ
    from the registry's gzip ones by construction, and the sentence says what was compared."""
    d = tmp_path / "dir"
    skopeo("copy", "-q", "--src-tls-verify=false", "--dest-decompress", f"docker://{pushed.ref}", f"dir:{d}")
    # Pushed as they are (a registry client would compress them again): uncompressed blobs.
    manifest = (d / "manifest.json").read_bytes()
    doc = json.loads(manifest)
    # A repository of its own: uncompressed blobs in team/app would be reused as they are by a
    # later skopeo push there with --dest-compress (the zstd mirror would come out uncompressed).
    with RegistryClient(mirror.host) as client:
        for desc in [doc["config"], *doc["layers"]]:
            client.upload_blob("team/plain", (d / desc["digest"].split(":")[1]).read_bytes(), desc["digest"])
        client.put_manifest("team/plain", "1", manifest, DOCKER_MANIFEST)
    plain = f"{mirror.host}/team/plain:1"
    r = imagegate("compare", pushed.ref, plain)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"compared uncompressed layers: docker://{plain} holds its layers uncompressed" in r.stdout
    assert "not byte-identical" not in r.stdout
