"""Why an engine's pull failed, from its words (Docker's and Podman's Go error text), and whose
it is: an image or registry that does not exist is the input's (exit 3); a registry that could
not answer is the moment's (exit 2, nothing decided), so a CI outage does not read as a typo."""

from __future__ import annotations

import re
from dataclasses import dataclass

EXIT_INPUT, EXIT_UNDECIDED = 3, 2
AGAIN = "the registry could not answer: nothing was decided; try again later"

# Where the engine names the registry it asked: the URL, the name it looked up, the address.
_HOST = (
    re.compile(r'"https?://([^/"]+)'),
    re.compile(r"\blookup (\S+?)(?: on |: |$)"),
    re.compile(r"\bdial tcp ([^\s:]+:\d+)"),
    re.compile(r"\bcontainer registry ([^\s:]+(?::\d+)?)"),
)
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
    if "no such host" in text:
        return PullCause(f"{host}: no such host", EXIT_INPUT, "check the registry's name in the reference")
    if "connection refused" in text:
        return PullCause(f"registry {host} refused the connection", EXIT_UNDECIDED, AGAIN)
    if "timeout" in text or "timed out" in text or "deadline exceeded" in text:
        return PullCause(f"registry {host} did not answer in time", EXIT_UNDECIDED, AGAIN)
    if "connection reset" in text or ("tls: " in text and "x509" not in text):
        why = "reset the connection" if "connection reset" in text else "broke off the TLS handshake"
        return PullCause(f"registry {host} {why}", EXIT_UNDECIDED, AGAIN)
    if "temporary failure in name resolution" in text or "server misbehaving" in text:
        return PullCause(f"{host}: the name could not be looked up now", EXIT_UNDECIDED, AGAIN)
    if status := _STATUS.search(detail):
        return PullCause(f"registry {host} answered {status[1]} {status[2]}", EXIT_UNDECIDED, AGAIN)
    if missing := next((m for m in _MISSING if m in text), None):
        return PullCause(f"registry {host} has no such image ({missing})", EXIT_INPUT, None)
    return PullCause(detail, EXIT_INPUT, None)  # a login, a certificate, a platform: the engine's words
