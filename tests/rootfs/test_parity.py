"""The unpacked tree equals the engine's own `docker export` of the same image, file by file."""

from __future__ import annotations

import gzip
import io
import tarfile
from dataclasses import replace
from pathlib import Path

from imagegate.oci.transports import open_source
from imagegate.rootfs import RootCache, materialize
from tests.oci.infra import Registry
from tests.rootfs.infra import Entry, docker_export, layer_tar, push_layers, tree_of_export, tree_of_folder


def _layer_names(registry: Registry, digest: str) -> list[str]:
    raw = gzip.decompress(registry.blob_file(digest).read_bytes())
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        return tf.getnames()


def test_tree_equals_docker_export(
    layered: str, layered_ref: str, registry: Registry, cache: RootCache
) -> None:
    root = materialize(open_source(layered_ref), cache=cache)
    assert root.report.ok and len(root.report.layers) == 4
    # The layers really hold the cases: deletions and an opaque folder made by overlay2.
    names = [n for x in root.report.layers for n in _layer_names(registry, x.actual_digest or "")]
    assert "t/del/.wh.x" in names and "t/.wh.d2f" not in names
    assert "t/opq/.wh..wh..opq" in names

    want, want_links = tree_of_export(docker_export(layered))
    got, got_links = tree_of_folder(Path(root.path))
    assert sorted(got) == sorted(want)
    # Set-id bits are never applied (a set-uid program of the host, in the cache): said in the root.
    assert want["t/suid"].mode == 0o4755
    want["t/suid"] = replace(want["t/suid"], mode=0o755)
    for path in want:
        assert got[path] == want[path], path
    assert got_links == want_links
    # Spot checks that say what the rules did.
    assert got["t/f2d2"].kind == "dir" and got["t/d2f"].kind == "file"
    assert got["t/swap"].target == "target2"
    assert "t/opq/old" not in got and "t/opq/sub" not in got and "t/del/x" not in got
    # overlay2 copies hl-src up when layer 3 links it again: the engine's own tree splits the group.
    assert frozenset({"t/hl-src", "t/hl-third"}) in got_links
    assert got["t/ro"].mode == 0o555
    # As root: ownership and xattrs applied; the set-id bit dropped and said so.
    assert root.not_applied == (
        "set-id bits: dropped from 1 files (no privilege is gained in the sandbox; in the cache they "
        "would be set-id programs of the host), e.g. /t/suid",
    )


def test_stream_source_gives_the_same_tree(
    layered: str, layered_ref: str, cache: RootCache, tmp_path: Path
) -> None:
    """docker-daemon: (read once, front to back) gives the tree the registry gives."""
    with RootCache(str(tmp_path / "other"), 1 << 30) as other:
        from_engine = materialize(open_source(f"docker-daemon:{layered}"), cache=other)
        from_registry = materialize(open_source(layered_ref), cache=cache)
        assert from_engine.chain_id == from_registry.chain_id
        assert tree_of_folder(Path(from_engine.path)) == tree_of_folder(Path(from_registry.path))
        assert from_engine.report.ok and from_engine.unpacked_from == f"docker-daemon:{layered}"
        assert [x.status.value for x in from_engine.report.layers] == ["OK"] * 4


def test_hardlink_to_a_lower_layer_file(registry: Registry, cache: RootCache, tmp_path: Path) -> None:
    lower = layer_tar([Entry("t", "dir", mode=0o755), Entry("t/a", data=b"lower\n", mode=0o640)])
    upper = layer_tar([Entry("t/b", "hardlink", link="t/a"), Entry("t/c", "symlink", link="a")])
    src = push_layers(registry, tmp_path, "lowerlink", [lower, upper])
    root = materialize(open_source(src), cache=cache)
    a, b = Path(root.path, "t/a"), Path(root.path, "t/b")
    assert a.stat().st_ino == b.stat().st_ino and b.read_bytes() == b"lower\n"
    assert oct(b.stat().st_mode & 0o7777) == oct(0o640)
    assert Path(root.path, "t/c").readlink() == Path("a")
    assert (root.env, root.working_dir, root.user, root.cmd) == (
        ("PATH=/bin", "CRAFTED=1"),
        "/t",
        "1000:1000",
        ("sh",),
    )


def test_opaque_marker_keeps_what_its_own_layer_wrote(
    registry: Registry, cache: RootCache, tmp_path: Path
) -> None:
    """The marker may come after the layer's own entries of that folder (the spec allows any
    order): those stay, everything from below goes; a whiteout of nothing is no error."""
    lower = layer_tar(
        [Entry("d", "dir"), Entry("d/old", data=b"1"), Entry("d/sub", "dir"), Entry("d/sub/x", data=b"2")]
    )
    upper = layer_tar(
        [
            Entry("d", "dir"),
            Entry("d/new", data=b"3"),
            Entry("d/.wh..wh..opq"),
            Entry("gone/.wh.nothing"),
            Entry("d/.wh.never-there"),
        ]
    )
    src = push_layers(registry, tmp_path, "opaque-order", [lower, upper])
    root = materialize(open_source(src), cache=cache)
    assert sorted(p.name for p in Path(root.path, "d").iterdir()) == ["new"]
    assert not Path(root.path, "gone").exists()


def test_whiteout_hides_only_lower_layers(registry: Registry, cache: RootCache, tmp_path: Path) -> None:
    """Image spec: a whiteout never hides what its own layer wrote, even after it."""
    lower = layer_tar([Entry("d", "dir"), Entry("d/lower", data=b"1"), Entry("f", data=b"old")])
    upper = layer_tar([Entry("f", data=b"new"), Entry(".wh.f"), Entry("d/mine", data=b"2"), Entry(".wh.d")])
    src = push_layers(registry, tmp_path, "whiteout-same-layer", [lower, upper])
    root = materialize(open_source(src), cache=cache)
    assert Path(root.path, "f").read_bytes() == b"new"
    assert sorted(p.name for p in Path(root.path, "d").iterdir()) == ["mine"]


def test_image_without_layers_is_an_empty_root(cache: RootCache, tmp_path: Path) -> None:
    from tests.rootfs.infra import write_layout

    root = materialize(open_source(f"oci:{write_layout(tmp_path / 'empty', [])}"), cache=cache)
    assert list(Path(root.path).iterdir()) == [] and root.report.ok and root.report.layers == ()
