"""A `docker save` stream (the engine's export, a compressed archive) can only be read front to
back and names its layer order last (manifest.json): its members are kept in a work folder
first, then read like any other source."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from imagegate.oci.manifest import Descriptor
from imagegate.oci.sources.archive import resolve_archive
from imagegate.oci.sources.interface import (
    MAX_CONFIG_BYTES,
    ArchiveStream,
    BlobNotFound,
    BlobReader,
    ImageSource,
    ResolvedImage,
    SourceError,
    Waiting,
)
from imagegate.oci.sources.layout import blob_path

_CHUNK = 1 << 20
_MAX_LINK_HOPS = 16


class SpooledArchive(ImageSource):
    """The members of an archive stream, kept as files under `folder` (names already made safe
    by the stream: no absolute names, no `..`)."""

    def __init__(self, stream: ArchiveStream, folder: str, links: dict[str, str]):
        self.description, self._stream = stream.description, stream
        self.folder, self.links = folder, links

    def _path(self, name: str) -> str:
        for _ in range(_MAX_LINK_HOPS):
            if name not in self.links:
                return os.path.join(self.folder, name)
            name = self.links[name]
        raise SourceError(f"{self.description}: too many links at {name!r}")

    def _read_small(self, name: str) -> bytes | None:
        try:
            with open(self._path(name), "rb") as f:
                data = f.read(MAX_CONFIG_BYTES + 1)
        except (FileNotFoundError, IsADirectoryError):
            return None
        if len(data) > MAX_CONFIG_BYTES:
            raise SourceError(f"{self.description}: {name} is too large for metadata")
        return data

    def resolve(self) -> ResolvedImage:
        return resolve_archive(
            self._read_small,
            wanted=self._stream.wanted,
            platform=self._stream.platform,
            source=self.description,
        )

    @contextmanager
    def open_blob(self, desc: Descriptor) -> Iterator[BlobReader]:
        name = desc.locator or (blob_path(desc.digest) if desc.digest else None)
        if name is None:
            raise BlobNotFound(f"{self.description}: a layer has neither a path nor a digest")
        try:
            f = open(self._path(name), "rb")  # noqa: SIM115  (closed below)
        except (FileNotFoundError, IsADirectoryError):
            raise BlobNotFound(f"{self.description}: no member {name}") from None
        with f:
            yield f


@contextmanager
def spool_archive(
    stream: ArchiveStream, folder: str, *, max_bytes: int, waiting: Waiting | None = None
) -> Iterator[SpooledArchive]:
    """Keep every member of `stream` under `folder`; refuses an archive past `max_bytes`."""
    links: dict[str, str] = {}
    total = 0
    with stream.members(waiting) as members:
        for m in members:
            if m.link_target is not None:
                links[m.name] = m.link_target
                continue
            path = os.path.join(folder, m.name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as out:
                while chunk := m.reader.read(_CHUNK):
                    total += len(chunk)
                    if total > max_bytes:
                        raise SourceError(
                            f"{stream.description}: the archive holds more than {max_bytes} bytes, the bound "
                            "on the image; stopped reading it",
                            hint="raise --max-image-size if this image really is that large",
                        )
                    out.write(chunk)
    yield SpooledArchive(stream, folder, links)
