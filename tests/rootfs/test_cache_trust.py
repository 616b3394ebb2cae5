"""What the root cache trusts, and what it does not: its folder must be the runner's own (made
0700, never followed through a symlink, refused otherwise); a cached root stands in for a layer
only through a verified pair this machine recorded after reading the blob whole; what unpacking
as root would hand to the host (device nodes, set-id bits, file capabilities) is never written."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest

from imagegate.errors import UsageError
from imagegate.oci.transports import open_source
from imagegate.rootfs import LayerRefused, RootCache, materialize
from tests.rootfs.infra import Entry, layer_tar, write_layout

BASE = layer_tar([Entry("etc", "dir", mode=0o755), Entry("etc/os-release", data=b"ID=crafted\n")])


def _image(tmp_path: Path, name: str) -> str:
    top = layer_tar([Entry(f"{name}.txt", data=name.encode())])
    return f"oci:{write_layout(tmp_path / name, [BASE, top])}"


def _blobs(src: str) -> list[Path]:
    """The layer blobs of an oci: layout made by write_layout."""
    layout = Path(src[4:])
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads((layout / "blobs/sha256" / index["manifests"][0]["digest"][7:]).read_text())
    return [layout / "blobs/sha256" / x["digest"][7:] for x in manifest["layers"]]


def test_a_new_cache_folder_and_the_parents_made_for_it_are_the_runners_alone(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "b" / "cache"
    with RootCache(str(folder)):
        pass
    for p in (tmp_path / "a", tmp_path / "a" / "b", folder, *(folder / s for s in ("roots", "pairs"))):
        st = p.lstat()
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid(), p
        assert stat.S_IMODE(st.st_mode) & 0o077 == 0, (p, oct(st.st_mode))


def test_the_default_folder_made_by_this_user_is_tightened_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = tmp_path / "imagegate" / "roots"
    folder.mkdir(parents=True)
    folder.chmod(0o775)
    (tmp_path / "imagegate").chmod(0o777)
    with RootCache() as cache:
        assert cache.folder == str(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "imagegate").stat().st_mode) == 0o755
    assert f"root cache folder {folder}: mode 0775 tightened to 0700 (made by this user)" in cache.notes
    assert "mode 0775 tightened to 0700" in caplog.text


def test_a_given_folder_is_never_changed_but_refused(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    with pytest.raises(UsageError, match=r"mode 0755: group/others can reach it; not used") as e:
        RootCache(str(folder))
    assert e.value.hint == f"chmod 700 {folder} (it must be yours alone), or use another --cache-dir"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755 and os.listdir(folder) == []


def test_a_symlinked_cache_folder_or_subfolder_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    with RootCache(str(real)):
        pass
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UsageError, match=rf"root cache {tmp_path}/link: it is a symlink \(to {real}\)"):
        RootCache(str(tmp_path / "link"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (real / "pairs").rmdir()
    (real / "pairs").symlink_to(elsewhere)
    with pytest.raises(UsageError, match=r"pairs/ is not a folder \(.*a symlink\?\)"):
        RootCache(str(real))


def test_a_cache_hit_reads_every_layer_that_is_not_a_known_pair(tmp_path: Path) -> None:
    folder = str(tmp_path / "cache")
    src = _image(tmp_path, "a")
    with RootCache(folder) as cache:
        first = materialize(open_source(src), cache=cache)
    assert sorted(os.listdir(Path(folder) / "pairs")) == sorted(
        "sha256-" + p.name for p in _blobs(src)
    )  # both layers, recorded by the unpack
    # Without its pair, the top layer is read again: gone from the source, the image is refused
    # although its root is in the cache.
    top = _blobs(src)[1]
    (Path(folder) / "pairs" / f"sha256-{top.name}").unlink()
    data = top.read_bytes()
    top.unlink()
    with RootCache(folder) as cache, pytest.raises(LayerRefused, match=r"^layer 2/2 .*MISSING") as e:
        materialize(open_source(src), cache=cache)
    assert "the cached root of the same layers was not used" in str(e.value)
    top.write_bytes(data)
    with RootCache(folder) as cache:
        again = materialize(open_source(src), cache=cache)
    assert again.cached and again.path == first.path
    lower, upper = again.report.layers
    assert lower.pair_recorded_at is not None and "not read in this run" in lower.detail
    assert upper.pair_recorded_at is None and upper.actual_digest == f"sha256:{top.name}"
    assert (Path(folder) / "pairs" / f"sha256-{top.name}").exists()  # recorded again


@pytest.mark.parametrize(
    "how",
    ["symlink", "wrong-diffid", "higher-diffid", "smaller-size", "larger-size", "oversized"],
)
def test_a_pair_record_that_is_not_trustworthy_is_not_used(tmp_path: Path, how: str) -> None:
    """A record stands in for the blob only when it names the manifest's size and the config's
    diffID exactly: one byte more or less, or another diffID (sorting before or after the right
    one), and the blob is read."""
    folder = str(tmp_path / "cache")
    src = _image(tmp_path, "a")
    with RootCache(folder) as cache:
        materialize(open_source(src), cache=cache)
    top = _blobs(src)[1]
    record = Path(folder) / "pairs" / f"sha256-{top.name}"
    doc = json.loads(record.read_text())
    record.unlink()
    if how == "symlink":
        (tmp_path / "planted.json").write_text(json.dumps(doc))
        record.symlink_to(tmp_path / "planted.json")
    elif how == "wrong-diffid":
        record.write_text(json.dumps({**doc, "diff_id": "sha256:" + "0" * 64}))
    elif how == "higher-diffid":
        record.write_text(json.dumps({**doc, "diff_id": "sha256:" + "f" * 64}))
    elif how in ("smaller-size", "larger-size"):
        record.write_text(json.dumps({**doc, "size": doc["size"] + (-1 if how == "smaller-size" else 1)}))
    else:
        record.write_text(json.dumps({**doc, "pad": "x" * 2000}))
    top.unlink()  # a record that were used would let the run pass without this blob
    with RootCache(folder) as cache, pytest.raises(LayerRefused, match=r"^layer 2/2 .*MISSING"):
        materialize(open_source(src), cache=cache)


@pytest.mark.parametrize("which", [0, 1])
def test_a_refused_layer_is_named_with_what_was_wrong_and_the_layers_read_so_far(
    tmp_path: Path, which: int
) -> None:
    """A cache hit whose layer (without its pair) no longer holds its declared bytes: refused,
    naming the layer, its status and what was wrong with it, the report holding the layers up to
    and including it."""
    folder = str(tmp_path / "cache")
    src = _image(tmp_path, "a")
    with RootCache(folder) as cache:
        materialize(open_source(src), cache=cache)
    blob = _blobs(src)[which]
    (Path(folder) / "pairs" / f"sha256-{blob.name}").unlink()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF  # the same size, other bytes
    blob.write_bytes(bytes(data))
    with RootCache(folder) as cache, pytest.raises(LayerRefused) as e:
        materialize(open_source(src), cache=cache)
    assert e.value.report is not None
    layers = e.value.report.layers
    assert len(layers) == which + 1 and e.value.layer == which
    refused = layers[which]
    said = str(e.value)
    assert said.startswith(f"layer {which + 1}/2 ") and f": {refused.status}: {refused.detail};" in said, said
    assert "not in the source" not in said and "the cached root of the same layers was not used" in said


def _special_layer() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind in (("dev", tarfile.DIRTYPE), ("bin", tarfile.DIRTYPE)):
            ti = tarfile.TarInfo(name)
            ti.type, ti.mode = kind, 0o755
            tf.addfile(ti)
        dev = tarfile.TarInfo("dev/sda")
        dev.type, dev.mode, dev.devmajor, dev.devminor = tarfile.BLKTYPE, 0o666, 8, 0
        tf.addfile(dev)
        suid = tarfile.TarInfo("bin/rootshell")
        suid.mode, suid.size = 0o6755, 3
        tf.addfile(suid, io.BytesIO(b"elf"))
        cap = tarfile.TarInfo("bin/capped")
        cap.size = 3
        cap.pax_headers = {"SCHILY.xattr.security.capability": "\x01\x00\x00\x02"}
        tf.addfile(cap, io.BytesIO(b"elf"))
    return buf.getvalue()


def test_device_nodes_set_id_bits_and_capabilities_are_never_written(tmp_path: Path) -> None:
    src = f"oci:{write_layout(tmp_path / 'special', [_special_layer()])}"
    with RootCache(str(tmp_path / "cache")) as cache:
        root = materialize(open_source(src), cache=cache)
    rootfs = Path(root.path)
    assert not os.path.lexists(rootfs / "dev" / "sda")
    assert stat.S_IMODE((rootfs / "bin" / "rootshell").stat().st_mode) == 0o755
    assert "security.capability" not in os.listxattr(rootfs / "bin" / "capped")
    notes = " | ".join(root.not_applied)
    assert "device nodes: 1 not created (the sandbox's /dev is its own" in notes and "/dev/sda" in notes
    assert "set-id bits: dropped from 1 files" in notes and "/bin/rootshell" in notes
    assert "file capabilities: 1 security.capability attributes not set, e.g. /bin/capped" in notes


def test_a_layer_named_by_a_sha512_digest_is_checked_by_sha512(tmp_path: Path) -> None:
    """OCI allows sha512 digests: a cache hit whose layer must be read again hashes it with the
    algorithm its digest names, and finds it OK (a sha256 of it would match nothing)."""
    folder = str(tmp_path / "cache")
    src = _image(tmp_path, "a")
    layout = Path(src[4:])
    index = json.loads((layout / "index.json").read_text())
    old = layout / "blobs/sha256" / index["manifests"][0]["digest"][7:]
    manifest = json.loads(old.read_text())
    top = layout / "blobs/sha256" / manifest["layers"][1]["digest"][7:]
    data = top.read_bytes()
    hex512 = hashlib.sha512(data).hexdigest()
    (layout / "blobs/sha512").mkdir()
    (layout / "blobs/sha512" / hex512).write_bytes(data)
    top.unlink()
    manifest["layers"][1]["digest"] = f"sha512:{hex512}"
    raw = json.dumps(manifest).encode()
    (layout / "blobs/sha256" / hashlib.sha256(raw).hexdigest()).write_bytes(raw)
    index["manifests"][0].update(digest=f"sha256:{hashlib.sha256(raw).hexdigest()}", size=len(raw))
    (layout / "index.json").write_text(json.dumps(index))
    with RootCache(folder) as cache:
        materialize(open_source(src), cache=cache)
    (Path(folder) / "pairs" / f"sha512-{hex512}").unlink()  # so the cache hit reads it
    with RootCache(folder) as cache:
        again = materialize(open_source(src), cache=cache)
    assert again.cached
    upper = again.report.layers[1]
    assert (upper.status.value, upper.actual_digest, upper.pair_recorded_at) == (
        "OK",
        f"sha512:{hex512}",
        None,
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_cache_folder_of_another_user_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    """Another user's folder, or one with another user's subfolder, could hold roots and pairs
    they planted: refused before anything is read from it or written into it."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 54321, 54321)  # a uid with no name
    with pytest.raises(UsageError) as e:
        RootCache(str(theirs))
    assert str(e.value) == (
        f"root cache {theirs}: owned by uid 54321, not by uid 0 (root) who runs imagegate: that user "
        "could plant roots and verified pairs in it; not used"
    )
    assert e.value.hint == "use a folder of your own (--cache-dir or IMAGEGATE_CACHE)"
    assert os.listdir(theirs) == []
    mine = tmp_path / "mine"
    with RootCache(str(mine)):
        pass
    os.chown(mine / "roots", 54321, 54321)
    with pytest.raises(UsageError) as e:
        RootCache(str(mine))
    assert str(e.value) == f"root cache {mine}: roots/ is owned by uid 54321, not by uid 0 (root); not used"
    assert e.value.hint == f"remove {mine / 'roots'} and look at who wrote into this folder"
    # The default folder's parent is made for imagegate too: another user's is refused as well.
    (tmp_path / "xdg" / "imagegate").mkdir(parents=True)
    os.chown(tmp_path / "xdg" / "imagegate", 54321, 54321)
    with pytest.MonkeyPatch.context() as m:
        m.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        with pytest.raises(UsageError, match=rf"^root cache {tmp_path}/xdg/imagegate: owned by uid 54321"):
            RootCache()


@pytest.mark.parametrize(
    ("mode", "who"), [(0o770, "write"), (0o702, "write"), (0o750, "reach"), (0o701, "reach")]
)
def test_a_given_folder_others_can_write_or_reach_is_refused_unchanged(
    tmp_path: Path, mode: int, who: str
) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(UsageError) as e:
        RootCache(str(folder))
    assert str(e.value) == f"root cache {folder}: mode {mode:04o}: group/others can {who} it; not used"
    assert e.value.hint == f"chmod 700 {folder} (it must be yours alone), or use another --cache-dir"
    assert stat.S_IMODE(folder.stat().st_mode) == mode and os.listdir(folder) == []


def test_a_folder_that_cannot_be_made_is_named_with_why(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    folder = tmp_path / "file" / "cache"
    with pytest.raises(UsageError) as e:
        RootCache(str(folder))
    assert str(e.value) == f"root cache {folder}: cannot create {folder}: Not a directory"
    assert e.value.hint == "choose a writable folder with --cache-dir (or IMAGEGATE_CACHE)"


def test_a_folder_made_for_the_cache_then_swapped_for_a_symlink_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between making a parent folder and using it, someone who can write beside it puts a symlink
    in its place: the cache would then live wherever the link points. Refused, as any symlink."""
    elsewhere, made = tmp_path / "elsewhere", tmp_path / "a"
    elsewhere.mkdir(mode=0o700)
    mkdir = os.mkdir

    def then_swapped(path: str, mode: int = 0o777, **kw: Any) -> None:
        mkdir(path, mode, **kw)
        if path == str(made):
            os.rmdir(path)
            os.symlink(elsewhere, path)

    monkeypatch.setattr(os, "mkdir", then_swapped)
    with pytest.raises(UsageError, match=rf"^root cache {made}: it is a symlink \(to {elsewhere}\)"):
        RootCache(str(made / "b" / "cache"))


@pytest.mark.skipif(os.geteuid() != 0, reason="running as another user needs root")
def test_a_folder_or_subfolder_of_root_is_refused_to_a_user(tmp_path: Path) -> None:
    """A cache that root wrote into (a run with sudo) is not the user's own any more: refused
    to the user, whichever uid is the lower."""
    user = 54321
    shared = Path(tempfile.mkdtemp(prefix="imagegate-uid-"))  # a place the user can reach
    try:
        shared.chmod(0o711)
        theirs, mine = shared / "theirs", shared / "mine"
        theirs.mkdir(mode=0o755)  # root's
        mine.mkdir(mode=0o700)
        os.chown(mine, user, user)
        (mine / "roots").mkdir(mode=0o755)  # root's, inside the user's folder
        os.seteuid(user)
        try:
            with pytest.raises(UsageError) as folder_error:
                RootCache(str(theirs))
            with pytest.raises(UsageError) as sub_error:
                RootCache(str(mine))
        finally:
            os.seteuid(0)
        assert str(folder_error.value).startswith(
            f"root cache {theirs}: owned by uid 0 (root), not by uid {user} who runs imagegate"
        )
        assert (
            str(sub_error.value)
            == f"root cache {mine}: roots/ is owned by uid 0 (root), not by uid {user}; not used"
        )
    finally:
        shutil.rmtree(shared)
