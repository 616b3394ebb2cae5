"""`docker save` archives (`docker-archive:PATH[:NAME:TAG]`), in both layouts Docker writes:
legacy (`manifest.json`, `<id>/layer.tar`, `<hex>.json`) and OCI (Docker 25+: `oci-layout`,
`index.json`, `blobs/sha256/...`). Nothing is extracted: members are read in place, and every
member name is checked so that no name (`../x`, `/etc/x`) or link can point outside the archive."""

from __future__ import annotations

import os
import posixpath
import re
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from imagegate.domain.digest import is_digest
from imagegate.errors import UsageError
from imagegate.oci import untrusted_json
from imagegate.oci.hashing import sniff_compression
from imagegate.oci.manifest import (
    DOCKER_CONFIG,
    LEGACY_ARCHIVE_LAYER,
    Descriptor,
    Platform,
)
from imagegate.oci.reference import parse_reference
from imagegate.oci.sources.interface import (
    MAX_CONFIG_BYTES,
    ArchiveMember,
    ArchiveStream,
    BlobNotFound,
    BlobReader,
    ImageSource,
    ResolvedImage,
    SourceError,
    Waiting,
)
from imagegate.oci.sources.layout import blob_path, resolve_oci_index

_HEX_NAME = re.compile(r"^(?:blobs/sha256/)?([0-9a-f]{64})(?:\.json)?$")
_MAX_LINK_HOPS = 16
# Not a registry media type: names the manifest.json entry of a legacy `docker save`.
LEGACY_SAVE_MANIFEST = "application/vnd.docker.save.manifest+json"


class UnsafeArchive(UsageError):
    """A member name or link would reach outside the archive."""


def safe_name(name: str, *, archive: str) -> str:
    """The member's normalised path; refuses absolute names and `..` escapes."""
    if "\\" in name or name.startswith("/") or "\0" in name:
        raise UnsafeArchive(
            f"{archive}: member {name!r} has an absolute or unsafe path; refusing the archive",
            hint="a docker save archive only has relative names; this file was not written by an engine",
        )
    norm = posixpath.normpath(name)
    if norm == ".." or norm.startswith("../"):
        raise UnsafeArchive(
            f"{archive}: member {name!r} escapes the archive (path traversal); refusing the archive",
            hint="a docker save archive only has relative names; this file was not written by an engine",
        )
    return "" if norm == "." else norm


def link_target(member_name: str, linkname: str, *, symlink: bool, archive: str) -> str:
    # A symlink is relative to its directory; a hard link names a path from the archive's root.
    target = posixpath.join(posixpath.dirname(member_name), linkname) if symlink else linkname
    return safe_name(target, archive=archive)


@dataclass(frozen=True)
class _Entry:
    offset: int
    size: int
    link: str | None


def _legacy_entry(entries: list[object], wanted: str | None, source: str) -> dict[str, object]:
    dicts = [e for e in entries if isinstance(e, dict)]
    if not dicts:
        raise SourceError(f"{source}: manifest.json lists no image")
    if wanted is None:
        if len(dicts) == 1:
            return dicts[0]
        tags = sorted(t for e in dicts for t in (e.get("RepoTags") or []))
        raise UsageError(
            f"{source}: holds {len(dicts)} images; say which: {', '.join(tags) or '(untagged)'}",
            hint="append :NAME:TAG to the source",
        )
    want = str(parse_reference(wanted))
    for e in dicts:
        for t in e.get("RepoTags") or []:
            try:
                if str(parse_reference(t)) == want:
                    return e
            except UsageError:
                continue
    tags = sorted(t for e in dicts for t in (e.get("RepoTags") or []))
    raise UsageError(f"{source}: no image tagged {wanted!r}; it has: {', '.join(tags) or '(untagged)'}")


def resolve_archive(
    read: Callable[[str], bytes | None],
    *,
    wanted: str | None,
    platform: Platform,
    source: str,
) -> ResolvedImage:
    """Describe the image in a `docker save` archive from its small metadata members; `read`
    returns a member's bytes or None when absent."""
    index_raw, oci_layout = read("index.json"), read("oci-layout")
    if index_raw is not None and oci_layout is not None:

        def read_blob(d: Descriptor) -> bytes:
            data = read(blob_path(d.digest)) if d.digest else None
            if data is None:
                raise BlobNotFound(f"{source}: no blob {d.digest}")
            return data

        return resolve_oci_index(index_raw, read_blob, wanted=wanted, platform=platform, source=source)
    manifest_raw = read("manifest.json")
    if manifest_raw is None:
        raise UsageError(
            f"{source}: not a docker save archive (no manifest.json, no index.json)",
            hint="write one with: docker save IMAGE -o FILE.tar",
        )
    try:
        entries = untrusted_json.loads(manifest_raw)
    except untrusted_json.UntrustedJSONError as e:
        raise SourceError(f"{source}: manifest.json is {e}") from e
    if not isinstance(entries, list):
        raise SourceError(f"{source}: manifest.json is not a list")
    entry = _legacy_entry(entries, wanted, source)
    config_path = entry.get("Config")
    layers = entry.get("Layers")
    if not isinstance(config_path, str) or not isinstance(layers, list):
        raise SourceError(f"{source}: manifest.json entry has no Config or Layers")
    config_path = safe_name(config_path, archive=source)
    m = _HEX_NAME.match(config_path)
    config = Descriptor(DOCKER_CONFIG, f"sha256:{m.group(1)}" if m else None, None, locator=config_path)
    foreign = entry.get("LayerSources") or {}
    descs = []
    for layer in layers:
        if not isinstance(layer, str):
            raise SourceError(f"{source}: manifest.json has a layer path that is not a string")
        path = safe_name(layer, archive=source)
        hm = _HEX_NAME.match(path)
        # Only an OCI blob path names the blob's digest; `<hex>.tar` names its diffID.
        digest = f"sha256:{hm.group(1)}" if hm and path.startswith("blobs/") else None
        descs.append(Descriptor(LEGACY_ARCHIVE_LAYER, digest, None, locator=path))
    return ResolvedImage(
        source=source,
        manifest_media_type=LEGACY_SAVE_MANIFEST,
        manifest_digest=None,
        config=config,
        layers=tuple(descs),
        # docker save may leave foreign layers out and describe them here, by diffID.
        foreign_diff_ids=frozenset(k for k in foreign if isinstance(k, str) and is_digest(k))
        if isinstance(foreign, dict)
        else frozenset(),
    )


class _Slice:
    """Reads one member's bytes in place, with its own file descriptor (thread-safe)."""

    def __init__(self, fd: int, offset: int, size: int):
        self.fd, self.pos, self.end = fd, offset, offset + size

    def read(self, n: int) -> bytes:
        n = min(n, self.end - self.pos)
        if n <= 0:
            return b""
        data = os.pread(self.fd, n, self.pos)
        if not data:
            raise SourceError("the archive file ends inside a member (truncated file)")
        self.pos += len(data)
        return data


def is_compressed_file(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return sniff_compression(f.read(8)) != "none"
    except OSError as e:
        raise UsageError(f"docker-archive:{path}: cannot read: {e.strerror}") from e


class DockerArchiveSource(ImageSource):
    def __init__(self, path: str, wanted: str | None, platform: Platform):
        self.path, self.wanted, self.platform = path, wanted, platform
        self.description = f"docker-archive:{path}" + (f":{wanted}" if wanted else "")
        self.entries: dict[str, _Entry] = {}
        try:
            with tarfile.open(path, "r:") as tf:
                for ti in tf:
                    self._add(ti)
        except (tarfile.TarError, OSError) as e:
            raise UsageError(f"{self.description}: not a readable tar archive: {e}") from e

    def _add(self, ti: tarfile.TarInfo) -> None:
        name = safe_name(ti.name, archive=self.description)
        if ti.isdir() or not name:
            return
        if ti.issym() or ti.islnk():
            target = link_target(name, ti.linkname, symlink=ti.issym(), archive=self.description)
            self.entries[name] = _Entry(0, 0, target)
        elif ti.isreg() and not ti.issparse():
            self.entries[name] = _Entry(ti.offset_data, ti.size, None)

    def _lookup(self, name: str) -> _Entry | None:
        for _ in range(_MAX_LINK_HOPS):
            entry = self.entries.get(name)
            if entry is None or entry.link is None:
                return entry
            name = entry.link
        raise UnsafeArchive(f"{self.description}: too many links at {name!r}")

    def _read_small(self, name: str) -> bytes | None:
        entry = self._lookup(name)
        if entry is None:
            return None
        if entry.size > MAX_CONFIG_BYTES:
            raise SourceError(f"{self.description}: {name} is too large for metadata ({entry.size} bytes)")
        with open(self.path, "rb") as f:
            f.seek(entry.offset)
            return f.read(entry.size)

    def resolve(self) -> ResolvedImage:
        return resolve_archive(
            self._read_small, wanted=self.wanted, platform=self.platform, source=self.description
        )

    def member_size(self, desc: Descriptor) -> int | None:
        entry = self._lookup(self._member(desc))
        return None if entry is None else entry.size

    def _member(self, desc: Descriptor) -> str:
        if desc.locator:
            return desc.locator
        if desc.digest:
            return blob_path(desc.digest)
        raise BlobNotFound(f"{self.description}: a layer has neither a path nor a digest")

    @contextmanager
    def open_blob(self, desc: Descriptor) -> Iterator[BlobReader]:
        name = self._member(desc)
        entry = self._lookup(name)
        if entry is None:
            raise BlobNotFound(f"{self.description}: no member {name}")
        fd = os.open(self.path, os.O_RDONLY)
        try:
            yield _Slice(fd, entry.offset, entry.size)
        finally:
            os.close(fd)


class TarStream(ArchiveStream):
    """A `docker save` tar read front to back from `open_raw()` (a file, the engine's stream)."""

    def __init__(
        self,
        description: str,
        open_raw: Callable[[], object],
        wanted: str | None = None,
        platform: Platform | None = None,
    ):
        self.description, self._open_raw, self.wanted = description, open_raw, wanted
        if platform is not None:
            self.platform = platform

    def open_raw(self, waiting: Waiting | None) -> object:
        return self._open_raw()

    @contextmanager
    def members(self, waiting: Waiting | None = None) -> Iterator[Iterator[ArchiveMember]]:
        raw = self.open_raw(waiting)
        try:
            yield self._iter(raw)
        finally:
            close = getattr(raw, "close", None)
            if close is not None:
                close()

    def _iter(self, raw: object) -> Iterator[ArchiveMember]:
        try:
            # 1 MiB reads: tarfile's default (10 KiB records) costs a Python call per 10 KiB.
            with tarfile.open(fileobj=raw, mode="r|", bufsize=1 << 20) as tf:  # type: ignore[call-overload]
                for ti in tf:
                    name = safe_name(ti.name, archive=self.description)
                    if ti.isdir() or not name:
                        continue
                    if ti.issym() or ti.islnk():
                        target = link_target(name, ti.linkname, symlink=ti.issym(), archive=self.description)
                        yield ArchiveMember(name, 0, _Empty(), link_target=target)
                    elif ti.isreg():
                        f = tf.extractfile(ti)
                        if f is not None:
                            yield ArchiveMember(name, ti.size, f)
        except (tarfile.ReadError, EOFError) as e:
            # EOFError: tarfile's stream mode on a stream that ends inside a member.
            raise SourceError(
                f"{self.description}: the archive stream is not a valid tar or ends early: {e}"
            ) from e


class _Empty:
    def read(self, n: int) -> bytes:
        return b""
