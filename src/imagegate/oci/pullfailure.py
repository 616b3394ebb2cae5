"""Why an engine's pull failed, from its words (Docker's and Podman's Go error text), and whose
it is: an image or registry that does not exist is the input's (exit 3); a registry that could
not answer is the moment's (exit 2, nothing decided), so a CI outage does not read as a typo.

The driver raises the engine's text as it came (drivers/docker.py PullFailed, whose `detail`
ends the message); `worded` says it in words and gives its exit code where errors are reported
(the CLI, an audit's rows)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from imagegate.errors import ImagegateError, UsageError, causes

EXIT_INPUT, EXIT_UNDECIDED = 3, 2
AGAIN = "the registry could not answer: nothing was decided; try again later"

# Where the engine names the registry it asked: the URL, the name it looked up, the address.
_HOST = (
    re.compile(r'"https?://([^/"]+)'),
    re.compile(r"\blookup (\S+?)(?: on |: |$)"),
    re.compile(r"\bdial tcp ([^\s:]+:\d+)"),
    re.compile(r"\bcontainer registry ([^\s:]+(?::\d+)?)"),
    re.compile(r"\bmanifest for ([^/\s]+)/"),
)
_IMAGE = re.compile(r"^image (\S+): (?:pull failed|not found in the)")
_STATUS = re.compile(r"\b(429|5\d\d) ([A-Z][A-Za-z]*(?: [A-Z][A-Za-z]*)*)")
# The registry's own code first: "manifest for … not found: manifest unknown" says it.
_MISSING = ("manifest unknown", "name unknown", "repository does not exist", "not found")


@dataclass(frozen=True)
class PullCause:
    words: str  # names the registry and the cause
    exit_code: int
    hint: str | None  # None: the caller's own


def _host(detail: str, registry: str) -> str:
    for pattern in _HOST:
        if m := pattern.search(detail):
            return m.group(1)
    return registry


def engine_pull_cause(detail: str, registry: str) -> PullCause:
    """The cause of a pull the engine answered with `detail`, for an image of `registry`."""
    text, host = detail.lower(), _host(detail, registry)
    reg = f"registry {host}" if host else "the registry"
    if "no such host" in text:
        return PullCause(
            f"{host or 'the registry'}: no such host",
            EXIT_INPUT,
            "check the registry's name in the reference",
        )
    if "connection refused" in text:
        return PullCause(f"{reg} refused the connection", EXIT_UNDECIDED, AGAIN)
    if "timeout" in text or "timed out" in text or "deadline exceeded" in text:
        return PullCause(f"{reg} did not answer in time", EXIT_UNDECIDED, AGAIN)
    if "connection reset" in text or ("tls: " in text and "x509" not in text):
        why = "reset the connection" if "connection reset" in text else "broke off the TLS handshake"
        return PullCause(f"{reg} {why}", EXIT_UNDECIDED, AGAIN)
    if "temporary failure in name resolution" in text or "server misbehaving" in text:
        return PullCause(
            f"{host or 'the registry'}: the name could not be looked up now", EXIT_UNDECIDED, AGAIN
        )
    if status := _STATUS.search(detail):
        return PullCause(f"{reg} answered {status[1]} {status[2]}", EXIT_UNDECIDED, AGAIN)
    if missing := next((m for m in _MISSING if m in text), None):
        return PullCause(f"{reg} has no such image ({missing})", EXIT_INPUT, None)
    return PullCause(detail, EXIT_INPUT, None)  # a login, a certificate, a platform: the engine's words


def _registry(message: str) -> str:
    """The registry of the image the message names ('' when it names none)."""
    from imagegate.oci.reference import parse_image_name

    m = _IMAGE.match(message)
    try:
        ref = parse_image_name(m[1]).reference if m else None
    except ImagegateError:
        ref = None
    return ref.registry if ref is not None else ""


def worded(err: ImagegateError) -> ImagegateError:
    """`err`, when an engine's pull failure ends it, with that failure in words and the exit
    code it deserves; any other error as it is."""
    pulled = next((e for e in causes(err) if type(e).__name__ == "PullFailed"), None)
    detail, text = getattr(pulled, "detail", None), str(err)
    if not isinstance(detail, str) or not detail or not text.endswith(detail):
        return err
    cause = engine_pull_cause(detail, _registry(text))
    said = text[: len(text) - len(detail)] + cause.words
    if cause.exit_code == EXIT_INPUT:  # the driver's hint: check the name, the registry, the login
        return UsageError(said, hint=err.hint)
    return ImagegateError(said, hint=cause.hint)  # exit 2: nothing decided
