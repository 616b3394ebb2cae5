"""Command-line interface: parse, call, render, map errors to exit codes. No domain logic here;
each command group lives in its own module and registers itself on the shared app."""

from __future__ import annotations

from imagegate.cli import (  # noqa: F401  (registers commands)
    attest,
    oci,
    pipelines,
    pod,
    report,
    run,
)
from imagegate.cli._app import app

__all__ = ["app", "main"]


def main() -> None:
    try:
        app()
    except Exception as e:  # a bug, not an outcome: say so briefly, exit "could not decide"
        import sys
        import traceback

        traceback.print_exc()
        print(
            f"imagegate: internal error: {type(e).__name__}: {e}\n  please report it with the traceback above",
            file=sys.stderr,
        )
        sys.exit(2)
