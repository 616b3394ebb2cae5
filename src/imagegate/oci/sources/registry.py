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
from imagegate.oci.registry import NotFound, RegistryClient
from imagegate.oci.sources.interface import BlobNotFound, BlobReader, ImageSource, ResolvedImage


class RegistrySource(ImageSource):
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

    def resolve(self) -> ResolvedImage:
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
