"""The single-pass digests on real bytes: gzip (ISA-L), zstd, xz, bzip2, uncompressed; the failure modes."""

from __future__ import annotations

import bz2
import functools
import gzip
import hashlib
import io
import lzma
import os
import subprocess
import threading

import pytest
import zstandard

from imagegate.oci.hashing import decompressing_reader, digest_blob
from tests.oci.infra import PY_LIB


def _tar_bytes() -> bytes:
    return subprocess.run(
        ["tar", "-cf", "-", "-C", str(PY_LIB), "json", "email"], capture_output=True, check=True
    ).stdout


def _sha(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


def test_gzip_zstd_xz_bzip2_and_plain_give_the_same_diffid() -> None:
    tar = _tar_bytes()
    pigz = subprocess.run(["pigz", "-c", "-9"], input=tar, capture_output=True, check=True).stdout
    for blob, kind in [
        (gzip.compress(tar), "gzip"),
        (pigz, "gzip"),
        (gzip.compress(tar[:1000]) + gzip.compress(tar[1000:]), "gzip"),  # two members, as Go reads them
        (zstandard.ZstdCompressor(level=3).compress(tar), "zstd"),
        (lzma.compress(tar), "xz"),
        (bz2.compress(tar), "bzip2"),
        (tar, "none"),
    ]:
        got = digest_blob(io.BytesIO(blob), declared_size=len(blob))
        assert got.compression == kind
        assert got.digest == _sha(blob)
        assert got.diff_id == _sha(tar), kind
        assert got.uncompressed_size == len(tar)
        assert got.decompress_error is None


def test_corrupt_and_truncated_streams_are_errors() -> None:
    tar = _tar_bytes()
    gz = bytearray(gzip.compress(tar))
    gz[len(gz) // 2] ^= 0xFF
    assert "invalid gzip data" in (digest_blob(io.BytesIO(bytes(gz))).decompress_error or "")
    gz = gzip.compress(tar)
    assert "truncated" in (digest_blob(io.BytesIO(gz[:-50])).decompress_error or "")
    assert "trailing data" in (digest_blob(io.BytesIO(gz + b"junk")).decompress_error or "")
    zs = zstandard.ZstdCompressor().compress(tar)
    assert "truncated" in (digest_blob(io.BytesIO(zs[:-50])).decompress_error or "")


def test_longer_than_declared_stops_reading() -> None:
    data = b"x" * 5000
    got = digest_blob(io.BytesIO(data), declared_size=1000, layer=False)
    assert got.too_long and got.digest is None and got.size == 1001


def test_decompression_bomb_is_stopped() -> None:
    bomb = gzip.compress(b"\0" * (64 << 20), 9)
    assert len(bomb) < 200_000
    got = digest_blob(io.BytesIO(bomb), max_uncompressed=16 << 20)
    assert got.diff_id is None
    assert "decompression bomb" in (got.decompress_error or "")
    assert got.digest == _sha(bomb)  # the blob digest is still checked


def test_threaded_pipeline_gives_the_same_results_as_one_thread() -> None:
    """Large blobs are read, inflated and hashed across threads: same digests, same failures."""
    tar = _tar_bytes()
    gz = gzip.compress(tar)
    zs = zstandard.ZstdCompressor(level=3).compress(tar)
    corrupt = bytearray(gz)
    corrupt[len(corrupt) // 2] ^= 0xFF
    cases = [gz, zs, tar, bytes(corrupt), gz[:-50], gz + b"junk"]
    for blob in cases:
        for declared in (None, len(blob), len(blob) - 10):
            one = digest_blob(io.BytesIO(blob), declared_size=declared, pipeline=False)
            many = digest_blob(io.BytesIO(blob), declared_size=declared, pipeline=True)
            assert many == one, (declared, one.decompress_error)
    assert digest_blob(io.BytesIO(gz), pipeline=True).diff_id == _sha(tar)


def test_threaded_pipeline_raises_what_the_source_raises() -> None:
    class Broken:
        def __init__(self) -> None:
            self.n = 0

        def read(self, n: int) -> bytes:
            self.n += 1
            if self.n > 3:
                raise OSError("connection reset by the registry")
            return b"\x1f\x8b" + b"\0" * (n - 2) if self.n == 1 else b"\0" * n

    with pytest.raises(OSError, match="connection reset by the registry"):
        digest_blob(Broken(), pipeline=True)


def test_threaded_pipeline_stops_its_thread_when_the_pass_stops() -> None:
    """A tap that raises (an unpack refusing an entry) stops the pass: the error reaches the
    caller and no thread is left reading the source."""
    gz = gzip.compress(os.urandom(1 << 20) * 24)  # several chunks in and out
    before = set(threading.enumerate())
    calls = 0

    def tap(data: bytes) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("hostile entry")

    with pytest.raises(RuntimeError, match="hostile entry"):
        digest_blob(io.BytesIO(gz), pipeline=True, tap=tap)
    assert set(threading.enumerate()) <= before
    assert (
        digest_blob(io.BytesIO(gz), pipeline=True).diff_id
        == digest_blob(io.BytesIO(gz), pipeline=False).diff_id
    )


def test_threaded_pipeline_under_uneven_reads_and_small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two threads hand work back and forth (either one reads or hashes, in order): with
    tiny chunks and a source that stalls at random, every result is the single thread's."""
    import random
    import time

    import imagegate.oci.hashing as hashing

    monkeypatch.setattr(hashing, "READ_CHUNK", 4096)
    monkeypatch.setattr(hashing, "OUT_CHUNK", 8192)
    rng = random.Random(7)
    data = rng.randbytes(40_000) * 6 + bytes(100_000)

    class Uneven:
        def __init__(self, blob: bytes):
            self.f = io.BytesIO(blob)

        def read(self, n: int) -> bytes:
            if rng.random() < 0.05:
                time.sleep(rng.random() / 2000)
            return self.f.read(rng.randint(1, n))

    for blob in (gzip.compress(data), zstandard.ZstdCompressor().compress(data), data):
        for declared in (None, len(blob), len(blob) - 5):
            for _ in range(5):
                many = digest_blob(Uneven(blob), declared_size=declared, pipeline=True)
                assert many == digest_blob(io.BytesIO(blob), declared_size=declared, pipeline=False)
    assert digest_blob(Uneven(gzip.compress(data)), pipeline=True).diff_id == _sha(data)


def test_compression_is_found_when_the_first_read_is_short() -> None:
    """A source may return fewer bytes than asked (a socket, a chunk boundary of an engine's
    export): the magic is sniffed from enough bytes, not from the first read alone."""
    tar = _tar_bytes()
    blobs = {
        "gzip": gzip.compress(tar),
        "zstd": zstandard.ZstdCompressor().compress(tar),
        "xz": lzma.compress(tar),
    }

    class ShortFirst:
        def __init__(self, blob: bytes):
            self.f, self.first = io.BytesIO(blob), True

        def read(self, n: int) -> bytes:
            if self.first:
                self.first = False
                return self.f.read(1)
            return self.f.read(n)

    for kind, blob in blobs.items():
        for pipeline in (False, True):
            got = digest_blob(ShortFirst(blob), declared_size=len(blob), pipeline=pipeline)
            assert (got.compression, got.diff_id) == (kind, _sha(tar)), (kind, pipeline)
        reader = decompressing_reader(ShortFirst(blob))
        assert b"".join(iter(functools.partial(reader.read, 1 << 20), b"")) == tar, kind
