"""Reading a small file the user named (a pipeline, a key, an attestation): a regular file only,
opened without blocking and read to a bound, so that a FIFO, a device (`/dev/zero`) or a huge
file is refused, named, instead of blocking, never ending or filling memory."""

from __future__ import annotations

import os
import stat


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
