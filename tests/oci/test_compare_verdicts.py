"""The mirror comparison's verdicts, each from two real OCI image layouts written here (real tar
layers, gzip-compressed at two levels, configs and manifests as a registry copy would have them),
read through the same sources and the same `compare` as `imagegate compare oci:A oci:B`. No engine
and no registry: tests/oci/test_compare.py runs the same verdicts against real registries."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from imagegate.errors import EXIT_ACCEPTED, EXIT_REJECTED
from imagegate.oci.compare import Verdict, compare
from imagegate.oci.transports import open_sources

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
GZIP_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
PLAIN_LAYER = "application/vnd.oci.image.layer.v1.tar"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tar_of(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1_700_000_000, 0o644
            tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


LAYERS = [tar_of({f"layer{i}/file.txt": f"content of layer {i}\n".encode() * 50}) for i in range(3)]
CONFIG = {
    "architecture": "amd64",
    "os": "linux",
    "config": {"Env": ["PATH=/usr/bin:/bin"], "Cmd": ["sh"], "WorkingDir": "/"},
    "rootfs": {"type": "layers", "diff_ids": [sha(t) for t in LAYERS]},
    "created": "2026-01-01T00:00:00Z",
}


def write_layout(
    root: Path,
    layers: list[bytes] = LAYERS,
    config: dict[str, Any] = CONFIG,
    *,
    level: int = 6,
    plain: bool = False,
    annotations: dict[str, str] | None = None,
) -> str:
    """An OCI layout of one image tagged 1: `layers` (tars) gzip-compressed at `level` (or kept
    uncompressed with `plain`), `config` as it is; its `oci:` reference."""
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> str:
        d = sha(data)
        (blobs / d.split(":")[1]).write_bytes(data)
        return d

    stored = [t if plain else gzip.compress(t, compresslevel=level, mtime=0) for t in layers]
    raw_config = json.dumps(config).encode()
    manifest: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": put(raw_config),
            "size": len(raw_config),
        },
        "layers": [
            {"mediaType": PLAIN_LAYER if plain else GZIP_LAYER, "digest": put(b), "size": len(b)}
            for b in stored
        ],
    }
    if annotations:
        manifest["annotations"] = annotations
    raw = json.dumps(manifest).encode()
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    desc = {
        "mediaType": OCI_MANIFEST,
        "digest": put(raw),
        "size": len(raw),
        "annotations": {"org.opencontainers.image.ref.name": "1"},
    }
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [desc]}))
    return f"oci:{root}:1"


def write_saved(
    path: Path, layers: list[bytes] = LAYERS, config: dict[str, Any] = CONFIG, *, gzipped: bool = False
) -> str:
    """A legacy `docker save` archive of the image: its layers as uncompressed tars, no layer
    digest declared anywhere (gzipped whole with `gzipped`, as `docker save | gzip` writes it:
    read front to back, once); its `docker-archive:` reference."""
    raw_config = json.dumps(config).encode()
    members = {f"{sha(raw_config)[7:]}.json": raw_config}
    names = []
    for t in layers:
        names.append(f"{sha(t)[7:]}/layer.tar")
        members[names[-1]] = t
    manifest = [{"Config": f"{sha(raw_config)[7:]}.json", "RepoTags": ["app:1"], "Layers": names}]
    members["manifest.json"] = json.dumps(manifest).encode()
    with tarfile.open(path, "w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    if gzipped:
        path.write_bytes(gzip.compress(path.read_bytes(), mtime=0))
    return f"docker-archive:{path}"


def compared(official: str, mirror: str, *, deep: bool = False) -> Any:
    with open_sources([official, mirror]) as (a, b):
        return compare(a, b, deep=deep)


@pytest.fixture
def official(tmp_path: Path) -> str:
    return write_layout(tmp_path / "official")


def manifest_digest(ref: str) -> str:
    root = Path(ref.split(":")[1])
    return str(json.loads((root / "index.json").read_text())["manifests"][0]["digest"])


def test_the_same_manifest_is_identical_without_reading_a_blob_and_verified_when_deep(
    official: str, tmp_path: Path
) -> None:
    copy = write_layout(tmp_path / "copy")
    r = compared(official, copy)
    assert r.verdict is Verdict.IDENTICAL and r.exit_code == EXIT_ACCEPTED
    assert r.sentence == f"identical: manifest digest equal ({manifest_digest(official)}); no blob read"
    deep = compared(official, copy, deep=True)
    assert deep.verdict is Verdict.IDENTICAL
    assert (
        deep.sentence
        == f"identical: manifest digest equal ({manifest_digest(official)}), 3/3 diffIDs verified"
    )
    assert deep.mirror.report is not None and deep.official.report is not None


def test_the_same_config_recompressed_is_the_same_content_not_byte_identical(
    official: str, tmp_path: Path
) -> None:
    r = compared(official, write_layout(tmp_path / "recompressed", level=1))
    assert r.verdict is Verdict.SAME_CONTENT and r.exit_code == EXIT_ACCEPTED
    assert r.sentence == (
        "same content: config digest equal, 3/3 diffIDs verified; compressed digests differ for 3 layers "
        "(different compression); blobs are not byte-identical"
    )
    assert r.compressed_differ == 3 and r.to_dict()["compared"] == "manifests and layer blobs"
    # Whatever the compressed bytes (and so their digests) are, they are never taken for layers
    # stored uncompressed.
    levels = [
        n
        for n in range(1, 10)
        if [gzip.compress(t, n, mtime=0) for t in LAYERS] != [gzip.compress(t, 6, mtime=0) for t in LAYERS]
    ]
    assert len(levels) >= 4
    for level in levels:
        other = compared(official, write_layout(tmp_path / f"level{level}", level=level))
        assert other.sentence.endswith("blobs are not byte-identical"), (level, other.sentence)


def test_the_same_blobs_under_another_manifest_are_the_same_content_with_both_manifests_named(
    official: str, tmp_path: Path
) -> None:
    other = write_layout(tmp_path / "annotated", annotations={"org.example.mirrored": "yes"})
    r = compared(official, other)
    assert r.verdict is Verdict.SAME_CONTENT and r.compressed_differ == 0
    assert r.sentence == (
        "same content: config digest equal, 3/3 diffIDs verified; layer digests equal for all 3 layers "
        f"(byte-identical blobs); the manifests differ ({manifest_digest(official)} vs {manifest_digest(other)})"
    )
    back = compared(other, official)  # whichever manifest digest sorts first
    assert back.verdict is Verdict.SAME_CONTENT and back.sentence.endswith(
        f"the manifests differ ({manifest_digest(other)} vs {manifest_digest(official)})"
    )


def test_uncompressed_layers_under_the_same_config_compare_as_uncompressed_layers(
    official: str, tmp_path: Path
) -> None:
    plain = write_layout(tmp_path / "plain", plain=True)
    r = compared(official, plain)
    assert r.verdict is Verdict.SAME_CONTENT
    assert r.sentence.endswith(
        f"compared uncompressed layers: {r.mirror.source} holds its layers uncompressed "
        "(as docker save writes them), not as a registry's compressed blobs"
    )
    assert r.to_dict()["compared"] == "uncompressed layers"
    # Either side: the one that holds them uncompressed is named.
    r = compared(plain, official)
    assert r.sentence.endswith(
        f"compared uncompressed layers: {r.official.source} holds its layers uncompressed "
        "(as docker save writes them), not as a registry's compressed blobs"
    )


def test_a_docker_save_archive_compares_over_its_uncompressed_layers(official: str, tmp_path: Path) -> None:
    saved = write_saved(tmp_path / "saved.tar")
    r = compared(official, saved)
    assert r.verdict is Verdict.SAME_CONTENT and r.to_dict()["compared"] == "uncompressed layers"
    assert r.sentence == (
        "same content: config digest equal, 3/3 diffIDs verified; compared uncompressed layers: "
        f"{r.mirror.source} is a docker save archive with no registry blobs (no compressed digests) to compare"
    )
    both = compared(saved, write_saved(tmp_path / "again.tar"))
    assert both.sentence.endswith(
        f"compared uncompressed layers: {both.official.source} and {both.mirror.source} are docker save "
        "archives with no registry blobs (no compressed digests) to compare"
    )


def test_a_layer_replaced_under_the_same_config_is_corrupt_and_named(official: str, tmp_path: Path) -> None:
    evil = [LAYERS[0], tar_of({"other.txt": b"not the official content\n"}), LAYERS[2]]
    mirror = write_layout(tmp_path / "tampered", layers=evil)
    r = compared(official, mirror)
    assert r.verdict is Verdict.CORRUPT and r.exit_code == EXIT_REJECTED
    layer2 = r.mirror.layer_digests[1]
    assert r.sentence.startswith("corrupt: config digest equal, but 1 problem(s): ")
    assert f"{r.mirror.source}: layer 2 ({layer2}) DIFFID_MISMATCH" in r.sentence
    assert len(r.problems) == 1 and r.problems[0].startswith(
        f"{r.mirror.source}: layer 2 ({layer2}) DIFFID_MISMATCH"
    )
    # The official side, read too with --deep, is named when it is the corrupt one.
    r = compared(mirror, official, deep=True)
    assert r.verdict is Verdict.CORRUPT and f"{r.official.source}: layer 2" in r.sentence


def test_another_config_is_a_different_image_with_the_layers_and_fields_that_differ(
    official: str, tmp_path: Path
) -> None:
    config = json.loads(json.dumps(CONFIG))
    extra, more = tar_of({"extra.txt": b"added\n"}), tar_of({"more.txt": b"added too\n"})
    layers = [LAYERS[0], tar_of({"changed.txt": b"x\n"}), LAYERS[2], extra, more]
    config["rootfs"]["diff_ids"] = [sha(t) for t in layers]
    config["config"].update(Env=["PATH=/usr/bin:/bin", "EXTRA=1"], User="1000", Entrypoint=[])
    config["config"]["ExposedPorts"] = {"80/tcp": {}}
    config.update(architecture="arm64", variant="v8", created="2026-02-02T00:00:00Z", build_info={"id": 2})
    mirror = write_layout(tmp_path / "other", layers=layers, config=config)
    r = compared(official, mirror)
    assert r.verdict is Verdict.DIFFERENT and r.exit_code == EXIT_REJECTED
    assert [(d.index, d.official_diff_id, d.mirror_diff_id) for d in r.layer_diffs] == [
        (1, sha(LAYERS[1]), sha(layers[1])),
        (3, None, sha(extra)),
        (4, None, sha(more)),
    ]
    # An empty Entrypoint is no Entrypoint (converters drop empty fields).
    assert [(f.field, f.official, f.mirror) for f in r.field_diffs] == [
        ("env", ["PATH=/usr/bin:/bin"], ["PATH=/usr/bin:/bin", "EXTRA=1"]),
        ("user", None, "1000"),
        ("platform", "linux/amd64", "linux/arm64/v8"),
    ]
    assert r.other_fields == ("build_info", "config.ExposedPorts", "created")
    assert r.sentence == (
        f"different image: config digests differ ({r.official.config_digest} vs {r.mirror.config_digest}); "
        "diffIDs differ for 3 of 5 layers: 2, 4, 5 (as the configs list them; no layer read); "
        "config fields that differ: env, user, platform; "
        "other config keys differ: build_info, config.ExposedPorts, created"
    )
    # The other way round: the same differences, each side named as it is.
    back = compared(mirror, official)
    assert [(d.index, d.mirror_diff_id) for d in back.layer_diffs] == [
        (1, sha(LAYERS[1])),
        (3, None),
        (4, None),
    ]
    assert [(f.field, f.official, f.mirror) for f in back.field_diffs][-1] == (
        "platform",
        "linux/arm64/v8",
        "linux/amd64",
    )
    assert back.other_fields == ("build_info", "config.ExposedPorts", "created")


def test_a_different_image_says_where_its_diffids_come_from_and_names_corrupt_blobs(
    official: str, tmp_path: Path
) -> None:
    config = dict(CONFIG, created="2026-03-03T00:00:00Z")
    other = write_layout(tmp_path / "recreated", config=config)
    r = compared(official, other)
    assert r.verdict is Verdict.DIFFERENT and r.layer_diffs == () and r.field_diffs == ()
    assert r.sentence.endswith(
        "; all 3 diffIDs equal (as the configs list them; no layer read); "
        "env, entrypoint, cmd, labels, user, workdir, platform equal; other config keys differ: created"
    )
    deep = compared(official, other, deep=True)
    assert "all 3 diffIDs equal (recomputed from the layers' bytes)" in deep.sentence
    # A mirror that lists the official diffIDs but holds other bytes: deep reads say so.
    evil = write_layout(tmp_path / "evil", layers=[LAYERS[0], tar_of({"x": b"y"}), LAYERS[2]], config=config)
    bad = compared(official, evil, deep=True)
    assert bad.verdict is Verdict.DIFFERENT
    assert f"; corrupt blobs: {bad.mirror.source}: layer 2 (" in bad.sentence and len(bad.problems) == 1


def test_a_different_image_from_a_docker_save_archive_says_which_side_s_layers_were_read(
    official: str, tmp_path: Path
) -> None:
    config = dict(CONFIG, created="2026-04-04T00:00:00Z")
    saved = write_saved(tmp_path / "saved.tar.gz", config=config, gzipped=True)
    r = compared(saved, official)
    assert r.verdict is Verdict.DIFFERENT
    assert (
        f"all 3 diffIDs equal (as the configs list them; only the layers of {r.official.source} read)"
        in r.sentence
    )
