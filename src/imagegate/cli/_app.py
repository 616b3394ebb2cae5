"""The typer app, and how an ImagegateError becomes a message and an exit code: commands let
errors rise; `run_main` (imagegate.cli) catches them once, around the whole app, and calls
`report_error`."""

from __future__ import annotations

import enum
import sys

import typer

from imagegate import __version__
from imagegate.errors import ImagegateError

app = typer.Typer(
    name="imagegate",
    help=(
        "Accept or reject a container image before it reaches GPUs: staged probes inside the "
        "image, layer identity, signed attestations.\n\n"
        "Exit codes: 0 accepted, 1 rejected, 2 could not decide, 3 usage or input error, "
        "130 interrupted (SIGINT), 143 terminated (SIGTERM)."
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class Format(str, enum.Enum):
    """`--format` of the commands that print either a table or JSON."""

    table = "table"
    json = "json"


def report_error(err: ImagegateError) -> int:
    """Print `err` (and its hint) to stderr; return its exit code."""
    msg = f"imagegate: error: {err}"
    if err.hint:
        msg += f"\n  hint: {err.hint}"
    print(msg, file=sys.stderr)
    return err.exit_code


def version_callback(value: bool) -> None:
    if value:
        print(f"imagegate {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """imagegate."""
