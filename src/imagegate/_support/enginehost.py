"""DOCKER_HOST, checked before any engine call: a malformed address is the user's input error
(exit 3, naming the variable), not an engine that happens to be unreachable."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from imagegate.errors import UsageError

_HINT = (
    "DOCKER_HOST is unix:///path/to/engine.sock (e.g. unix:///run/podman.sock for Podman), "
    "tcp://HOST:PORT, or ssh://[USER@]HOST; unset it for the default socket"
)


def check_docker_host(env: Mapping[str, str]) -> str | None:
    """The engine address DOCKER_HOST names, or None when it is unset (the default socket)."""
    value = env.get("DOCKER_HOST")
    if not value or value == "unix://":
        return None  # as the engines' own clients: the default socket
    scheme, sep, rest = value.partition("://")
    if not sep:
        raise _bad(value, "no scheme (scheme://address)")
    try:
        url = urlsplit(value)
        port = url.port
    except ValueError as e:
        raise _bad(value, str(e)) from e
    if scheme in ("unix", "npipe"):
        if not rest.strip("/"):
            raise _bad(value, "no socket path")
    elif scheme in ("tcp", "http", "https"):
        if not url.hostname or port is None:
            raise _bad(value, "needs HOST:PORT")
        if url.path.strip("/") or url.query or url.fragment:
            raise _bad(value, "nothing may follow HOST:PORT")
    elif scheme == "ssh":
        if not url.hostname or url.path.strip("/"):
            raise _bad(value, "needs [USER@]HOST[:PORT] and no path")
    else:
        raise _bad(value, f"unknown scheme {scheme!r}")
    return value


def _bad(value: str, why: str) -> UsageError:
    return UsageError(f"DOCKER_HOST {value!r} is not an engine address: {why}", hint=_HINT)
