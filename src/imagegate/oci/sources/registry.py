"""`docker://REF`: an image in a registry, read over the OCI distribution API."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from imagegate.errors import UsageError
from imagegate.oci.manifest import (
    Descriptor,
    Index,
    Manifest,
    ManifestError,
    Platform,
    parse_manifest,
    select_platform,
)
from imagegate.oci.reference import Reference
from imagegate.oci.registry import NotFound, RegistryClient, RegistryError
from imagegate.oci.sources.interface import BlobNotFound, BlobReader, ImageSource, ResolvedImage


class ReferenceMoved(RegistryError):
    """A tag named one manifest when it was read and another when asked again in the same
    command: what was read is no longer what the tag names, so nothing is concluded (exit 2)."""


class RegistrySource(ImageSource):
    """One image of a registry, read once: the reference is resolved to a digest at the first
    `resolve()`, and everything after it (the same image again, its blobs, a reopening through
    `pinned()`) is read by that digest, so a tag moved mid-way cannot mix two images."""

    def __init__(
        self,
        ref: Reference,
        platform: Platform,
        *,
        insecure: bool = False,
        client: RegistryClient | None = None,
    ):
        self.ref, self.platform = ref, platform
        self.description = f"docker://{ref}"
        self.client = client or RegistryClient(ref.endpoint, insecure=insecure)
        self._resolved: ResolvedImage | None = None
        self._top: str | None = None  # the digest the reference named at its one read

    def resolve(self) -> ResolvedImage:
        if self._resolved is None:
            self._resolved = self._read()
        return self._resolved

    def pinned(self) -> str | None:
        if self._top is None or self.ref.digest is not None:
            return None
        return f"docker://{self.ref.with_digest(self._top)}"

    def confirm_unmoved(self) -> None:
        if self._top is None or self.ref.digest is not None:
            return
        now = self.client.get_manifest(self.ref.repository, self.ref.ref).digest
        if now != self._top:
            raise ReferenceMoved(
                f"{self.description}: the tag named {self._top} when it was read and names {now} "
                "now: it changed between reads, so what was read is not what it names; nothing "
                "was concluded about it",
                hint="name the image by its digest and run again (the one read: "
                f"{self.ref.registry}/{self.ref.repository}@{self._top})",
            )

    def _read(self) -> ResolvedImage:
        repo = self.ref.repository
        try:
            top = self.client.get_manifest(repo, self.ref.ref)
        except NotFound as e:
            # The image named does not exist there: an input error (exit 3), as a name the engine
            # lacks is; a registry out of reach stays "could not decide".
            raise UsageError(
                f"{self.description}: image not found in the registry ({e})",
                hint="check the repository and tag (or digest); push the image first",
            ) from e
        self._top = top.digest  # of the bytes read: what every later step is pinned to
        doc = parse_manifest(top.raw, top.media_type, self.description)
        index_digest, digest, media_type, platform = None, top.digest, top.media_type, None
        if isinstance(doc, Index):
            chosen = select_platform(doc, self.platform, self.description)
            assert chosen.digest is not None
            index_digest, platform = top.digest, str(chosen.platform)
            child = self.client.get_manifest(repo, chosen.digest)
            doc = parse_manifest(child.raw, child.media_type or chosen.media_type, self.description)
            digest, media_type = child.digest, child.media_type
            if not isinstance(doc, Manifest):
                raise ManifestError(f"{self.description}: nested indexes are not supported")
        return ResolvedImage(
            source=self.description,
            manifest_media_type=doc.media_type or media_type,
            manifest_digest=digest,
            config=doc.config,
            layers=doc.layers,
            platform=platform,
            index_digest=index_digest,
        )

    @contextmanager
    def open_blob(self, desc: Descriptor) -> Iterator[BlobReader]:
        if desc.digest is None:
            raise BlobNotFound(f"{self.description}: a blob without a digest cannot be fetched")
        with self.client.open_blob(self.ref.repository, desc.digest) as stream:
            yield stream

    def close(self) -> None:
        self.client.close()
