"""The engine's small JSON answers (`/version`, `/images/{name}/json`), read within bounds, and
the Docker SDK's client, made only when a container, a pull or an export needs it.

An engine socket is untrusted input (a CI job may point DOCKER_HOST anywhere). The Docker SDK
reads every answer whole before parsing it (`response.json()`), and asks for `/version` when a
client is made (API version "auto"): a 10 GB answer would be held in memory. Here each JSON
answer is read as a stream: the declared length is checked first and at most
MAX_ENGINE_JSON_BYTES are read; the answer's fields are checked for type before anyone uses them.
On a local socket (`unix://`, the default, and Podman's) the request is the standard library's
own HTTP over that socket: the SDK and requests take longer to import than `run --reuse` takes
to answer, and a run that is answered before any container starts never needs them. Any other
address (tcp with or without TLS, ssh) goes through the SDK's session as before. Either way an
error status is an EngineAnswered (EngineNotFound for 404), made from the body's first 64 KiB."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, TypedDict, cast
from urllib.parse import quote, urlencode

from imagegate._support import deadline
from imagegate._support.jsontypes import JsonObject, items
from imagegate.errors import EngineError, describe_exception
from imagegate.oci import untrusted_json

if TYPE_CHECKING:
    import requests
    from docker import DockerClient  # the SDK ships no types: mypy checks no use of it

MAX_ENGINE_JSON_BYTES = 4 << 20  # an image's inspect is a few KiB; a long history some more
MAX_ERROR_BYTES = 64 << 10
DEFAULT_HOST = "unix:///var/run/docker.sock"  # the engines' own clients' default, as the SDK's
# /version is asked unversioned; the SDK client, once made, speaks the engine's own version.
_BOOT_API_VERSION = "1.24"
_API_VERSION = re.compile(r"1\.\d{1,3}")
_UNREACHABLE_HINT = "start dockerd (or `podman system service`), or point DOCKER_HOST at it"


class EngineApi(Protocol):
    """The Docker SDK's low-level client (`DockerClient.api`), as far as imagegate calls it."""

    def _url(self, pathfmt: str, *args: str, versioned_api: bool = True) -> str: ...
    def _get(self, url: str, **kwargs: object) -> requests.Response: ...
    def _raise_for_status(self, response: requests.Response) -> None: ...
    def _stream_raw_result(
        self, response: requests.Response, chunk_size: int = 1, decode: bool = True
    ) -> Iterator[bytes]: ...


class EngineAnswered(EngineError):
    """The engine answered a request with an error status: the status and its own message."""

    def __init__(self, what: str, status: int, explanation: str) -> None:
        super().__init__(f"{what}: {status} {explanation}".rstrip())
        self.status_code, self.explanation = status, explanation


class EngineNotFound(EngineAnswered):
    """404: no such image or container."""


def _local_socket(endpoint: str) -> str | None:
    """The socket path of a `unix://` address (the default when empty), else None."""
    if not endpoint.startswith("unix://"):
        return None
    return endpoint[len("unix://") :] or DEFAULT_HOST[len("unix://") :]


class Engine:
    """One container engine: its endpoint, its API version (from a bounded `/version`), its JSON
    reads, and the Docker SDK's client for everything else, made on first use."""

    def __init__(self, host: str | None, *, timeout: float) -> None:
        self.host = host  # None: DOCKER_HOST, as docker.from_env reads it
        self.endpoint = host or os.environ.get("DOCKER_HOST") or DEFAULT_HOST
        self.socket_path = _local_socket(self.endpoint)
        self.timeout = timeout
        self.api_version = _BOOT_API_VERSION
        self._sdk: DockerClient | None = None

    @property
    def sdk(self) -> DockerClient:
        """The Docker SDK's client, at the engine's API version (no "auto" lookup)."""
        if self._sdk is None:
            self._sdk = _sdk_client(self.host, self.timeout, self.api_version)
        return self._sdk

    @property
    def api(self) -> EngineApi:
        return cast("EngineApi", self.sdk.api)

    def close(self) -> None:
        if self._sdk is not None:
            self._sdk.close()


def _sdk_client(host: str | None, timeout: float, api_version: str) -> DockerClient:
    import docker

    try:
        kwargs: dict[str, float | str] = {"timeout": timeout, "version": api_version}
        return docker.DockerClient(base_url=host, **kwargs) if host else docker.from_env(**kwargs)
    except docker.errors.DockerException as e:
        raise EngineError(
            f"container engine at {host or 'DOCKER_HOST'}: not reachable ({describe_exception(e)})",
            hint=_UNREACHABLE_HINT,
        ) from e


class EngineComponent(TypedDict, total=False):
    Name: str  # never null


class EngineVersion(TypedDict, total=False):
    """`/version`'s fields as checked (null where the engine sent null); others ride along unread."""

    Version: str | None
    ApiVersion: str | None
    Os: str | None
    Arch: str | None
    Components: list[EngineComponent] | None


class _ImageId(TypedDict):
    Id: str  # never empty


class EngineImage(_ImageId, total=False):
    """An image's inspect fields as checked (null where the engine sent null); others unread."""

    RepoDigests: list[str] | None
    Os: str | None
    Architecture: str | None
    Variant: str | None


def engine_endpoint(engine: Engine) -> str:
    """The engine as a user would name it in a message: its endpoint."""
    return engine.endpoint


def _where(engine: Engine) -> str:
    return f"the engine at {engine_endpoint(engine)}"


def get_json(
    engine: Engine, path: str, *args: str, versioned: bool = True, params: dict[str, str] | None = None
) -> object:
    """The engine's JSON answer to GET `path` (SDK-style `{0}` placeholders, quoted); an error
    status raises EngineAnswered; anything too large, cut or not JSON an EngineError."""
    what = f"{_where(engine)}: its answer to GET {path.format(*args)}"
    deadline.check(what)
    with deadline.waiting(what):  # a stalled engine: the deadline's hard stop names it
        if engine.socket_path is not None:
            data = _read_local(engine, engine.socket_path, _path(engine, path, args, versioned, params), what)
        else:
            data = _read_sdk(engine, path, args, versioned, params, what)
    if len(data) > MAX_ENGINE_JSON_BYTES:
        raise EngineError(f"{what} is larger than {MAX_ENGINE_JSON_BYTES} bytes (more was sent)")
    try:
        return untrusted_json.loads(data, max_bytes=MAX_ENGINE_JSON_BYTES)
    except untrusted_json.UntrustedJSONError as e:
        raise EngineError(f"{what} is {e}") from e


def _path(
    engine: Engine, path: str, args: tuple[str, ...], versioned: bool, params: dict[str, str] | None
) -> str:
    """The request's path as the SDK's `_url` makes it: each argument quoted, the version first."""
    text = path.format(*(quote(a, safe="/:") for a in args))
    text = f"/v{engine.api_version}{text}" if versioned else text
    return f"{text}?{urlencode(params)}" if params else text


class _LocalConnection(http.client.HTTPConnection):
    """HTTP over a unix socket. Each read waits at most `timeout` (the caller's, capped by the
    deadline); headers are bounded by http.client (100 lines of 64 KiB)."""

    def __init__(self, socket_path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _read_local(engine: Engine, socket_path: str, path: str, what: str) -> bytes:
    """At most MAX_ENGINE_JSON_BYTES + 1 bytes of the answer (the declared length checked first)."""
    conn = _LocalConnection(socket_path, deadline.cap(engine.timeout))
    try:
        conn.request("GET", path, headers={"Accept-Encoding": "identity"})
        res = conn.getresponse()
        if res.status >= 400:
            raise _answered(what, res.status, res.read(MAX_ERROR_BYTES))
        declared = res.getheader("Content-Length", "")
        if declared.isdigit() and int(declared) > MAX_ENGINE_JSON_BYTES:
            raise EngineError(f"{what} is larger than {MAX_ENGINE_JSON_BYTES} bytes (it declares {declared})")
        return res.read(MAX_ENGINE_JSON_BYTES + 1)
    except (OSError, http.client.HTTPException) as e:
        raise deadline.expired_error(what) or EngineError(
            f"{what}: not answered ({describe_exception(e)})", hint=_UNREACHABLE_HINT
        ) from e
    finally:
        conn.close()


def _answered(what: str, status: int, body: bytes) -> EngineAnswered:
    """The error for a status, with the engine's `message` (or the body's text) as its words."""
    try:
        doc = json.loads(body)
        said = doc.get("message") if isinstance(doc, dict) else None
    except ValueError:
        said = None
    text = said if isinstance(said, str) else body.decode("utf-8", "replace").strip()
    kind = EngineNotFound if status == 404 else EngineAnswered
    return kind(what, status, text[:1000])


def _read_sdk(
    engine: Engine,
    path: str,
    args: tuple[str, ...],
    versioned: bool,
    params: dict[str, str] | None,
    what: str,
) -> bytes:
    """The same read through the SDK's session (tcp, TLS, ssh): the SDK's errors made ours."""
    import requests
    from docker.errors import DockerException
    from urllib3.exceptions import HTTPError

    api = engine.api
    try:
        url = api._url(path, *args, versioned_api=versioned)
        res = api._get(url, params=params, stream=True, headers={"Accept-Encoding": "identity"})
        try:
            if res.status_code >= 400:
                raise _sdk_status(api, res, what)
            declared = res.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > MAX_ENGINE_JSON_BYTES:
                raise EngineError(
                    f"{what} is larger than {MAX_ENGINE_JSON_BYTES} bytes (it declares {declared})"
                )
            data: bytes = res.raw.read(MAX_ENGINE_JSON_BYTES + 1, decode_content=False)
            return data
        finally:
            res.close()
    except (DockerException, requests.exceptions.RequestException, HTTPError, OSError) as e:
        raise deadline.expired_error(what) or EngineError(
            f"{what}: not answered ({describe_exception(e)})", hint=_UNREACHABLE_HINT
        ) from e


def _sdk_status(api: EngineApi, res: requests.Response, what: str) -> EngineError:
    """The error for an error status the SDK's session got, from the body's first 64 KiB."""
    from docker.errors import APIError

    res._content = res.raw.read(MAX_ERROR_BYTES, decode_content=False)
    res._content_consumed = True
    try:
        api._raise_for_status(res)
    except APIError as e:
        return _answered(what, e.status_code or res.status_code, str(e.explanation or "").encode())
    except Exception as e:  # the SDK reading a hostile error body (JSON but not an object)
        return EngineError(f"{what}: answered {res.status_code} with a malformed error ({type(e).__name__})")
    return EngineError(f"{what}: answered {res.status_code}")


def _fields(doc: object, what: str, types: dict[str, type | tuple[type, ...]]) -> JsonObject:
    """`doc` as an object whose named fields, where present and not null, have these types."""
    if not isinstance(doc, dict):
        raise EngineError(f"{what} is not a JSON object")
    for name, kind in types.items():
        if doc.get(name) is not None and not isinstance(doc[name], kind):
            raise EngineError(f"{what}: `{name}` is a {type(doc[name]).__name__}, not a {_kind(kind)}")
    return doc


def _kind(kind: type | tuple[type, ...]) -> str:
    return "/".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__


def version(engine: Engine) -> EngineVersion:
    """The engine's `/version`, its fields checked; Components as a list of objects."""
    what = f"{_where(engine)}: its /version answer"
    doc = _fields(
        get_json(engine, "/version", versioned=False),
        what,
        {"Version": str, "ApiVersion": str, "Os": str, "Arch": str, "Components": list},
    )
    if not all(
        isinstance(c, dict) and isinstance(c.get("Name", ""), str) for c in items(doc.get("Components"))
    ):
        raise EngineError(f"{what}: `Components` is not a list of named objects")
    return cast(EngineVersion, doc)  # each field's kind checked above: what mypy cannot follow


def inspect_image(engine: Engine, reference: str) -> EngineImage:
    """`/images/{reference}/json`, with `Id` a non-empty string and `RepoDigests` strings."""
    what = f"{_where(engine)}: its description of image {reference}"
    doc = _fields(
        get_json(engine, "/images/{0}/json", reference),
        what,
        {"Id": str, "RepoDigests": list, "Os": str, "Architecture": str, "Variant": str},
    )
    if not doc.get("Id"):
        raise EngineError(f"{what}: no `Id`")
    if not all(isinstance(d, str) for d in items(doc.get("RepoDigests"))):
        raise EngineError(f"{what}: `RepoDigests` is not a list of strings")
    return cast(EngineImage, doc)  # each field's kind checked above: what mypy cannot follow


# The oldest API the SDK speaks (docker.constants.MINIMUM_DOCKER_API_VERSION, 7.x): an older
# engine is refused before the SDK is imported.
MINIMUM_API_VERSION = (1, 24)


def connect(host: str | None, *, timeout: float) -> Engine:
    """The engine at `host` (None: DOCKER_HOST, else the default socket), its API version the
    engine's, learnt from a bounded `/version`: raises EngineError when none answers."""
    engine = Engine(host, timeout=timeout)
    try:
        api_version = version(engine).get("ApiVersion")
    except EngineAnswered:
        raise
    except EngineError as e:
        cause = e.__cause__
        if not isinstance(cause, OSError):  # nothing listens, no such socket (requests' errors are OSErrors)
            raise
        raise EngineError(
            f"container engine at {engine.endpoint}: not reachable ({describe_exception(cause)})",
            hint=_UNREACHABLE_HINT,
        ) from e
    if not isinstance(api_version, str) or not _API_VERSION.fullmatch(api_version):
        raise EngineError(
            f"{_where(engine)}: its /version answer has no API version (ApiVersion {api_version!r})"
        )
    if tuple(int(x) for x in api_version.split(".")) < MINIMUM_API_VERSION:
        raise EngineError(f"{_where(engine)}: API version {api_version} is older than the SDK supports")
    engine.api_version = api_version
    if engine._sdk is not None:  # made to ask /version (tcp, ssh): it speaks that version now
        engine._sdk.api._version = api_version
    return engine
