"""OCI image layouts (`oci:DIR[:TAG]`): `oci-layout`, `index.json` and `blobs/ALG/HEX`. The
index resolution is shared with `docker save` archives in the OCI layout (Docker 25+)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from imagegate.domain.digest import digest_of, split_digest
from imagegate.errors import UsageError
from imagegate.oci import untrusted_json
from imagegate.oci.manifest import (
    INDEX_TYPES,
    Descriptor,
    Index,
    Manifest,
    ManifestError,
    Platform,
    parse_manifest,
    select_platform,
)
from imagegate.oci.sources.interface import (
    MAX_CONFIG_BYTES,
    BlobNotFound,
    BlobReader,
    ImageSource,
    ResolvedImage,
    SourceError,
)

REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"


def blob_path(digest: str) -> str:
    algorithm, hexpart = split_digest(digest)
    return f"blobs/{algorithm}/{hexpart}"


def _names(d: Descriptor) -> list[str]:
    return [n for n in (d.annotations.get(REF_NAME), d.annotations.get(CONTAINERD_NAME)) if n]


def _matches(d: Descriptor, wanted: str) -> bool:
    for name in _names(d):
        # containerd names are full references (docker.io/library/app:1); ref.name is often the tag.
        if name == wanted or name.endswith("/" + wanted) or name.rsplit(":", 1)[-1] == wanted:
            return True
    return False


def _read_manifest(read_blob: Callable[[Descriptor], bytes], desc: Descriptor, source: str) -> bytes:
    """A manifest (or index) blob, checked against the digest that names it: the image's digest
    is then one of bytes read and hashed, never only the index's claim."""
    raw = read_blob(desc)
    if desc.digest is not None:
        actual = digest_of(raw, desc.digest.partition(":")[0])
        if actual != desc.digest:
            raise SourceError(
                f"{source}: the manifest {desc.digest} hashes to {actual}: the layout was changed "
                "after it was written"
            )
    return raw


def resolve_oci_index(
    index_raw: bytes,
    read_blob: Callable[[Descriptor], bytes],
    *,
    wanted: str | None,
    platform: Platform,
    source: str,
) -> ResolvedImage:
    """Pick the image in an OCI layout's index.json (by tag, then platform) and read its manifest."""
    top = parse_manifest(index_raw, None, f"{source} index.json")
    if not isinstance(top, Index):
        raise ManifestError(f"{source}: index.json is not an image index")
    entries = [d for d in top.manifests if wanted is None or _matches(d, wanted)]
    if not entries:
        names = sorted({n for d in top.manifests for n in _names(d)})
        raise UsageError(
            f"{source}: no image tagged {wanted!r}; the layout has: {', '.join(names) or '(no names)'}",
            hint="name one of those after the last colon",
        )
    index_digest = None
    if len(entries) > 1 and all(d.platform is not None for d in entries):
        chosen = select_platform(Index(top.media_type, tuple(entries)), platform, source)
    elif len(entries) > 1:
        names = sorted({n for d in entries for n in _names(d)})
        raise UsageError(
            f"{source}: holds {len(entries)} images; say which: {', '.join(names) or '(unnamed)'}",
            hint="append :TAG to the source",
        )
    else:
        chosen = entries[0]
    doc = parse_manifest(_read_manifest(read_blob, chosen, source), chosen.media_type, source)
    if isinstance(doc, Index) or chosen.media_type in INDEX_TYPES:
        if not isinstance(doc, Index):
            raise ManifestError(f"{source}: {chosen.digest} is declared an index but is a manifest")
        index_digest = chosen.digest
        chosen = select_platform(doc, platform, source)
        doc = parse_manifest(_read_manifest(read_blob, chosen, source), chosen.media_type, source)
        if not isinstance(doc, Manifest):
            raise ManifestError(f"{source}: nested indexes are not supported")
    return ResolvedImage(
        source=source,
        manifest_media_type=doc.media_type,
        manifest_digest=chosen.digest,
        config=doc.config,
        layers=doc.layers,
        platform=str(chosen.platform) if chosen.platform else None,
        index_digest=index_digest,
    )


class _File:
    def __init__(self, fd: int):
        self.fd = fd

    def read(self, n: int) -> bytes:
        return os.read(self.fd, n)


class OciLayoutSource(ImageSource):
    def __init__(self, directory: str, wanted: str | None, platform: Platform):
        self.root = Path(directory)
        self.wanted, self.platform = wanted, platform
        self.description = f"oci:{directory}" + (f":{wanted}" if wanted else "")
        if not (self.root / "oci-layout").is_file() or not (self.root / "index.json").is_file():
            raise UsageError(
                f"{self.description}: {directory} is not an OCI image layout (no oci-layout or index.json)",
                hint="write one with: skopeo copy docker://... oci:DIR:TAG",
            )

    def _read_small(self, desc: Descriptor) -> bytes:
        with self.open_blob(desc) as r:
            data = r.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise SourceError(f"{self.description}: {desc.digest} is too large for a manifest")
        return data

    def resolve(self) -> ResolvedImage:
        try:
            layout = untrusted_json.loads((self.root / "oci-layout").read_bytes())
            index_raw = (self.root / "index.json").read_bytes()
        except (OSError, ValueError) as e:
            raise SourceError(f"{self.description}: cannot read the layout: {e}") from e
        if not isinstance(layout, dict) or "imageLayoutVersion" not in layout:
            raise SourceError(f"{self.description}: oci-layout has no imageLayoutVersion")
        return resolve_oci_index(
            index_raw, self._read_small, wanted=self.wanted, platform=self.platform, source=self.description
        )

    @contextmanager
    def open_blob(self, desc: Descriptor) -> Iterator[BlobReader]:
        if desc.digest is None:
            raise BlobNotFound(f"{self.description}: a blob without a digest cannot be found")
        path = self.root / blob_path(desc.digest)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError as e:
            raise BlobNotFound(f"{self.description}: no blob {desc.digest}") from e
        except OSError as e:
            raise SourceError(f"{self.description}: cannot open {path}: {e}") from e
        try:
            yield _File(fd)
        finally:
            os.close(fd)
