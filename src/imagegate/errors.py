"""One error family. Outcomes of checks are data (statuses); these are for input and setup
problems that stop a command. Only the CLI turns them into messages and exit codes."""

from __future__ import annotations

# The exit codes every command shares (docs/ci-gate.md), named once.
EXIT_ACCEPTED = 0
EXIT_REJECTED = 1
EXIT_UNDECIDED = 2
EXIT_USAGE = 3


class ImagegateError(Exception):
    """Base error: `str(e)` names the thing and the problem; `hint` says what to do next."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class UsageError(ImagegateError):
    """Bad input from the user: a missing image, a malformed pipeline, a bad flag value."""

    exit_code = 3


class NotVerified(ImagegateError):
    """An input that must verify before anything is built on it does not (an earlier attempt
    `complete` was asked to complete: its signature, its evidence, its link): rejected, exit 1,
    as `verify` rejects it."""

    exit_code = 1


class EngineError(ImagegateError):
    """The container engine could not be reached or refused a request."""

    exit_code = 2


class InternalError(ImagegateError):
    """imagegate broke its own contract (a bug to report), e.g. a probe reported a fact that the
    attestation does not know how to carry."""

    exit_code = 2


def causes(err: BaseException) -> list[BaseException]:
    """`err` and what it wraps, outermost first: its __cause__ and __context__, and the
    exceptions requests and urllib3 keep in their args (`('Connection aborted.', OSError(…))`)
    or as `reason`."""
    seen: list[BaseException] = []
    todo = [err]
    while todo:
        e = todo.pop(0)
        if any(e is s for s in seen):
            continue
        seen.append(e)
        inner = [e.__cause__, e.__context__, getattr(e, "reason", None), *e.args]
        todo += [x for x in inner if isinstance(x, BaseException)]
    return seen


# A name the resolver says does not exist (EAI_NONAME, EAI_NODATA where defined): an input
# error. EAI_AGAIN ("temporary failure") is the resolver's moment, not the name.
_NO_SUCH_NAME = {-2, -5}


def no_such_host(err: BaseException) -> bool:
    """Whether `err` comes from a host name that does not resolve (no retry will find it)."""
    return any(
        type(e).__name__ == "gaierror" and getattr(e, "errno", None) in _NO_SUCH_NAME for e in causes(err)
    )


def describe_exception(err: BaseException) -> str:
    """`err` in words, from the innermost cause that has them: 'connection refused', 'no such
    host', 'no such file or directory: /var/run/docker.sock', 'timed out', 'TLS: certificate
    verify failed: …'; never a Python repr of the wrappers around it."""
    chain = causes(err)
    if no_such_host(err):
        return "no such host"
    for e in reversed(chain):  # innermost first
        if type(e).__name__ in ("SSLCertVerificationError", "SSLError"):
            said = getattr(e, "verify_message", None) or getattr(e, "reason", None) or "handshake failed"
            return f"TLS: {str(said).lower().replace('_', ' ')}"
        if isinstance(e, TimeoutError) or "Timeout" in type(e).__name__:
            return "timed out"
        if isinstance(e, OSError) and e.strerror:
            words = e.strerror[:1].lower() + e.strerror[1:]
            return f"{words}: {e.filename}" if e.filename else words
    for e in chain:  # outermost first: its own words, unless they are a repr of what it wraps
        text = str(e).strip()
        if text and not text.startswith(("(", "<")) and "Error(" not in text:
            return text
    return type(err).__name__
