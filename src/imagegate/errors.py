"""One error family. Outcomes of checks are data (statuses); these are for input and setup
problems that stop a command. Only the CLI turns them into messages and exit codes."""

from __future__ import annotations


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
