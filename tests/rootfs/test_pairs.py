"""The pair store the root cache trusts (rootfs/pairs.py) on its own: a pair is recorded only
from a layer read whole and found OK, read back only under its own digest, in the form this code
wrote, from a file of the runner's own within 1 KiB; anything else is as good as absent.
tests/rootfs/test_cache_trust.py shows the same through whole runs; these run in a second and
are what scripts/mutation.py runs against the module."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imagegate.oci.layercheck import LayerResult, LayerStatus
from imagegate.rootfs.pairs import MAX_RECORD, Pair, PairStore

DIGEST = "sha256:" + "ab" * 32
DIFF_ID = "sha256:" + "cd" * 32
OK = LayerResult(
    index=0,
    status=LayerStatus.OK,
    media_type="application/vnd.oci.image.layer.v1.tar+gzip",
    compression="gzip",
    expected_digest=DIGEST,
    actual_digest=DIGEST,
    expected_size=1234,
    actual_size=1234,
    expected_diff_id=DIFF_ID,
    actual_diff_id=DIFF_ID,
    uncompressed_size=4096,
    detail="ok",
)


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[tuple[Path, PairStore]]:
    path = tmp_path / "pairs"
    path.mkdir(mode=0o700)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield path, PairStore(fd)
    finally:
        os.close(fd)


def _record(path: Path) -> dict[str, Any]:
    return json.loads((path / f"sha256-{'ab' * 32}").read_text())  # type: ignore[no-any-return]


def test_a_layer_read_whole_and_ok_is_recorded_and_read_back(folder: tuple[Path, PairStore]) -> None:
    path, store = folder
    store.record(OK)
    assert os.listdir(path) == [f"sha256-{'ab' * 32}"]  # no temporary file left beside it
    doc = _record(path)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", doc["recorded_at"]), doc
    assert {k: v for k, v in doc.items() if k != "recorded_at"} == {
        "format": 1, "digest": DIGEST, "size": 1234, "diff_id": DIFF_ID,
        "compression": "gzip", "uncompressed_size": 4096,
    }  # fmt: skip
    assert store.get(DIGEST) == Pair(DIGEST, 1234, DIFF_ID, doc["recorded_at"], "gzip", 4096)
    assert oct(os.stat(path / f"sha256-{'ab' * 32}").st_mode & 0o777) == "0o600"


@pytest.mark.parametrize(
    "change",
    [
        {"status": LayerStatus.DIGEST_MISMATCH},
        {"status": LayerStatus.MISSING},
        {"pair_recorded_at": "2026-01-01T00:00:00Z"},  # itself stood in by a pair: not read now
        {"actual_digest": "sha256:" + "ef" * 32},  # another blob than the manifest names
        {"actual_diff_id": "sha256:" + "ef" * 32},  # another content than the config names
        {"actual_digest": None, "expected_digest": None},
        {"actual_digest": "sha256:short", "expected_digest": "sha256:short"},
        {"actual_size": None},
        {"actual_diff_id": None, "expected_diff_id": None},
        {"actual_diff_id": "md5:x", "expected_diff_id": "md5:x"},
    ],
)
def test_nothing_else_is_recorded(folder: tuple[Path, PairStore], change: dict[str, Any]) -> None:
    path, store = folder
    store.record(dataclasses.replace(OK, **change))
    assert os.listdir(path) == []


def test_a_record_that_cannot_be_written_only_means_the_blob_is_read_again(
    folder: tuple[Path, PairStore],
) -> None:
    path, store = folder
    (path / f"sha256-{'ab' * 32}").mkdir()  # the record's name taken: the rename fails
    store.record(OK)  # no exception
    assert store.get(DIGEST) is None
    assert os.listdir(path) == [f"sha256-{'ab' * 32}"]  # the temporary file removed


def _write(path: Path, doc: dict[str, Any] | bytes, name: str = f"sha256-{'ab' * 32}") -> None:
    (path / name).write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())


GOOD = {"format": 1, "digest": DIGEST, "size": 1234, "diff_id": DIFF_ID, "recorded_at": "2026-12-02T10:00:00Z",
        "compression": "gzip", "uncompressed_size": 4096}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "used"),
    [
        ({}, True),
        ({"format": 2}, False),
        ({"format": 0}, False),
        ({"digest": "sha256:" + "ef" * 32}, False),  # a record moved under another blob's name
        ({"digest": "sha256:" + "00" * 32}, False),
        ({"size": -1}, False),
        ({"size": 0}, True),
        ({"size": 12.0}, False),
        ({"size": True}, False),  # a bool is an int to isinstance, not a size
        ({"size": "1234"}, False),
        ({"diff_id": "sha256:nothex"}, False),
        ({"diff_id": 5}, False),
        ({"recorded_at": 5}, False),
        ({"recorded_at": "x" * 40}, True),
        ({"recorded_at": "x" * 41}, False),
    ],
)
def test_a_record_is_used_only_in_the_form_this_code_wrote(
    folder: tuple[Path, PairStore], change: dict[str, Any], used: bool
) -> None:
    path, store = folder
    _write(path, {**GOOD, **change})
    assert (store.get(DIGEST) is not None) is used


@pytest.mark.parametrize(
    ("change", "compression", "usize"),
    [
        ({}, "gzip", 4096),
        ({"compression": "z" * 15, "uncompressed_size": 0}, "z" * 15, 0),
        ({"compression": "z" * 16, "uncompressed_size": -1}, None, None),
        ({"compression": "z" * 17}, None, 4096),
        ({"compression": 5, "uncompressed_size": 4096.0}, None, None),
        ({"compression": None, "uncompressed_size": True}, None, None),
    ],
)
def test_what_a_record_says_beyond_the_pair_is_taken_only_when_well_formed(
    folder: tuple[Path, PairStore], change: dict[str, Any], compression: str | None, usize: int | None
) -> None:
    path, store = folder
    _write(path, {**GOOD, **change})
    pair = store.get(DIGEST)
    assert pair is not None and (pair.compression, pair.uncompressed_size) == (compression, usize)


def test_a_record_is_read_only_from_a_file_of_the_runners_own_within_its_bound(
    folder: tuple[Path, PairStore], tmp_path: Path
) -> None:
    path, store = folder
    name = f"sha256-{'ab' * 32}"
    empty = json.dumps({**GOOD, "pad": ""}).encode()
    # exactly the bound, read whole (a record cut short is no JSON); one byte over: not read
    _write(path, json.dumps({**GOOD, "pad": "x" * (MAX_RECORD - len(empty))}).encode())
    assert (path / name).stat().st_size == MAX_RECORD and store.get(DIGEST) is not None
    _write(path, json.dumps({**GOOD, "pad": "x" * (MAX_RECORD + 1 - len(empty))}).encode())
    assert store.get(DIGEST) is None
    _write(path, b"{not json")
    assert store.get(DIGEST) is None
    (path / name).unlink()
    (tmp_path / "planted").write_text(json.dumps(GOOD))
    (path / name).symlink_to(tmp_path / "planted")  # never followed
    assert store.get(DIGEST) is None
    (path / name).unlink()
    (path / name).mkdir()  # not a regular file
    assert store.get(DIGEST) is None
    (path / name).rmdir()
    _write(path, GOOD)
    os.chown(path / name, 65534, 65534)  # another user's file
    assert store.get(DIGEST) is None
    if os.geteuid() == 0:  # and root's file, read by another user (one whose uid is higher)
        (path / name).chmod(0o644)
        os.chown(path / name, 0, 0)
        os.chown(path, 65534, 65534)
        os.seteuid(65534)
        try:
            assert store.get(DIGEST) is None
        finally:
            os.seteuid(0)
    # a digest that cannot name a record, or none at all: nothing is looked up
    for digest in (None, "", "sha256:AB", "../" + DIGEST):
        assert store.get(digest) is None


# Reads the record of DIGEST from a folder whose record file is the process's own memory file,
# bound over it in a mount namespace of its own: a regular file of its own, within the bound,
# whose read fails (EIO) -- as a record on a failing disk would.
UNREADABLE = """
import ctypes, os, sys
from imagegate.rootfs.pairs import PairStore
folder, name, digest = sys.argv[1:]
libc = ctypes.CDLL(None, use_errno=True)
if libc.mount(b"/proc/self/mem", os.path.join(folder, name).encode(), None, 4096, None) != 0:  # MS_BIND
    sys.exit("bind mount: " + os.strerror(ctypes.get_errno()))
try:
    os.read(os.open(os.path.join(folder, name), os.O_RDONLY), 10)
except OSError as e:
    print("read fails:", e.strerror)
print("record:", PairStore(os.open(folder, os.O_RDONLY | os.O_DIRECTORY)).get(digest))
"""


def test_a_record_that_cannot_be_read_is_as_good_as_absent(folder: tuple[Path, PairStore]) -> None:
    path, _ = folder
    name = f"sha256-{'ab' * 32}"
    _write(path, b"")
    argv = ["unshare", "--user", "--map-root-user", "--mount", sys.executable, "-c", UNREADABLE]
    done = subprocess.run([*argv, str(path), name, DIGEST], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["read fails: Input/output error", "record: None"]
