"""rootfs/known.py: a blob is read at most once per run, however many images name it at the same
time; only a read that verified vouches for it (for a manifest naming that digest and size and a
config naming that diffID); the pair store keeps it for later runs unless --no-cache."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from imagegate._support import interrupts
from imagegate.oci.layercheck import LayerResult, LayerStatus
from imagegate.oci.manifest import Descriptor
from imagegate.rootfs.known import Known
from imagegate.rootfs.pairs import PairStore

DIGEST = "sha256:" + "a" * 64
DIFF_ID = "sha256:" + "b" * 64
OTHER = "sha256:" + "c" * 64
SMALLER = "sha256:" + "0" * 64  # sorts before the others: a comparison turned into < or > is seen


def _desc(size: int = 100, digest: str = DIGEST) -> Descriptor:
    return Descriptor("application/vnd.oci.image.layer.v1.tar+gzip", digest, size)


def _result(
    i: int, status: LayerStatus = LayerStatus.OK, diff_id: str = DIFF_ID, size: int = 100
) -> LayerResult:
    return LayerResult(
        i, status, "application/vnd.oci.image.layer.v1.tar+gzip", "gzip", DIGEST, DIGEST, size, size,
        diff_id, DIFF_ID if status is LayerStatus.OK else diff_id, 300, "",
    )  # fmt: skip


class Reads:
    """A read that takes `seconds` and answers `status`; counts the reads."""

    def __init__(self, seconds: float = 0.0, status: LayerStatus = LayerStatus.OK):
        self.seconds, self.status, self.count = seconds, status, 0
        self.lock = threading.Lock()

    def __call__(self, i: int) -> Callable[[], LayerResult]:
        def read() -> LayerResult:
            with self.lock:
                self.count += 1
            time.sleep(self.seconds)
            return _result(i, self.status)

        return read


def test_readers_of_one_digest_at_the_same_time_wait_for_one_read() -> None:
    known, reads = Known(None), Reads(seconds=0.3)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: known.once(i, _desc(), DIFF_ID, reads(i)), range(8)))
    assert reads.count == 1
    assert [r.status for r in results] == [LayerStatus.OK] * 8
    assert [r.index for r in results] == list(range(8))  # each its own position
    assert sum(1 for r in results if r.pair_recorded_at is None) == 1  # one read, seven known
    assert (known.tally.read, known.tally.known, known.tally.known_bytes) == (1, 7, 700)
    vouched = next(r for r in results if r.pair_recorded_at)
    assert "read once in this run" in vouched.detail and "not read again" in vouched.detail


def test_a_read_that_did_not_verify_vouches_for_nothing() -> None:
    known, bad = Known(None), Reads(seconds=0.2, status=LayerStatus.DIGEST_MISMATCH)
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda i: known.once(i, _desc(), DIFF_ID, bad(i)), range(3)))
    assert bad.count == 3  # each reader read its own source's bytes
    assert all(r.status is LayerStatus.DIGEST_MISMATCH for r in results)
    good = Reads()
    assert known.once(0, _desc(), DIFF_ID, good(0)).pair_recorded_at is None and good.count == 1


def test_a_known_digest_vouches_only_for_its_size_and_diff_id() -> None:
    known, reads = Known(None), Reads()
    known.once(0, _desc(), DIFF_ID, reads(0))
    assert known.once(1, _desc(), DIFF_ID, reads(1)).pair_recorded_at is not None and reads.count == 1
    known.once(2, _desc(size=101), DIFF_ID, reads(2))  # another size declared: read
    known.once(2, _desc(size=99), DIFF_ID, reads(2))
    known.once(3, _desc(), OTHER, reads(3))  # another diffID in the config: read
    known.once(3, _desc(), SMALLER, reads(3))
    known.once(4, _desc(digest=OTHER), DIFF_ID, reads(4))  # another digest: read
    assert reads.count == 6


def test_a_blob_named_by_no_digest_is_read_every_time() -> None:
    known, reads = Known(None), Reads()
    legacy = Descriptor("application/x-tar", None, None, locator="layer.tar")
    for i in range(2):
        known.once(i, legacy, DIFF_ID, reads(i))
    assert reads.count == 2 and (known.tally.read, known.tally.known) == (2, 0)


def test_a_result_the_manifest_did_not_name_is_not_recorded() -> None:
    """A result says OK, but what was read is not what the manifest and config name: each such
    would, recorded, vouch for exactly what it read; none is recorded."""
    t, ok = "application/vnd.oci.image.layer.v1.tar+gzip", LayerStatus.OK
    for wrong in (
        LayerResult(
            0, ok, t, "gzip", OTHER, DIGEST, 100, 100, DIFF_ID, DIFF_ID, 1, ""
        ),  # hashed to another digest
        LayerResult(0, ok, t, "gzip", SMALLER, DIGEST, 100, 100, DIFF_ID, DIFF_ID, 1, ""),
        LayerResult(0, ok, t, "gzip", DIGEST, DIGEST, 100, 101, DIFF_ID, DIFF_ID, 1, ""),  # another size
        LayerResult(0, ok, t, "gzip", DIGEST, DIGEST, 100, 99, DIFF_ID, DIFF_ID, 1, ""),
        LayerResult(0, ok, t, "gzip", DIGEST, DIGEST, 100, 100, DIFF_ID, OTHER, 1, ""),  # another diffID
        LayerResult(0, ok, t, "gzip", DIGEST, DIGEST, 100, 100, DIFF_ID, SMALLER, 1, ""),
        LayerResult(
            0, ok, t, "gzip", DIGEST, DIGEST, 100, 100, DIFF_ID, DIFF_ID, 1, "", pair_recorded_at="x"
        ),
        LayerResult(
            0, LayerStatus.DIFFID_MISMATCH, t, "gzip", DIGEST, DIGEST, 100, 100, DIFF_ID, DIFF_ID, 1, ""
        ),
    ):
        known, reads = Known(None), Reads()
        known.once(0, _desc(), DIFF_ID, lambda w=wrong: w)  # type: ignore[misc]
        assert wrong.actual_digest and wrong.actual_size and wrong.actual_diff_id
        # What the result would vouch for, had it been recorded: read all the same.
        known.once(1, _desc(wrong.actual_size, wrong.actual_digest), wrong.actual_diff_id, reads(1))
        assert reads.count == 1, wrong


def test_a_blob_the_source_does_not_have_counts_no_bytes() -> None:
    known = Known(None)
    missing = LayerResult(0, LayerStatus.MISSING, "t", None, DIGEST, None, 100, None, DIFF_ID, None, None, "")
    known.once(0, _desc(), DIFF_ID, lambda: missing)
    assert (known.tally.read, known.tally.read_bytes, known.tally.known) == (1, 0, 0)


def test_the_pair_store_keeps_what_verified_for_the_next_run(tmp_path: Path) -> None:
    folder = tmp_path / "pairs"
    folder.mkdir(mode=0o700)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        reads = Reads()
        Known(PairStore(fd)).once(0, _desc(), DIFF_ID, reads(0))
        later = Known(PairStore(fd)).once(0, _desc(), DIFF_ID, reads(0))
        assert reads.count == 1 and later.pair_recorded_at is not None
        assert "a verified pair this machine recorded" in later.detail
        Known(None).once(0, _desc(), DIFF_ID, reads(0))  # --no-cache: read, and nothing written
        assert reads.count == 2
    finally:
        os.close(fd)
    assert [p.name for p in folder.iterdir()] == ["sha256-" + "a" * 64]


def test_a_reader_waiting_for_another_read_ends_on_a_stop() -> None:
    known, slow = Known(None), Reads(seconds=3.0)
    first = threading.Thread(target=lambda: known.once(0, _desc(), DIFF_ID, slow(0)))
    first.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    threading.Timer(0.3, interrupts.stop).start()
    with pytest.raises(interrupts.Stopped):
        known.once(1, _desc(), DIFF_ID, slow(1))
    assert time.monotonic() - t0 < 2.0
    first.join()
