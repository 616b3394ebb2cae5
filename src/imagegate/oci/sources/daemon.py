"""`docker-daemon:REF`: the image as the local engine holds it, streamed from the engine's
save endpoint (`GET /images/{name}/get`) through the Docker SDK. Works with dockerd and with
Podman's Docker-compatible API alike (`DOCKER_HOST`). Nothing is written to disk."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from imagegate.errors import EngineError, UsageError
from imagegate.oci.sources.archive import TarStream

_ID_RE = re.compile(r"^(sha256:)?[0-9a-f]{12,64}$")


def engine_ref(ref: str) -> str:
    """What to ask the engine to save: an ID or digest as is; a bare name gets `:latest`, since
    saving a bare repository name would save all of its tags."""
    if _ID_RE.match(ref) or "@" in ref:
        return ref
    last = ref.rsplit("/", 1)[-1]
    return ref if ":" in last else ref + ":latest"


class _Chunks:
    """A file-like view of the SDK's chunk generator."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks = chunks
        self._buf = b""
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        if self._pos >= len(self._buf):
            self._buf, self._pos = next(self._chunks, b""), 0
        if n < 0:
            parts = [self._buf[self._pos :], *self._chunks]
            self._buf, self._pos = b"", 0
            return b"".join(parts)
        out = self._buf[self._pos : self._pos + n]
        self._pos += len(out)
        return out

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


class DaemonArchive(TarStream):
    def __init__(self, ref: str, client: Any | None = None):
        self.ref = engine_ref(ref)
        self._client = client
        super().__init__(f"docker-daemon:{ref}", self._open)

    def _open(self) -> _Chunks:
        import docker  # the SDK is only needed for this transport
        from docker.errors import APIError, DockerException, ImageNotFound, NotFound

        try:
            client = self._client or docker.from_env()
            client.api.inspect_image(self.ref)
            chunks = client.api.get_image(self.ref, chunk_size=1 << 20)
        except (ImageNotFound, NotFound) as e:
            raise UsageError(
                f"{self.description}: the engine has no image {self.ref}",
                hint="list its images with `docker images`; pull or load the image first",
            ) from e
        except (APIError, DockerException) as e:
            raise EngineError(
                f"{self.description}: the engine could not be asked for {self.ref}: {e}",
                hint="is the engine running? DOCKER_HOST selects it (e.g. unix:///run/podman.sock for Podman)",
            ) from e
        return _Chunks(iter(chunks))
