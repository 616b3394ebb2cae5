"""Command-line interface: parse, call, render, map errors to exit codes. No domain logic here;
each command group lives in its own module and registers itself on the shared app.

`main()` imports only the module of the command asked for (start-up time is part of every CI
run); `--help`, completion and anything unknown load them all."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

# command name -> module registering it, in the order `--help` lists them
COMMAND_MODULES = {
    "run": "run",
    "pipelines": "pipelines",
    "layers": "oci",
    "compare": "oci",
    "keygen": "attest",
    "verify": "attest",
    "attach": "attest",
    "pod": "pod",
    "report": "report",
    "audit": "report",
}

__all__ = ["COMMAND_MODULES", "app", "load_all", "main"]


def _load(modules: list[str]) -> None:
    for name in dict.fromkeys(modules):
        importlib.import_module(f"imagegate.cli.{name}")


def load_all() -> None:
    _load(list(COMMAND_MODULES.values()))


def __getattr__(name: str) -> Any:
    if name == "app":  # `from imagegate.cli import app`: the whole app, every command registered
        from imagegate.cli._app import app

        load_all()
        return app
    raise AttributeError(name)


def _command(argv: list[str]) -> str | None:
    first = next((a for a in argv if not a.startswith("-")), None)
    completing = any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ)
    return None if completing or "--help" in argv[:1] else first


def main() -> None:
    from imagegate.cli._app import app

    command = _command(sys.argv[1:])
    if command in COMMAND_MODULES:
        _load([COMMAND_MODULES[command]])
    else:
        load_all()
    try:
        app()
    except Exception as e:  # a bug, not an outcome: say so briefly, exit "could not decide"
        import traceback

        traceback.print_exc()
        print(
            f"imagegate: internal error: {type(e).__name__}: {e}\n  please report it with the traceback above",
            file=sys.stderr,
        )
        sys.exit(2)
