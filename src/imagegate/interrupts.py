"""How an interrupt stops a command: SIGINT and SIGTERM both raise KeyboardInterrupt in the main
thread, so both take the one way out that removes containers and waits for worker threads; the
exit code still tells them apart, as a shell reports a process killed by the signal (128 + its
number)."""

from __future__ import annotations

import signal
from types import FrameType

EXIT_SIGINT = 130
EXIT_SIGTERM = 143

_terminated = False


def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    # SIGTERM (CI cancelling the job) takes Ctrl-C's path; the flag keeps the exit code apart.
    global _terminated
    _terminated = True
    raise KeyboardInterrupt


def install_handlers() -> None:
    """Unconditionally: a CI runner may start us with SIGINT ignored (inherited across exec),
    and an interrupt must still stop the run and remove its container."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _on_sigterm)


def exit_code() -> int:
    """The exit code of the interrupt that stopped the command: 130 (SIGINT) or 143 (SIGTERM)."""
    return EXIT_SIGTERM if _terminated else EXIT_SIGINT
