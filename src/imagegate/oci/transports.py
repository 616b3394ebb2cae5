"""Source strings, named as containers/image (skopeo, podman) names them:
`docker://REF` (a registry; also a bare REF), `docker-daemon:REF` (the local engine),
`docker-archive:PATH[:NAME:TAG]` (`docker save`), `oci:DIR[:TAG]` (OCI image layout)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from imagegate._support.enginehost import check_docker_host
from imagegate.errors import UsageError
from imagegate.oci.engineapi import Engine
from imagegate.oci.hashing import decompressing_reader
from imagegate.oci.manifest import DEFAULT_PLATFORM, Platform, parse_platform
from imagegate.oci.reference import parse_image_name, parse_reference
from imagegate.oci.sources.archive import DockerArchiveSource, TarStream, is_compressed_file
from imagegate.oci.sources.daemon import DaemonArchive
from imagegate.oci.sources.interface import ImageSource, Source
from imagegate.oci.sources.layout import OciLayoutSource

# Transports containers/image has that we do not read: say so instead of guessing a registry.
_OTHER_TRANSPORTS = ("containers-storage", "dir", "oci-archive", "ostree", "sif", "tarball")


def _usage(spec: str, why: str) -> UsageError:
    return UsageError(
        f"invalid image source {spec!r}: {why}",
        hint="use docker://REF (or a bare REF), docker-daemon:REF, docker-archive:PATH or oci:DIR[:TAG]",
    )


def open_source(
    spec: str,
    *,
    platform: str | None = None,
    insecure: bool = False,
    docker_client: Engine | None = None,
) -> Source:
    """The source named by `spec`. Malformed strings raise UsageError (exit 3)."""
    plat = parse_platform(platform or DEFAULT_PLATFORM)
    if spec.startswith("docker://"):
        return _registry(spec[len("docker://") :], plat, insecure)
    if spec.startswith("docker-daemon:"):
        ref = spec[len("docker-daemon:") :]
        if not ref:
            raise _usage(spec, "no image after docker-daemon:")
        name = parse_image_name(ref, "docker-daemon: image")  # malformed names never reach the engine's API
        if docker_client is None:
            check_docker_host(os.environ)
        return DaemonArchive(name, docker_client)
    if spec.startswith("docker-archive:"):
        path, _, wanted = spec[len("docker-archive:") :].partition(":")
        if not path:
            raise _usage(spec, "no path after docker-archive:")
        if not os.path.isfile(path):
            raise UsageError(f"{spec}: no such file {path}")
        if is_compressed_file(path):
            # A compressed `docker save` cannot be read in place: read it once, front to back.
            return TarStream(spec, lambda: _Closing(path), wanted or None, plat)
        return DockerArchiveSource(path, wanted or None, plat)
    if spec.startswith("oci:"):
        directory, _, tag = spec[len("oci:") :].partition(":")
        if not directory:
            raise _usage(spec, "no directory after oci:")
        return OciLayoutSource(directory, tag or None, plat)
    scheme = re.match(r"^([a-z][a-z0-9+.-]*)(://|:)", spec)
    if scheme and (scheme.group(2) == "://" or scheme.group(1) in _OTHER_TRANSPORTS):
        raise _usage(spec, f"transport {scheme.group(1)!r} is not supported")
    return _registry(spec, plat, insecure)


def _registry(ref: str, plat: Platform, insecure: bool) -> Source:
    # Imported here: a machine reading only files (oci:, docker-archive:) needs no HTTP client.
    from imagegate.oci.sources.registry import RegistrySource

    return RegistrySource(parse_reference(ref), plat, insecure=insecure)


@contextmanager
def open_sources(
    specs: Sequence[str], *, platform: str | None = None, insecure: bool = False
) -> Iterator[list[Source]]:
    """`open_source` of each spec (all of them checked before any is read); closed on the way out."""
    sources = [open_source(s, platform=platform, insecure=insecure) for s in specs]
    try:
        yield sources
    finally:
        for src in sources:
            if isinstance(src, ImageSource):
                src.close()


class _Closing:
    """The decompressed bytes of a file, closing the file with the reader."""

    def __init__(self, path: str):
        self._file = open(path, "rb")  # noqa: SIM115  (closed by close())
        self._reader = decompressing_reader(self._file)

    def read(self, n: int = -1) -> bytes:
        return self._reader.read(n)

    def close(self) -> None:
        self._file.close()
