"""`docker-daemon:REF`: the image as the local engine holds it, streamed from the engine's
save endpoint (`GET /images/{name}/get`) through the Docker SDK. Works with dockerd and with
Podman's Docker-compatible API alike (`DOCKER_HOST`). Nothing is written to disk.

An engine prepares the whole export before its first byte (minutes for a 10 GB image; Podman
writes it to a temporary file first), so the export request has no read timeout: a thread reads
the stream into a bounded queue while the caller hears how long the engine has been preparing,
gives up at its own deadline, and gets an error naming the engine and the image when the
stream breaks."""

from __future__ import annotations

import functools
import logging
import socket
import time
from collections.abc import Callable, Iterator

from imagegate._support import interrupts
from imagegate.errors import EngineError, UsageError
from imagegate.oci.engineapi import Engine, EngineNotFound, connect, engine_endpoint, inspect_image
from imagegate.oci.readahead import ThreadedReader
from imagegate.oci.reference import ImageName, parse_image_name
from imagegate.oci.sources.archive import TarStream
from imagegate.oci.sources.interface import Waiting

log = logging.getLogger(__name__)

CHUNK = 1 << 20
# Chunks read ahead of the consumer: bounds memory (16 MiB) and lets reading overlap hashing.
QUEUE_CHUNKS = 16
TICK_S = 1.0  # how often a waiting caller hears the elapsed time


class EngineStream(ThreadedReader):
    """A file-like reader over the engine's export, filled by a reader thread.

    `start()` sends the request and returns the chunk iterator; it runs in the thread, so a slow
    engine blocks the thread, not the caller. `describe(error, nbytes)` turns what the thread met
    into the error the caller raises."""

    def __init__(
        self,
        start: Callable[[], Iterator[bytes]],
        describe: Callable[[BaseException, int, float], Exception],
        *,
        what: str,
        waiting: Waiting | None = None,
        timeout: float | None = None,
    ):
        self._describe_error, self._what, self._waiting = describe, what, waiting
        self._t0 = time.monotonic()
        self._deadline = None if timeout is None else self._t0 + timeout
        self._timeout = timeout
        self._first = False
        self.first_byte_s: float | None = None
        super().__init__(start, depth=QUEUE_CHUNKS, name="engine-export", tick_s=TICK_S)

    def on_tick(self) -> None:
        # No chunk this tick: tell the caller, check the deadline.
        now = time.monotonic()
        if not self._first and self._waiting is not None:
            self._waiting(now - self._t0, False)
        self._check_deadline(now, "prepared no byte of the export" if not self._first else "stopped sending")

    def _check_deadline(self, now: float, stage: str) -> None:
        if self._deadline is not None and now > self._deadline:
            self.close()
            raise EngineError(
                f"{self._what}: gave up after {self._timeout:.0f} s: the engine {stage} "
                f"({self.count} bytes received)",
                hint="raise the stage's timeout for a large image, or verify the registry copy "
                "with --source docker://REF",
            ) from None

    def on_chunk(self, chunk: bytes) -> None:
        # A flowing export never ticks: its deadline is checked as each chunk comes too.
        self._check_deadline(time.monotonic(), "had not sent the whole export")
        if not self._first:
            self._first = True
            self.first_byte_s = time.monotonic() - self._t0
            log.debug("%s: the engine's export began after %.1f s", self._what, self.first_byte_s)
            if self._waiting is not None:
                self._waiting(self.first_byte_s, True)

    def describe(self, error: BaseException) -> BaseException:
        return self._describe_error(error, self.count, time.monotonic() - self._t0)

    def close(self, *, wait: bool = False) -> None:
        # The thread may be blocked in the engine for minutes: never wait for it.
        super().close(wait=wait)


def _until_end(chunks: Iterator[bytes], done: Callable[[], None]) -> Iterator[bytes]:
    try:
        yield from chunks
    finally:
        done()


def response_socket(res: object) -> socket.socket | None:
    """The socket a requests (urllib3) response streams from, where it can be found."""
    sock = getattr(getattr(getattr(res, "raw", None), "_connection", None), "sock", None)
    return sock if isinstance(sock, socket.socket) else None


def _sizeof(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} bytes"


class DaemonArchive(TarStream):
    def __init__(self, image: ImageName | str, client: Engine | None = None, *, timeout: float | None = None):
        name = image if isinstance(image, ImageName) else parse_image_name(image, "docker-daemon: image")
        ref = name.text
        # saving a bare repository name would save all of its tags: one image, `:latest`
        self.ref = name.pinned_or_tagged
        self._client = client
        self.timeout = timeout  # overall, for the export; None: no limit (the caller's deadline)
        self.first_byte_s: float | None = None  # how long the engine prepared, once known
        super().__init__(f"docker-daemon:{ref}", lambda: None)

    def _engine(self) -> Engine:
        if self._client is not None:
            return self._client
        try:
            self._client = connect(None, timeout=60)  # the SDK's default timeout
        except EngineError as e:
            raise EngineError(
                f"{self.description}: no engine to ask for {self.ref}: {e}",
                hint="is the engine running? DOCKER_HOST selects it (e.g. unix:///run/podman.sock for Podman)",
            ) from e
        return self._client

    def open_raw(self, waiting: Waiting | None) -> EngineStream:
        from docker.errors import APIError, DockerException, NotFound

        client = self._engine()
        engine = f"the engine ({engine_endpoint(client)})"
        try:
            inspect_image(client, self.ref)
        except EngineNotFound as e:
            raise UsageError(
                f"{self.description}: the engine has no image {self.ref} ({engine_endpoint(client)})",
                hint="list its images with `docker images`; pull or load the image first",
            ) from e
        except EngineError as e:
            raise EngineError(f"{self.description}: {e}", hint=e.hint) from e
        api = client.api  # the export streams through the SDK's session

        def start() -> Iterator[bytes]:
            log.debug("%s: asking %s for the export of %s", self.description, engine, self.ref)
            # The SDK's get_image() waits for the first byte under the client's read timeout
            # (60 s by default): far less than an engine takes to prepare a 10 GB export. The
            # same request without one; the stream's socket timeout is lifted by the SDK too.
            res = api._get(api._url("/images/{0}/get", self.ref), stream=True, timeout=None)
            chunks: Iterator[bytes] = api._stream_raw_result(res, CHUNK, False)
            sock = response_socket(res)
            if sock is None:
                return chunks
            # A stop closes the export's connection: the thread's read ends, the engine's export too.
            return _until_end(chunks, interrupts.on_stop(functools.partial(interrupts.shutdown_socket, sock)))

        def describe(error: BaseException, nbytes: int, elapsed: float) -> Exception:
            if isinstance(error, NotFound):  # ImageNotFound is one
                return UsageError(f"{self.description}: {engine} has no image {self.ref} (any more)")
            if isinstance(error, (APIError, DockerException)):
                return EngineError(
                    f"{self.description}: {engine} refused the export of {self.ref}: {error}",
                    hint="see the engine's log; `docker save IMAGE > /dev/null` shows the same error",
                )
            where = "before sending its first byte" if nbytes == 0 else f"after {_sizeof(nbytes)}"
            return EngineError(
                f"{self.description}: {engine} broke off the export {where} ({elapsed:.0f} s): "
                f"{type(error).__name__}: {error}",
                hint="is the engine still running? see its log (out of disk space or memory?), then try again",
            )

        def heard(elapsed: float, done: bool) -> None:
            if done:
                self.first_byte_s = elapsed
            if waiting is not None:
                waiting(elapsed, done)

        return EngineStream(start, describe, what=self.description, waiting=heard, timeout=self.timeout)
