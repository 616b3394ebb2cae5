"""Manifests, indexes and descriptors of the OCI image spec and Docker's schema 2, and the
platform choice in an index. Parsing is strict about what verification relies on (digests,
sizes) and lenient about the rest."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from imagegate.domain.digest import is_digest
from imagegate.errors import ImagegateError, UsageError
from imagegate.oci import untrusted_json

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_SCHEMA1 = (
    "application/vnd.docker.distribution.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v1+prettyjws",
)
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_FOREIGN_LAYER = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"
OCI_NONDISTRIBUTABLE = "application/vnd.oci.image.layer.nondistributable.v1.tar"
# A layer of a legacy `docker save` archive: a plain tar named by path, no declared digest.
LEGACY_ARCHIVE_LAYER = "application/x-tar"

MANIFEST_TYPES = (DOCKER_MANIFEST, OCI_MANIFEST)
INDEX_TYPES = (DOCKER_MANIFEST_LIST, OCI_INDEX)
ACCEPT_ALL = (OCI_INDEX, DOCKER_MANIFEST_LIST, OCI_MANIFEST, DOCKER_MANIFEST)

DEFAULT_PLATFORM = "linux/amd64"


class ManifestError(ImagegateError):
    """A manifest or index could not be understood: the image cannot be verified."""


@dataclass(frozen=True)
class Platform:
    os: str
    architecture: str
    variant: str | None = None

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


_ARCH_ALIASES = {"x86_64": "amd64", "x86-64": "amd64", "aarch64": "arm64", "armhf": "arm", "armel": "arm"}


def parse_platform(text: str) -> Platform:
    parts = text.strip().lower().split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise UsageError(
            f"invalid platform {text!r}",
            hint="write it as os/architecture[/variant], e.g. linux/amd64 or linux/arm64/v8",
        )
    arch = _ARCH_ALIASES.get(parts[1], parts[1])
    return Platform(parts[0], arch, parts[2] if len(parts) == 3 else None)


def _variant(p: Platform) -> str | None:
    # arm64 images usually omit their only variant, v8.
    if p.architecture == "arm64" and p.variant in (None, "v8"):
        return None
    return p.variant


def platform_matches(want: Platform, have: Platform) -> bool:
    if (want.os, want.architecture) != (have.os, have.architecture):
        return False
    return want.variant is None or _variant(want) == _variant(have)


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str | None  # None only for layers of a legacy `docker save` archive
    size: int | None  # None where the source declares no size (legacy archive)
    urls: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    platform: Platform | None = None
    # Where a legacy archive keeps this blob (a member path); None elsewhere.
    locator: str | None = None

    @property
    def foreign(self) -> bool:
        """Non-distributable layers (Windows base layers) live outside the registry."""
        return self.media_type in (DOCKER_FOREIGN_LAYER,) or self.media_type.startswith(OCI_NONDISTRIBUTABLE)

    @property
    def name(self) -> str:
        return self.digest or self.locator or "?"


@dataclass(frozen=True)
class Manifest:
    media_type: str
    config: Descriptor
    layers: tuple[Descriptor, ...]


@dataclass(frozen=True)
class Index:
    media_type: str
    manifests: tuple[Descriptor, ...]


def _descriptor(obj: object, where: str) -> Descriptor:
    if not isinstance(obj, dict):
        raise ManifestError(f"{where}: a descriptor must be an object")
    digest, size, media_type = obj.get("digest"), obj.get("size"), obj.get("mediaType", "")
    if not isinstance(digest, str) or not is_digest(digest):
        raise ManifestError(f"{where}: descriptor digest {digest!r} is not a digest")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ManifestError(f"{where}: descriptor size {size!r} is not a non-negative integer")
    plat = obj.get("platform")
    platform = None
    if (
        isinstance(plat, dict)
        and isinstance(plat.get("os"), str)
        and isinstance(plat.get("architecture"), str)
    ):
        platform = Platform(plat["os"], plat["architecture"], plat.get("variant") or None)
    urls = obj.get("urls") or ()
    annotations = obj.get("annotations") or {}
    return Descriptor(
        media_type=media_type if isinstance(media_type, str) else "",
        digest=digest,
        size=size,
        urls=tuple(u for u in urls if isinstance(u, str)),
        annotations={str(k): str(v) for k, v in annotations.items()} if isinstance(annotations, dict) else {},
        platform=platform,
    )


def parse_manifest(raw: bytes, media_type: str | None, where: str) -> Manifest | Index:
    """Parse a manifest or an index; `media_type` is the transport's (HTTP Content-Type, a
    descriptor's), used when the body does not name its own."""
    try:
        doc = untrusted_json.loads(raw)
    except untrusted_json.UntrustedJSONError as e:
        raise ManifestError(f"{where}: the manifest is {e}") from e
    if not isinstance(doc, dict):
        raise ManifestError(f"{where}: the manifest is not a JSON object")
    mt = doc.get("mediaType") or (media_type or "").split(";")[0].strip()
    if mt in DOCKER_SCHEMA1 or doc.get("schemaVersion") == 1:
        raise ManifestError(
            f"{where}: Docker schema 1 manifests are not supported (no config digest to verify)",
            hint="re-push the image with a current engine or skopeo; schema 1 is deprecated",
        )
    if mt in INDEX_TYPES or (not mt and "manifests" in doc):
        entries = doc.get("manifests")
        if not isinstance(entries, list):
            raise ManifestError(f"{where}: the index has no manifests list")
        return Index(
            mt or OCI_INDEX, tuple(_descriptor(m, f"{where} manifests[{i}]") for i, m in enumerate(entries))
        )
    if mt in MANIFEST_TYPES or (not mt and "layers" in doc):
        layers = doc.get("layers")
        if not isinstance(layers, list):
            raise ManifestError(f"{where}: the manifest has no layers list")
        return Manifest(
            mt or OCI_MANIFEST,
            _descriptor(doc.get("config"), f"{where} config"),
            tuple(_descriptor(x, f"{where} layers[{i}]") for i, x in enumerate(layers)),
        )
    raise ManifestError(f"{where}: unsupported manifest media type {mt or '(none)'!r}")


def select_platform(index: Index, want: Platform, where: str) -> Descriptor:
    """The manifest of `want` in `index`; when none matches, the error lists what exists."""
    candidates = [d for d in index.manifests if d.platform is not None and platform_matches(want, d.platform)]
    # Prefer an exact variant match, then the first (the order builders give).
    exact = [d for d in candidates if d.platform is not None and _variant(d.platform) == _variant(want)]
    if exact or candidates:
        return (exact or candidates)[0]
    have: Sequence[str] = sorted(
        {str(d.platform) for d in index.manifests if d.platform is not None and d.platform.os != "unknown"}
    )
    raise UsageError(
        f"{where}: no image for platform {want} in the index; it has: {', '.join(have) or 'no platforms'}",
        hint="choose one of those with --platform",
    )
