"""The seam between "where an image comes from" and "what we check about it".

Two kinds of source:
- `ImageSource` reads any blob on demand (a registry, an OCI layout, a `docker save` file):
  verification opens each layer itself, in parallel.
- `ArchiveStream` can only be read front to back, once (the engine's save endpoint, a
  compressed `docker save` file): verification hashes every member as it passes and matches
  them to the manifest found in the same stream.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

# re-exported: where the sources' users find them
from imagegate.oci.errors import BlobNotFound as BlobNotFound
from imagegate.oci.errors import SourceError as SourceError
from imagegate.oci.manifest import DEFAULT_PLATFORM, Descriptor, Platform, parse_platform

# Called while a stream has not delivered its first byte (an engine preparing its export):
# (seconds waited so far, done). Done is True once, when the first byte arrives.
Waiting = Callable[[float, bool], None]

# A config larger than this is refused: configs are kilobytes; this bounds memory.
MAX_CONFIG_BYTES = 64 << 20


class BlobReader(Protocol):
    def read(self, n: int, /) -> bytes: ...


@dataclass(frozen=True)
class ResolvedImage:
    """The one image a source names, after platform selection."""

    source: str  # the transport string, e.g. docker://127.0.0.1:5000/app:1
    manifest_media_type: str
    manifest_digest: str | None  # None where no manifest exists (legacy docker save)
    config: Descriptor
    layers: tuple[Descriptor, ...]
    platform: str | None = None
    index_digest: str | None = None  # the index the platform was chosen from
    foreign_diff_ids: frozenset[str] = frozenset()  # layers the source declares foreign


class ImageSource(ABC):
    """Random access to one image's manifest, config and blobs."""

    description: str

    @abstractmethod
    def resolve(self) -> ResolvedImage:
        """Read the manifest (choosing the platform from an index) and describe the image."""

    @abstractmethod
    def open_blob(self, desc: Descriptor) -> AbstractContextManager[BlobReader]:
        """A streaming reader of the blob's bytes, as stored (compressed). Raises BlobNotFound."""

    def member_size(self, desc: Descriptor) -> int | None:
        """The blob's stored size where the manifest does not say it (a legacy `docker save`
        names layers by path, without sizes): a source that can tell cheaply does."""
        return None

    def pinned(self) -> str | None:
        """After `resolve()`: a source string naming the very image read, where this source's
        own name may come to name another (a registry tag: pinned to the digest read); None
        where it cannot move, or nothing was read yet."""
        return None

    def confirm_unmoved(self) -> None:  # noqa: B027  (a file or a digest cannot move)
        """After everything was read: ask the name once more and raise (exit 2) if it names
        another image now, for a conclusion about the name rather than about the bytes read."""

    def close(self) -> None:  # noqa: B027  (most sources hold nothing)
        """Release connections and files."""

    def __enter__(self) -> ImageSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class ArchiveMember:
    name: str  # normalised, safe path inside the archive
    size: int
    reader: BlobReader
    link_target: str | None = None  # for a symlink or hard link member: what it points to


class ArchiveStream(ABC):
    """A `docker save` tar that can only be read once, front to back."""

    description: str
    # Choose the image among several in the archive: `name:tag`, or None when there is one.
    wanted: str | None = None
    platform: Platform = parse_platform(DEFAULT_PLATFORM)  # for an OCI archive holding an index

    @abstractmethod
    def members(self, waiting: Waiting | None = None) -> AbstractContextManager[Iterator[ArchiveMember]]:
        """The archive's members in order; each reader is valid until the next member.
        `waiting` hears about a slow start (see Waiting), where the source can tell."""

    def close(self) -> None:  # noqa: B027  (a file read front to back holds nothing between reads)
        """Release what the stream holds (an engine's export: its connection)."""


Source = ImageSource | ArchiveStream
