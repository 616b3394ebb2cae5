"""The root cache: reuse by chainID, eviction of the least recently used, removal, roots in use
kept, two runs unpacking the same image at once; and its CLI."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from imagegate.errors import UsageError
from imagegate.oci.transports import open_source
from imagegate.rootfs import RootCache, materialize
from tests.oci.infra import Registry
from tests.rootfs.infra import Entry, layer_tar, write_layout

BASE = layer_tar([Entry("etc", "dir", mode=0o755), Entry("etc/os-release", data=b"ID=crafted\n")])


def _image(tmp_path: Path, name: str, size: int) -> str:
    """An oci: layout whose second layer holds `size` bytes of a file named after the image."""
    top = layer_tar([Entry(f"{name}.bin", data=os.urandom(size))])
    return f"oci:{write_layout(tmp_path / name, [BASE, top])}"


def test_second_run_reuses_the_root_without_reading_layers(cache: RootCache, tmp_path: Path) -> None:
    src = _image(tmp_path, "a", 4096)
    first = materialize(open_source(src), cache=cache)
    assert not first.cached
    # The layer blobs are gone: only the cache can answer (manifest and config are still read).
    layout = Path(src[4:])
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads((layout / "blobs/sha256" / index["manifests"][0]["digest"][7:]).read_text())
    for layer in manifest["layers"]:
        (layout / "blobs/sha256" / layer["digest"][7:]).unlink()
    cache.release(first)
    with RootCache(cache.folder, cache.max_bytes) as later:
        again = materialize(open_source(src), cache=later)
    assert again.cached and again.path == first.path and again.chain_id == first.chain_id
    assert [x.status.value for x in again.report.layers] == ["OK", "OK"]
    assert Path(again.path, "a.bin").stat().st_size == 4096


def test_eviction_least_recently_used_first_and_never_a_held_root(tmp_path: Path) -> None:
    folder = str(tmp_path / "cache")
    srcs = {n: _image(tmp_path, n, 300_000) for n in "abc"}
    with RootCache(folder, 700_000) as cache:
        a = materialize(open_source(srcs["a"]), cache=cache)
        b = materialize(open_source(srcs["b"]), cache=cache)
        cache.release(a)
        cache.release(b)
        time.sleep(0.05)
        materialize(open_source(srcs["a"]), cache=cache)  # a used again: b is now the oldest
        cache.release(a)
        c = materialize(open_source(srcs["c"]), cache=cache)
        kept = {e.chain_id for e in cache.entries()}
        assert kept == {a.chain_id, c.chain_id}
        assert not Path(b.path).exists()
    # A root a run holds is not evicted, even past the bound.
    with RootCache(folder, 700_000) as holder, RootCache(folder, 1) as other:
        held = materialize(open_source(srcs["a"]), cache=holder)
        assert held.cached
        removed = other.prune()
        assert held.chain_id not in {e.chain_id for e in removed}
        assert Path(held.path, "a.bin").exists()
        assert {e.chain_id for e in other.entries()} == {held.chain_id}


def test_remove_on_request_and_not_while_in_use(tmp_path: Path) -> None:
    folder = str(tmp_path / "cache")
    src = _image(tmp_path, "a", 1000)
    with RootCache(folder) as holder, RootCache(folder) as other:
        root = materialize(open_source(src), cache=holder)
        with pytest.raises(UsageError, match=r"root sha256:\w+ is in use by a running check; not removed"):
            other.remove(root.chain_id)
        holder.release(root)
        assert other.remove(root.chain_id) is True
        assert not Path(root.path).exists() and other.entries() == []
        assert other.remove(root.chain_id) is False


def test_remove_each_removes_what_it_can_and_names_each_problem(tmp_path: Path) -> None:
    folder = str(tmp_path / "cache")
    with RootCache(folder) as cache:
        a = materialize(open_source(_image(tmp_path, "a", 1000)), cache=cache)
        b = materialize(open_source(_image(tmp_path, "b", 1000)), cache=cache)
        cache.release(b)
        absent = "sha256:" + "0" * 64
        removed, problems = cache.remove_each(["nonsense", a.chain_id, absent, b.chain_id])
        assert removed == [b.chain_id] and [e.chain_id for e in cache.entries()] == [a.chain_id]
        assert [str(e) for e in problems] == [
            "chainID 'nonsense' is not a digest",
            f"root {a.chain_id} is in use by a running check; not removed",
            f"no root {absent} in the cache {folder}",
        ]


def test_entries_least_recently_used_first(tmp_path: Path) -> None:
    srcs = [_image(tmp_path, n, 1000) for n in "abc"]
    with RootCache(str(tmp_path / "cache")) as cache:
        by_id = {}
        for s in srcs:
            root = materialize(open_source(s), cache=cache)
            cache.release(root)
            by_id[root.chain_id] = s
        newest_last = sorted(by_id, reverse=True)  # the folders' own order, backwards
        for chain_id in newest_last:
            time.sleep(0.05)
            cache.release(materialize(open_source(by_id[chain_id]), cache=cache))
        assert [e.chain_id for e in cache.entries()] == newest_last


_RACE = """
import sys, json
from imagegate.oci.transports import open_source
from imagegate.rootfs import RootCache, materialize
with RootCache(sys.argv[1]) as cache:
    r = materialize(open_source(sys.argv[2]), cache=cache)
    print(json.dumps({"path": r.path, "cached": r.cached}))
"""


def test_two_runs_unpacking_the_same_image_at_once(registry: Registry, tmp_path: Path) -> None:
    """Two processes, one image, one cache: one unpacks, the other waits and reuses it."""
    from tests.rootfs.infra import push_layers

    big = layer_tar([Entry(f"d/f{i}", data=os.urandom(20_000)) for i in range(400)])
    src = push_layers(registry, tmp_path, "race", [BASE, big])
    folder = str(tmp_path / "cache")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACE, folder, src], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-2000:]
        outs.append(json.loads(out))
    assert outs[0]["path"] == outs[1]["path"]
    assert sorted(o["cached"] for o in outs) == [False, True]
    with RootCache(folder) as cache:
        assert len(cache.entries()) == 1
    assert os.listdir(Path(folder) / "work") == []
    assert len(list(Path(outs[0]["path"], "d").iterdir())) == 400


def test_prune_clears_what_a_dead_run_left(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    with RootCache(str(folder)):
        pass
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    left = folder / "work" / f"{'a' * 64}.{dead.stdout.strip()}.0000"
    (left / "rootfs" / "usr").mkdir(parents=True)
    (left / "rootfs" / "usr").chmod(0o555)
    with RootCache(str(folder)) as cache:
        cache.prune()
    assert not left.exists()


def _cli(*args: str, folder: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("imagegate", path=os.path.dirname(sys.executable))
    assert exe is not None
    return subprocess.run(
        [exe, "cache", *args, "--cache-dir", str(folder)], capture_output=True, text=True, timeout=300
    )


def test_cli_unpack_list_prune_remove(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    src = _image(tmp_path, "a", 1000)
    p = _cli("unpack", src, "-q", "--format", "json", folder=folder)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert Path(doc["path"], "a.bin").exists() and doc["verification"]["ok"] is True
    p = _cli("list", folder=folder)
    assert p.returncode == 0 and doc["chain_id"] in p.stdout and "1 roots" in p.stdout
    p = _cli("remove", "sha256:" + "0" * 64, folder=folder)
    assert (
        p.returncode == 3 and "no root sha256:000" in p.stderr and "hint: `imagegate cache list`" in p.stderr
    )
    p = _cli("remove", "nonsense", folder=folder)
    assert (
        p.returncode == 3 and "chainID 'nonsense' is not a digest" in p.stderr and "Traceback" not in p.stderr
    )
    p = _cli("remove", doc["chain_id"], folder=folder)
    assert p.returncode == 0 and f"removed {doc['chain_id']}" in p.stdout
    assert not Path(doc["path"]).exists()
    assert _cli("unpack", src, "-q", folder=folder).returncode == 0
    p = _cli("prune", "--all", folder=folder)
    assert p.returncode == 0 and "1 roots removed" in p.stdout


def test_cli_unpack_refused_image_exits_1(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    bad = layer_tar([Entry("../escape", data=b"x")])
    layout = write_layout(tmp_path / "bad", [BASE, bad])
    p = _cli("unpack", f"oci:{layout}", "-q", folder=folder)
    assert p.returncode == 1, p.stderr
    assert "entry '../escape' refused: '..' in the path" in p.stderr and "Traceback" not in p.stderr
    assert "hint: this layer was not written by an image builder" in p.stderr


def test_prune_keeps_the_work_folder_of_a_live_run(tmp_path: Path) -> None:
    folder = str(tmp_path / "cache")
    with RootCache(folder) as running, running.working("a" * 64) as work, RootCache(folder) as pruner:
        Path(work, "rootfs").mkdir()
        pruner.prune(0)
        assert Path(work, "rootfs").is_dir()
    assert os.listdir(Path(folder) / "work") == []


def _cached(tmp_path: Path) -> tuple[str, Path, Path]:
    """An image whose root is in a fresh cache: (source, cache folder, its entry)."""
    src, folder = _image(tmp_path, "a", 1000), tmp_path / "cache"
    with RootCache(str(folder)) as cache:
        materialize(open_source(src), cache=cache)
    (entry,) = (folder / "roots").iterdir()
    return src, folder, entry


def _plant(entry: Path, how: str, elsewhere: Path) -> str:
    """What someone else writes into the entry; the words the refusal says it in."""
    nobody = 65534
    if how == "entry-symlink":
        shutil.move(entry, elsewhere)
        entry.symlink_to(elsewhere)
        return "not a folder (a symlink?)"
    if how == "entry-file":
        shutil.rmtree(entry)
        entry.write_text("")
        return "not a folder (a symlink?)"
    if how == "entry-owner":
        os.chown(entry, nobody, nobody)
        return "owned by another user"
    if how == "lock-symlink":
        (entry / "lock").unlink()
        (entry / "lock").symlink_to(elsewhere)
        return "its lock is a symlink"
    record = entry / "root.json"
    if how == "root.json-symlink":
        shutil.move(record, elsewhere)
        record.symlink_to(elsewhere)
        return "root.json is a symlink"
    if how == "root.json-owner":
        os.chown(record, nobody, nobody)
        return "root.json is not a file of this user"
    if how == "root.json-fifo":
        record.unlink()
        os.mkfifo(record)
        return "root.json is not a file of this user"
    if how.startswith("another-chain-"):  # one that sorts before the entry's, one after
        other = "sha256:" + ("0" if how.endswith("lower") else "f") * 64
        doc = json.loads(record.read_text())
        doc["root"]["chain_id"] = other
        record.write_text(json.dumps(doc))
        return f"root.json names another chainID ({other})"
    rootfs = entry / "rootfs"
    if how == "rootfs-symlink":
        shutil.move(rootfs, elsewhere)
        rootfs.symlink_to(elsewhere)
        return f"rootfs is a symlink (to {elsewhere}), not a folder"
    if how == "rootfs-owner":
        os.chown(rootfs, nobody, nobody)
        return "rootfs is not a folder of this user"
    assert how == "rootfs-file"
    shutil.rmtree(rootfs)
    rootfs.write_text("")
    return "rootfs is not a folder of this user"


@pytest.mark.parametrize(
    "how",
    [
        "entry-symlink",
        "entry-file",
        "entry-owner",
        "lock-symlink",
        "root.json-symlink",
        "root.json-owner",
        "root.json-fifo",
        "another-chain-lower",
        "another-chain-higher",
        "rootfs-symlink",
        "rootfs-owner",
        "rootfs-file",
    ],
)
def test_an_entry_imagegate_did_not_make_is_refused_never_used(tmp_path: Path, how: str) -> None:
    """A root run as found must be one this user's imagegate made: anything else in its place is
    refused, named, and left for the user to look at, never unpacked over nor followed."""
    if os.geteuid() != 0 and how.endswith("-owner"):
        pytest.skip("giving a file to another user needs root")
    src, folder, entry = _cached(tmp_path)
    what = _plant(entry, how, tmp_path / "elsewhere")
    with RootCache(str(folder)) as cache, pytest.raises(UsageError) as e:
        materialize(open_source(src), cache=cache)
    assert str(e.value) == (
        f"root cache {folder}: roots/{entry.name}: {what}: imagegate did not make this entry; not used"
    )
    assert e.value.hint == (
        f"remove it (imagegate cache remove sha256:{entry.name} --cache-dir {folder}) and find out "
        "who wrote into this folder"
    )
    assert os.path.lexists(entry)


@pytest.mark.parametrize(
    "how",
    [
        "older-format",
        "newer-format",
        "no-root.json",
        "not-json",
        "oversized",
        "no-record",
        "record-not-an-object",
        "no-rootfs",
    ],
)
def test_an_entry_that_cannot_be_read_is_unpacked_again(tmp_path: Path, how: str) -> None:
    """An entry of this user's that cannot be read (an older imagegate's, a run cut short) is not
    a root to run: the image is unpacked again, from its verified layers, in its place."""
    src, folder, entry = _cached(tmp_path)
    record = entry / "root.json"
    if how in ("older-format", "newer-format"):
        format_ = 0 if how == "older-format" else 2
        record.write_text(json.dumps({**json.loads(record.read_text()), "format": format_}))
    elif how == "no-record":
        record.write_text(json.dumps({"format": 1}))
    elif how == "record-not-an-object":
        record.write_text(json.dumps({"format": 1, "root": []}))
    elif how == "no-rootfs":
        shutil.rmtree(entry / "rootfs")
    elif how == "no-root.json":
        record.unlink()
    elif how == "not-json":
        record.write_text(record.read_text()[:-2])
    else:  # valid JSON, past the bound on what is read
        record.write_text(record.read_text() + " " * (16 << 20))
    with RootCache(str(folder)) as cache:
        again = materialize(open_source(src), cache=cache)
    assert not again.cached and again.path == str(entry / "rootfs")
    assert Path(again.path, "a.bin").stat().st_size == 1000
    assert json.loads(record.read_text())["format"] == 1


def test_a_root_json_up_to_the_bound_is_read(tmp_path: Path) -> None:
    src, folder, entry = _cached(tmp_path)
    record = entry / "root.json"
    text = record.read_text()
    record.write_text(" " * ((16 << 20) - len(text.encode())) + text)  # 16 MiB: a byte less is not JSON
    with RootCache(str(folder)) as cache:
        again = materialize(open_source(src), cache=cache)
    assert again.cached and again.path == str(entry / "rootfs")


@pytest.mark.skipif(os.geteuid() != 0, reason="running as another user needs root")
@pytest.mark.parametrize("how", ["entry-owner", "root.json-owner", "rootfs-owner"])
def test_an_entry_root_wrote_into_a_users_cache_is_refused_to_the_user(how: str) -> None:
    """A run with sudo over the user's cache leaves root's files in it: not the user's own, so
    refused to the user as any other user's, whichever uid is the lower."""
    user = 54321
    shared = Path(tempfile.mkdtemp(prefix="imagegate-uid-"))  # a place the user can reach
    try:
        shared.chmod(0o711)
        src, folder, entry = _cached(shared)
        for top, dirs, files in os.walk(shared / "cache"):
            for name in (top, *(os.path.join(top, n) for n in (*dirs, *files))):
                os.lchown(name, user, user)
        made_by_root = {
            "entry-owner": entry,
            "root.json-owner": entry / "root.json",
            "rootfs-owner": entry / "rootfs",
        }
        os.lchown(made_by_root[how], 0, 0)
        made_by_root[how].chmod(
            0o755 if made_by_root[how].is_dir() else 0o644
        )  # readable: refused for its owner
        what = {
            "entry-owner": "owned by another user",
            "root.json-owner": "root.json is not a file of this user",
            "rootfs-owner": "rootfs is not a folder of this user",
        }[how]
        os.seteuid(user)
        try:
            with RootCache(str(folder)) as cache, pytest.raises(UsageError) as e:
                materialize(open_source(src), cache=cache)
        finally:
            os.seteuid(0)
        assert str(e.value) == (
            f"root cache {folder}: roots/{entry.name}: {what}: imagegate did not make this entry; not used"
        )
    finally:
        shutil.rmtree(shared)


def test_a_root_json_that_fails_to_open_is_not_taken_for_a_planted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache on a network home folder: a stale file handle (ESTALE) opening root.json is an
    entry that could not be read then, not one someone planted: no refusal, the entry is read
    again (under the build lock) and its root used."""
    src, folder, entry = _cached(tmp_path)
    real_open, stale_once = os.open, [True]

    def stale(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if path == "root.json" and stale_once:
            stale_once.clear()
            raise OSError(errno.ESTALE, os.strerror(errno.ESTALE))
        return real_open(path, flags, mode, dir_fd=dir_fd)

    with RootCache(str(folder)) as cache:
        monkeypatch.setattr(os, "open", stale)
        again = materialize(open_source(src), cache=cache)
        monkeypatch.undo()
    assert not stale_once and again.cached and again.path == str(entry / "rootfs")
    assert Path(again.path, "a.bin").stat().st_size == 1000
