"""Command-line interface: parse, call, render, map errors to exit codes. No domain logic here;
each command group lives in its own module and registers itself on the shared app."""

from __future__ import annotations

from imagegate.cli import pipelines, run  # noqa: F401  (registers commands)
from imagegate.cli import oci  # noqa: F401
from imagegate.cli._app import app

__all__ = ["app", "main"]


def main() -> None:
    app()
