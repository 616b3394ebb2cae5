"""Image references (`[registry/]repository[:tag][@digest]`) as Docker and containers/image
parse them: a first component with a dot, a colon or `localhost` is a registry; otherwise the
image lives on Docker Hub, where one-component names are under `library/`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from imagegate.domain.digest import is_digest
from imagegate.errors import UsageError

DOCKER_HUB = "docker.io"
# Docker Hub's API endpoint; "docker.io" is only the name users write.
DOCKER_HUB_ENDPOINT = "registry-1.docker.io"

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG_RE = re.compile(r"^[\w][\w.-]{0,127}$")
_HOST_RE = re.compile(
    r"^(?:\[[0-9a-fA-F:.]+\]|[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*)"
    r"(?::[0-9]+)?$"
)
_MAX_NAME = 255
# An image ID as engines print it: `sha256:<hex>` or a hex prefix of at least 12 characters.
ENGINE_ID = re.compile(r"^(sha256:)?[0-9a-f]{12,64}$")


@dataclass(frozen=True)
class Reference:
    registry: str  # as written, e.g. "docker.io", "127.0.0.1:5000"
    repository: str  # e.g. "library/python"
    tag: str | None = None
    digest: str | None = None

    @property
    def ref(self) -> str:
        """What to ask the registry for: the digest when pinned, else the tag (default latest)."""
        return self.digest or self.tag or "latest"

    @property
    def endpoint(self) -> str:
        return DOCKER_HUB_ENDPOINT if self.registry == DOCKER_HUB else self.registry

    def with_digest(self, digest: str) -> Reference:
        return Reference(self.registry, self.repository, self.tag, digest)

    def __str__(self) -> str:
        s = f"{self.registry}/{self.repository}"
        if self.tag:
            s += f":{self.tag}"
        if self.digest:
            s += f"@{self.digest}"
        return s


class BadReference(UsageError):
    """A malformed reference; `why` is the problem alone, for callers that name the input."""

    def __init__(self, text: str, why: str) -> None:
        super().__init__(
            f"invalid image reference {text!r}: {why}",
            hint="write it as [registry/]repository[:tag][@sha256:...], e.g. 127.0.0.1:5000/team/app:1.0",
        )
        self.why = why


def _bad(text: str, why: str) -> UsageError:
    return BadReference(text, why)


def parse_reference(text: str) -> Reference:
    if not text or text != text.strip():
        raise _bad(text, "empty or surrounded by spaces")
    rest, digest = text, None
    if "@" in rest:
        rest, _, digest = rest.partition("@")
        if not is_digest(digest):
            raise _bad(text, f"{digest!r} is not a digest (sha256: and 64 lowercase hex characters)")
    registry = DOCKER_HUB
    first, sep, remainder = rest.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        if not _HOST_RE.match(first):
            raise _bad(text, f"{first!r} is not a registry host[:port]")
        registry, rest = first, remainder
    tag = None
    name, sep, maybe_tag = rest.rpartition(":")
    if sep and "/" not in maybe_tag:
        if not _TAG_RE.match(maybe_tag):
            raise _bad(text, f"{maybe_tag!r} is not a valid tag")
        rest, tag = name, maybe_tag
    if not rest:
        raise _bad(text, "no repository name")
    if rest.lower() != rest and _PATH_RE.match(rest.lower()):
        raise _bad(text, "repository names must be lowercase")
    if not _PATH_RE.match(rest):
        raise _bad(text, f"{rest!r} is not a repository path (lowercase letters, digits, . _ - and /)")
    if registry in (DOCKER_HUB, "index.docker.io"):
        registry = DOCKER_HUB
        if "/" not in rest:
            rest = "library/" + rest
    if len(registry) + 1 + len(rest) > _MAX_NAME:
        raise _bad(text, f"the name is longer than {_MAX_NAME} characters")
    return Reference(registry, rest, tag, digest)


@dataclass(frozen=True)
class ImageName:
    """An image as a user names it to an engine: a reference, or an image ID. Parsed once, where
    the text comes in (`parse_image_name`), then passed as this value. The text is kept as
    written: an engine resolves short names itself (`python` may not mean Docker Hub on Podman)."""

    text: str
    reference: Reference | None  # None: a `sha256:` image ID, which names no repository

    @property
    def may_be_id(self) -> bool:
        """An engine takes a hex string of 12 to 64 characters as an image ID first."""
        return ENGINE_ID.match(self.text) is not None

    @property
    def repository(self) -> str | None:
        """The repository as written, without tag or digest; None for an image ID."""
        if self.reference is None:
            return None
        name = self.text.partition("@")[0]
        return name[: -len(self.reference.tag) - 1] if self.reference.tag else name

    @property
    def pinned_or_tagged(self) -> str:
        """What names one image of the repository to an engine: an ID or a digest as written, a
        tag as written; a bare name gets `:latest` (an engine would read it as every tag)."""
        ref = self.reference
        if self.may_be_id or ref is None or ref.digest or ref.tag:
            return self.text
        return self.text + ":latest"

    def __str__(self) -> str:
        return self.text


def parse_image_name(text: str, what: str = "IMAGE", *, engine_id: bool = True) -> ImageName:
    """An image as the engine takes it: a reference or an image ID, checked before any engine
    call. The engine's API puts the name in a URL path, so `../containers/ID` would reach
    another endpoint; an empty string (an unset CI variable) would become someone else's image.
    `engine_id=False` where only a reference makes sense (a Pod's image is pulled by name)."""
    if not text.strip():
        raise UsageError(
            f"{what} is empty",
            hint="is the variable that should hold it unset? give a reference such as "
            "registry.example/team/app:1.0" + (", or an image ID" if engine_id else ""),
        )
    if not engine_id and text.startswith("sha256:") and ENGINE_ID.match(text):
        raise UsageError(
            f"{what} {text!r} is an image ID, not an image reference",
            hint="a cluster pulls by reference: give repository@sha256:<manifest digest> or repository:tag",
        )
    if engine_id and text.startswith("sha256:") and ENGINE_ID.match(text):
        return ImageName(text, None)
    try:
        return ImageName(text, parse_reference(text))
    except BadReference as e:  # a bare hex image ID is a valid reference too: never here
        kind = "an image reference or ID" if engine_id else "an image reference"
        raise UsageError(f"{what} {text!r} is not {kind}: {e.why}", hint=e.hint) from e


def check_image(text: str, what: str = "IMAGE", *, engine_id: bool = True) -> str:
    """`parse_image_name`, for callers that keep the text."""
    return parse_image_name(text, what, engine_id=engine_id).text


def is_loopback_registry(registry: str) -> bool:
    """Loopback registries are spoken to over plain HTTP, as Docker allows by default."""
    host = registry
    if host.startswith("["):
        host = host[1 : host.index("]")]
    else:
        host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return host in ("localhost", "::1") or host.startswith("127.")
