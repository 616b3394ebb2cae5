"""The engine's small JSON answers (`/version`, `/images/{name}/json`), read within bounds.

An engine socket is untrusted input (a CI job may point DOCKER_HOST anywhere). The Docker SDK
reads every answer whole before parsing it (`response.json()`), and asks for `/version` when a
client is made (API version "auto"): a 10 GB answer would be held in memory. Here the request
goes through the SDK's session (its socket adapters, TLS and timeouts) as a stream, the
declared length is checked first and at most MAX_ENGINE_JSON_BYTES are read; the answer's
fields are checked for type before anyone uses them. Error answers keep the SDK's exceptions
(ImageNotFound, NotFound, APIError), made from their first 64 KiB."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, TypedDict, cast

from imagegate._support import deadline
from imagegate._support.jsontypes import JsonObject, items
from imagegate.errors import EngineError, describe_exception
from imagegate.oci import untrusted_json

if TYPE_CHECKING:
    import requests
    from docker import DockerClient  # the SDK ships no types: mypy checks no use of it

MAX_ENGINE_JSON_BYTES = 4 << 20  # an image's inspect is a few KiB; a long history some more
MAX_ERROR_BYTES = 64 << 10
# The client is made with a fixed version (no unbounded "auto" lookup), then set to the engine's.
_BOOT_API_VERSION = "1.24"
_API_VERSION = re.compile(r"1\.\d{1,3}")


class EngineApi(Protocol):
    """The Docker SDK's low-level client (`DockerClient.api`), as far as imagegate calls it."""

    def _url(self, pathfmt: str, *args: str, versioned_api: bool = True) -> str: ...
    def _get(self, url: str, **kwargs: object) -> requests.Response: ...
    def _raise_for_status(self, response: requests.Response) -> None: ...
    def _stream_raw_result(
        self, response: requests.Response, chunk_size: int = 1, decode: bool = True
    ) -> Iterator[bytes]: ...


class EngineClient(Protocol):
    """A Docker SDK client (what `connect` makes), as far as imagegate's engine reads use it."""

    @property
    def api(self) -> EngineApi: ...


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


def engine_endpoint(client: object) -> str:
    """The engine as a user would name it in a message: its endpoint."""
    api = getattr(client, "api", None)
    base = str(getattr(api, "base_url", "") or "")
    if base.startswith("http+docker://"):  # a unix socket: the SDK keeps its path in the adapter
        path = getattr(getattr(api, "_custom_adapter", None), "socket_path", None)
        base = f"unix://{path}" if path else os.environ.get("DOCKER_HOST", "")
    return base or "the default engine"


def _where(client: object) -> str:
    return f"the engine at {engine_endpoint(client)}"


def get_json(
    client: EngineClient, path: str, *args: str, versioned: bool = True, params: dict[str, str] | None = None
) -> object:
    """The engine's JSON answer to GET `path` (SDK-style `{0}` placeholders, quoted); an error
    status raises the SDK's exception for it; anything too large, cut or not JSON an EngineError."""
    import requests
    from docker.errors import DockerException
    from urllib3.exceptions import HTTPError

    what = f"{_where(client)}: its answer to GET {path.format(*args)}"
    deadline.check(what)
    try:
        with deadline.waiting(what):  # a stalled engine: the deadline's hard stop names it
            data = _read(client.api, client.api._url(path, *args, versioned_api=versioned), params, what)
    except DockerException:
        raise  # the SDK's error for the status (its APIError is a requests error too)
    except (requests.exceptions.RequestException, HTTPError, OSError) as e:
        raise deadline.expired_error(what) or EngineError(
            f"{what}: not answered ({describe_exception(e)})",
            hint="start dockerd (or `podman system service`), or point DOCKER_HOST at it",
        ) from e
    if len(data) > MAX_ENGINE_JSON_BYTES:
        raise EngineError(f"{what} is larger than {MAX_ENGINE_JSON_BYTES} bytes (more was sent)")
    try:
        return untrusted_json.loads(data, max_bytes=MAX_ENGINE_JSON_BYTES)
    except untrusted_json.UntrustedJSONError as e:
        raise EngineError(f"{what} is {e}") from e


def _read(api: EngineApi, url: str, params: dict[str, str] | None, what: str) -> bytes:
    """At most MAX_ENGINE_JSON_BYTES + 1 bytes of the answer (the declared length checked first)."""
    res = api._get(url, params=params, stream=True, headers={"Accept-Encoding": "identity"})
    try:
        if res.status_code >= 400:
            _raise_status(api, res, what)
        declared = res.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > MAX_ENGINE_JSON_BYTES:
            raise EngineError(f"{what} is larger than {MAX_ENGINE_JSON_BYTES} bytes (it declares {declared})")
        data: bytes = res.raw.read(MAX_ENGINE_JSON_BYTES + 1, decode_content=False)
        return data
    finally:
        res.close()


def _raise_status(api: EngineApi, res: requests.Response, what: str) -> None:
    """The SDK's exception for an error status, from the error body's first 64 KiB."""
    from docker.errors import DockerException

    res._content = res.raw.read(MAX_ERROR_BYTES, decode_content=False)
    res._content_consumed = True
    try:
        api._raise_for_status(res)
    except DockerException:
        raise
    except Exception as e:  # the SDK reading a hostile error body (JSON but not an object)
        raise EngineError(f"{what}: answered {res.status_code} with a malformed error") from e
    raise EngineError(f"{what}: answered {res.status_code}")


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


def version(client: EngineClient) -> EngineVersion:
    """The engine's `/version`, its fields checked; Components as a list of objects."""
    what = f"{_where(client)}: its /version answer"
    doc = _fields(
        get_json(client, "/version", versioned=False),
        what,
        {"Version": str, "ApiVersion": str, "Os": str, "Arch": str, "Components": list},
    )
    if not all(
        isinstance(c, dict) and isinstance(c.get("Name", ""), str) for c in items(doc.get("Components"))
    ):
        raise EngineError(f"{what}: `Components` is not a list of named objects")
    return cast(EngineVersion, doc)  # each field's kind checked above: what mypy cannot follow


def inspect_image(client: EngineClient, reference: str) -> EngineImage:
    """`/images/{reference}/json`, with `Id` a non-empty string and `RepoDigests` strings."""
    what = f"{_where(client)}: its description of image {reference}"
    doc = _fields(
        get_json(client, "/images/{0}/json", reference),
        what,
        {"Id": str, "RepoDigests": list, "Os": str, "Architecture": str, "Variant": str},
    )
    if not doc.get("Id"):
        raise EngineError(f"{what}: no `Id`")
    if not all(isinstance(d, str) for d in items(doc.get("RepoDigests"))):
        raise EngineError(f"{what}: `RepoDigests` is not a list of strings")
    return cast(EngineImage, doc)  # each field's kind checked above: what mypy cannot follow


def connect(host: str | None, *, timeout: int) -> DockerClient:
    """A Docker SDK client for `host` (None: DOCKER_HOST, as docker.from_env), its API version
    the engine's, learnt from a bounded `/version`: raises EngineError when none answers."""
    import docker
    import requests

    try:
        kwargs: dict[str, int | str] = {"timeout": timeout, "version": _BOOT_API_VERSION}
        client = docker.DockerClient(base_url=host, **kwargs) if host else docker.from_env(**kwargs)
    except docker.errors.DockerException as e:
        raise EngineError(
            f"container engine at {host or 'DOCKER_HOST'}: not reachable ({describe_exception(e)})",
            hint="start dockerd (or `podman system service`), or point DOCKER_HOST at it",
        ) from e
    try:
        api_version = version(client).get("ApiVersion")
    except EngineError as e:
        if not isinstance(e.__cause__, OSError | requests.exceptions.ConnectionError):
            raise
        raise EngineError(
            f"container engine at {host or os.environ.get('DOCKER_HOST') or 'the default socket'}: "
            f"not reachable ({describe_exception(e.__cause__)})",
            hint="start dockerd (or `podman system service`), or point DOCKER_HOST at it",
        ) from e
    if not isinstance(api_version, str) or not _API_VERSION.fullmatch(api_version):
        raise EngineError(
            f"{_where(client)}: its /version answer has no API version (ApiVersion {api_version!r})"
        )
    if docker.utils.version_lt(api_version, docker.constants.MINIMUM_DOCKER_API_VERSION):
        raise EngineError(f"{_where(client)}: API version {api_version} is older than the SDK supports")
    client.api._version = api_version
    return client
