"""httpx's connections under the command's deadline (imagegate._support.deadline): every connect, read and
write waits at most until the deadline.

httpx's timeouts are per read and fixed when a request starts: a server that sends a byte every
few seconds, in its headers or its body, keeps a request alive for ever. httpcore takes each
read's timeout from its caller, so a network backend that caps those timeouts by the time left
ends every wait at the deadline, whatever httpx is reading at the time. The backend is set on
the client's connection pools; httpx has no public way to pass one, hence `install` and its
test (tests/oci/test_deadline.py) that a trickling header ends at the deadline."""

from __future__ import annotations

import ssl
from collections.abc import Iterable

import httpcore
import httpx

from imagegate._support import deadline


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, deadline.cap(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, deadline.cap(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, deadline.cap(timeout)))

    def get_extra_info(self, info: str) -> object:  # whatever the inner stream tells
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, deadline.cap(timeout), local_address, socket_options)
        return _Stream(stream)

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_unix_socket(path, deadline.cap(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def install(client: httpx.Client) -> int:
    """Puts the capping backend under every connection pool of `client` (its own and a
    proxy's); returns how many it found (0: this httpx keeps them elsewhere)."""
    transports = [client._transport, *client._mounts.values()]
    done = 0
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        inner = getattr(pool, "_network_backend", None)
        if inner is not None and not isinstance(inner, _Backend):
            pool._network_backend = _Backend(inner)  # type: ignore[union-attr]
            done += 1
    return done
