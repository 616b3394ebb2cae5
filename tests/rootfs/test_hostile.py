"""Hostile layers from a registry: refused with the layer and the entry named, the root
discarded, and nothing written outside the root (a canary next to the cache stays as it was)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from imagegate.oci.transports import open_source
from imagegate.rootfs import HostileLayer, LayerRefused, Limits, RootCache, materialize
from tests.oci.infra import Registry, start_registry
from tests.rootfs.infra import Entry, layer_tar, push_layers

BASE = [Entry("etc", "dir", mode=0o755), Entry("etc/os-release", data=b"ID=crafted\n")]


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    d = tmp_path / "outside"
    d.mkdir()
    (d / "passwd").write_text("canary\n")
    return d


def _untouched(canary: Path) -> None:
    assert sorted(p.name for p in canary.iterdir()) == ["passwd"]
    st = (canary / "passwd").stat()
    assert (canary / "passwd").read_text() == "canary\n" and st.st_nlink == 1


def _nothing_kept(cache: RootCache) -> None:
    assert cache.entries() == []
    assert os.listdir(Path(cache.folder) / "work") == []


def _hostile_cases(canary: Path) -> dict[str, tuple[list[Entry], str]]:
    rel_up = "../" * (len(canary.parts) + 2)
    return {
        "absolute": ([Entry(f"{canary}/passwd", data=b"owned\n")], "absolute path"),
        "dotdot": ([Entry(f"{rel_up}{str(canary)[1:]}/passwd", data=b"owned\n")], r"'\.\.' in the path"),
        "hardlink-absolute": (
            [Entry("x", "hardlink", link=f"{canary}/passwd")],
            "hard link to .*outside the root",
        ),
        "hardlink-dotdot": (
            [Entry("x", "hardlink", link=f"{rel_up}{str(canary)[1:]}/passwd")],
            "hard link to .*outside the root",
        ),
        # A symlink planted, then a write through it: `etc -> /etc` resolves to itself inside the
        # root (as in a chroot): a loop, refused.
        "symlink-then-write": (
            [Entry("etc", "symlink", link="/etc"), Entry("etc/passwd", data=b"owned\n")],
            "too many levels of symbolic links",
        ),
        # `.wh...` whites out `..`: the folder above the root.
        "whiteout-dotdot": ([Entry(".wh...")], r"a whiteout of '\.\.'"),
        "hardlink-through-symlink": (
            [Entry("up", "symlink", link=str(canary)), Entry("x", "hardlink", link="up/passwd")],
            "does not exist",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "absolute",
        "dotdot",
        "hardlink-absolute",
        "hardlink-dotdot",
        "symlink-then-write",
        "whiteout-dotdot",
        "hardlink-through-symlink",
    ],
)
def test_hostile_entry_refused(
    case: str, registry: Registry, cache: RootCache, canary: Path, tmp_path: Path
) -> None:
    entries, why = _hostile_cases(canary)[case]
    src = push_layers(registry, tmp_path, f"hostile-{case}", [layer_tar(BASE), layer_tar(entries)])
    bad = entries[-1].name
    with pytest.raises(
        HostileLayer, match=rf"^layer 2/2 sha256:.*: entry '{re.escape(bad)}' refused: .*{why}"
    ) as e:
        materialize(open_source(src), cache=cache)
    assert e.value.layer == 1 and e.value.entry == bad
    _untouched(canary)
    _nothing_kept(cache)


def test_symlink_to_an_outside_folder_writes_inside_the_root(
    registry: Registry, cache: RootCache, canary: Path, tmp_path: Path
) -> None:
    """A symlink to an absolute folder is resolved inside the root, as the image will see it."""
    entries = [Entry("conf", "symlink", link=str(canary)), Entry("conf/passwd", data=b"owned\n")]
    src = push_layers(registry, tmp_path, "symlink-inside", [layer_tar(BASE), layer_tar(entries)])
    root = materialize(open_source(src), cache=cache)
    assert Path(root.path, str(canary)[1:], "passwd").read_bytes() == b"owned\n"
    assert Path(root.path, "conf").readlink() == canary
    _untouched(canary)


def test_relative_symlink_escape_stops_at_the_root(
    registry: Registry, cache: RootCache, canary: Path, tmp_path: Path
) -> None:
    entries = [
        Entry("a", "dir"),
        Entry("a/up", "symlink", link="../../../../.."),
        Entry("a/up/escaped", data=b"x"),
    ]
    src = push_layers(registry, tmp_path, "symlink-up", [layer_tar(BASE), layer_tar(entries)])
    root = materialize(open_source(src), cache=cache)
    assert Path(root.path, "escaped").read_bytes() == b"x"
    assert not Path(canary.parent, "escaped").exists() and not Path("/escaped").exists()


def test_decompression_bomb_refused_naming_the_entry(
    registry: Registry, cache: RootCache, tmp_path: Path
) -> None:
    bomb = [Entry("small", data=b"ok"), Entry("zeros", size=64 << 20)]  # 64 MiB, about 64 KiB of gzip
    src = push_layers(registry, tmp_path, "bomb", [layer_tar(BASE), layer_tar(bomb)])
    limits = Limits(max_layer_bytes=16 << 20, max_total_bytes=1 << 30)
    with pytest.raises(
        HostileLayer, match=r"^layer 2/2 .*entry 'zeros' refused: .*past 16777216 uncompressed bytes"
    ):
        materialize(open_source(src), cache=cache, limits=limits)
    _nothing_kept(cache)
    # The bound on the whole image counts every layer.
    limits = Limits(max_layer_bytes=1 << 30, max_total_bytes=32 << 20)
    with pytest.raises(HostileLayer, match=r"entry 'zeros' refused: .*take the image past 33554432"):
        materialize(open_source(src), cache=cache, limits=limits)
    _nothing_kept(cache)


def test_tampered_layer_in_the_registry_discards_the_root(cache: RootCache, tmp_path: Path) -> None:
    """Bytes changed in the registry's storage: refused, the bad layer named, nothing kept."""
    reg = start_registry(tmp_path / "reg")
    try:
        layers = [
            layer_tar(BASE),
            layer_tar([Entry("app", data=b"good\n" * 1000)]),
            layer_tar([Entry("z", data=b"z")]),
        ]
        src = push_layers(reg, tmp_path, "tampered", layers)
        image = open_source(src).resolve()  # type: ignore[union-attr]
        bad = image.layers[1].digest
        assert bad is not None
        blob = reg.blob_file(bad)
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
        with pytest.raises(
            LayerRefused, match=rf"^layer 2/3 {bad[:19]}….*DIGEST_MISMATCH.*root was discarded"
        ) as e:
            materialize(open_source(src), cache=cache)
        assert e.value.layer == 1 and e.value.report is not None
        assert [x.status.value for x in e.value.report.layers] == ["OK", "DIGEST_MISMATCH"]
        _nothing_kept(cache)
    finally:
        reg.stop()


def test_wrong_diffid_refused(registry: Registry, cache: RootCache, tmp_path: Path) -> None:
    """The config's diffID does not match the layer's content (a config pointing elsewhere)."""
    lower, upper = layer_tar(BASE), layer_tar([Entry("app", data=b"real")])
    other = "sha256:" + "0" * 64
    src = push_layers(registry, tmp_path, "diffid", [lower, upper], diff_ids=[_sha(lower), other])
    with pytest.raises(LayerRefused, match=r"^layer 2/2 .*DIFFID_MISMATCH: content differs"):
        materialize(open_source(src), cache=cache)
    _nothing_kept(cache)


def _sha(data: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_huge_pax_header_refused_in_bounded_memory(
    registry: Registry, cache: RootCache, tmp_path: Path
) -> None:
    """A PAX record that tarfile would read whole (64 MiB here) is refused, not held in memory."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        ti = tarfile.TarInfo("big-header")
        ti.pax_headers = {"comment": "x" * (64 << 20)}
        tf.addfile(ti, io.BytesIO(b""))
    src = push_layers(registry, tmp_path, "pax-bomb", [layer_tar(BASE), buf.getvalue()])
    with pytest.raises(
        HostileLayer, match=r"^layer 2/2 .*refused: .*tar header record of \d+ bytes \(more than 8388608\)"
    ):
        materialize(open_source(src), cache=cache)
    _nothing_kept(cache)
