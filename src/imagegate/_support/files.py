"""Reading a small file the user named (a pipeline, a key, an attestation): a regular file only,
opened without blocking and read to a bound, so that a FIFO, a device (`/dev/zero`) or a huge
file is refused, named, instead of blocking, never ending or filling memory."""

from __future__ import annotations

import os
import stat

from imagegate.errors import UsageError


class FileRefused(ValueError):
    """Not a regular file, or larger than the bound; the message says which."""


def read_regular(path: str | os.PathLike[str], *, max_bytes: int) -> bytes:
    """A regular file's bytes, at most `max_bytes` of them (more raises FileRefused). O_NONBLOCK:
    opening a FIFO for reading would wait for a writer. OSError as is."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileRefused("not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise FileRefused(f"larger than {max_bytes} bytes")
    return data


def read_named(path: str | os.PathLike[str], *, what: str, max_bytes: int) -> bytes:
    """`read_regular` for a file the user named on the command line: any refusal is a
    UsageError (exit 3) naming `what`, the path and why."""
    try:
        return read_regular(path, max_bytes=max_bytes)
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot read it ({e.strerror})") from e
    except FileRefused as e:
        raise UsageError(f"{what} {path}: cannot read it: {e}") from e
