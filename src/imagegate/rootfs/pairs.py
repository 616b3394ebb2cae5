"""Verified pairs: (compressed blob digest -> size, diffID), recorded by this machine only after one
pass over the blob's bytes matched the manifest's digest and size and the config's diffID.

The idea of containers/image's BlobInfoCache, held to one rule: a pair is written only after a
complete verified pass (never from what a manifest or a config claims), so a later run may take
it in place of reading the blob again. One small file per blob digest in the cache folder's
`pairs/`, written to a temporary name and renamed (a reader sees a whole record or none), read
relative to the folder's fd with no symlink followed, bounded in size, owned by the runner; a
record that fails any check is as good as absent (the blob is read again)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import time
from dataclasses import dataclass

from imagegate.domain.digest import is_digest
from imagegate.oci.layercheck import LayerResult, LayerStatus

FORMAT = 1
MAX_RECORD = 1024  # a record is ~250 bytes
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


@dataclass(frozen=True)
class Pair:
    digest: str  # the blob's digest, as the manifest names it
    size: int  # the blob's bytes
    diff_id: str  # the sha256 of its uncompressed content
    recorded_at: str  # UTC, ISO 8601: when this machine verified it
    compression: str | None = None
    uncompressed_size: int | None = None


def _name(digest: str) -> str | None:
    """The record's file name; None for a digest that cannot name one (malformed)."""
    if not is_digest(digest):
        return None
    algorithm, _, hexpart = digest.partition(":")
    return f"{algorithm}-{hexpart}"


class PairStore:
    """The records in the folder `fd` (an open directory the caller checked and owns)."""

    def __init__(self, fd: int):
        self.fd = fd

    def get(self, digest: str | None) -> Pair | None:
        name = _name(digest) if digest else None
        if name is None:
            return None
        try:
            fd = os.open(name, _READ, dir_fd=self.fd)
        except OSError:  # absent, or a symlink (ELOOP): not a record
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > MAX_RECORD:
                return None
            raw = os.read(fd, MAX_RECORD + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        return _parse(raw, digest)

    def record(self, result: LayerResult) -> None:
        """Record a layer this run read whole and found OK (digest, size and diffID matched in
        that one pass); anything else is not recorded. Best effort: a record that cannot be
        written only means the blob is read next time."""
        digest, size, diff_id = result.actual_digest, result.actual_size, result.actual_diff_id
        if result.status is not LayerStatus.OK or result.pair_recorded_at is not None:
            return
        if digest != result.expected_digest or diff_id != result.expected_diff_id:
            return
        name = _name(digest) if digest else None
        if name is None or size is None or diff_id is None or not is_digest(diff_id):
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {"format": FORMAT, "digest": digest, "size": size, "diff_id": diff_id, "recorded_at": now,
                "compression": result.compression, "uncompressed_size": result.uncompressed_size}  # fmt: skip
        tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o600, dir_fd=self.fd)
            try:
                os.write(fd, json.dumps(body).encode())
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)


def _parse(raw: bytes, digest: str | None) -> Pair | None:
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("digest") != digest:
        return None
    size, diff_id, when = doc.get("size"), doc.get("diff_id"), doc.get("recorded_at")
    if type(size) is not int or size < 0 or not isinstance(diff_id, str) or not is_digest(diff_id):
        return None
    if not isinstance(when, str) or len(when) > 40:
        return None
    compression, usize = doc.get("compression"), doc.get("uncompressed_size")
    compression = compression if isinstance(compression, str) and len(compression) < 16 else None
    usize = usize if type(usize) is int and usize >= 0 else None
    assert digest is not None
    return Pair(digest, size, diff_id, when, compression, usize)
