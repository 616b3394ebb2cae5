"""Command-line interface: parse, call, render, map errors to exit codes. No domain logic here;
each command group lives in its own module and registers itself on the shared app.

`main()` imports only the module of the command asked for (start-up time is part of every CI
run); `--help`, completion and anything unknown load them all. So a command module imports, at its
top, only what typer reads when the command is registered (its options, their defaults and types,
its help); the layers below and the views are imported inside the command, when it runs
(tests/cli/test_startup.py). The command modules leave out `from __future__ import annotations`:
typer reads every parameter's annotation, and string annotations are compiled one by one, about
half of these modules' import time; names imported for type checking alone are quoted."""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, NoReturn

from imagegate._support import interrupts
from imagegate._support.interrupts import EXIT_SIGINT, EXIT_SIGTERM

if TYPE_CHECKING:  # imported when `app` is asked for: `--version` never loads typer
    import typer

# command name -> module registering it, in the order `--help` lists them
COMMAND_MODULES = {
    "run": "run",
    "complete": "complete",
    "pipelines": "pipelines",
    "layers": "oci",
    "compare": "oci",
    "cache": "cache",
    "keygen": "attest",
    "verify": "attest",
    "attach": "attest",
    "index": "attest",
    "policies": "policies",
    "pod": "pod",
    "fleet": "fleet",
    "report": "report",
    "audit": "report",
}
# What the shell sets to ask typer for completions, for the console script's name.
COMPLETE_VAR = "_IMAGEGATE_COMPLETE"

__all__ = ["COMMAND_MODULES", "EXIT_SIGINT", "EXIT_SIGTERM", "app", "load_all", "main", "run_main"]


def _load(modules: list[str]) -> None:
    for name in dict.fromkeys(modules):
        importlib.import_module(f"imagegate.cli.{name}")


def load_all() -> None:
    _load(list(COMMAND_MODULES.values()))


def __getattr__(name: str) -> typer.Typer:
    if name == "app":  # `from imagegate.cli import app`: the whole app, every command registered
        from imagegate.cli._app import app

        load_all()
        return app
    raise AttributeError(name)


def _completing() -> bool:
    return any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ)


def _command(argv: list[str]) -> str | None:
    first = next((a for a in argv if not a.startswith("-")), None)
    return None if _completing() or "--help" in argv[:1] else first


def _typer_completes() -> bool:
    """Whether typer will complete and exit, running no command: its variable is set, not empty,
    and this is the console script (typer names the variable after the program; `python -m
    imagegate` would be another name, and the command would run)."""
    return bool(os.environ.get(COMPLETE_VAR)) and os.path.basename(sys.argv[0]) == "imagegate"


class _AsTyped:
    """A parameter's value left as typed: what `_values_as_typed` puts in place of typer's check."""

    # typer's RuntimeParam.coerce(value, param, ctx): any value, given back; param and ctx unread.
    def coerce(self, value: object, param: object, ctx: object) -> object:
        return value


def _values_as_typed() -> None:
    """Shell completion parses the words typed so far only to find what the cursor is on
    (leniently: a bad value is no error then), and no option of ours reads another's value to
    complete. typer checks every parameter's value, given or not, with a pydantic TypeAdapter
    built on first use: importing pydantic takes as long as typer and rich together. While
    completing, values stay as typed. A typer without these checks has nothing to replace."""
    import typer.core

    param = getattr(typer.core, "_TyperParameter", None)
    if param is not None and hasattr(param, "get_runtime_param"):
        param.get_runtime_param = lambda self: _AsTyped()


def _help_only(args: list[str]) -> bool:
    """`imagegate CMD [SUB] --help`: print that command's help as the parser would, without
    parsing. Parsing runs each group's own options through typer's value checks, which import
    pydantic (typer's adapters) even though none was given: a third of the start-up. Anything
    else (an argument, an option, a name that is no command) goes to the parser, as before."""
    import typer.core
    import typer.main

    from imagegate.cli._app import app

    if len(args) < 2 or args[-1] not in ("--help", "-h"):
        return False
    command = typer.main.get_command(app)
    ctx = command.context_class(command, info_name="imagegate", **command.context_settings)
    for word in args[:-1]:
        sub = command.get_command(ctx, word) if isinstance(command, typer.core.TyperGroup) else None
        if sub is None:
            return False
        command = sub
        ctx = command.context_class(command, info_name=word, parent=ctx, **command.context_settings)
    typer.echo(ctx.get_help(), color=ctx.color)
    return True


def main(argv: list[str] | None = None) -> None:
    """The console script: every exit code is decided here, once, for every command."""
    interrupts.install_handlers()  # first: a signal while the rest is still importing is ours too
    try:
        code = run_main(argv)
    except KeyboardInterrupt:  # before the command began (importing it)
        print("imagegate: interrupted", file=sys.stderr)
        code = interrupts.exit_code()
    code = interrupts.ending() or code  # a signal that came on the last lines
    from imagegate._support import deadline

    if deadline.stranded():
        # The deadline's hard stop left a thread blocked on a server that never answers: the
        # message is out, so leave without joining it (a normal exit would wait for it).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if interrupts.signalled():
        _leave_interrupted(code)
    sys.exit(code)


def _leave_interrupted(code: int) -> NoReturn:
    """Exit with `code` after an interrupt, as a normal exit does (threads joined, exit handlers
    run, output flushed) but by os._exit. Under `python -m`, CPython ends the process by SIGINT
    (exit -2), whatever code it was given, once a KeyboardInterrupt was raised inside exec() of a
    string, even one caught: dataclasses and namedtuple create their methods that way at import,
    so a Ctrl-C while the command imports lands there now and then (runpy's path reads the flag
    exec() left; a script's path exits before)."""
    import atexit
    import threading

    for t in threading.enumerate():
        if t is not threading.current_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["--version"]:  # asked in every CI log: answered before the app is imported
        from imagegate import version_line

        print(version_line())
        return 0

    import typer

    from imagegate.cli._app import app, report_error, report_usage
    from imagegate.errors import ImagegateError

    command = _command(args)
    if command in COMMAND_MODULES:
        _load([COMMAND_MODULES[command]])
    else:
        load_all()
    if _help_only(args):
        return 0
    if _typer_completes():
        _values_as_typed()
    try:
        rv = app(args=args, standalone_mode=False)
    except typer.TyperException as e:
        # A parser error (unknown option, missing value, bad choice) is a usage error: exit 3,
        # as documented, not the parser's own 2 ("could not decide" here).
        return report_usage(e, args, COMMAND_MODULES)
    except ImagegateError as e:  # every command's input and setup errors, mapped here only
        return report_error(e)
    except (typer.Abort, KeyboardInterrupt):
        print("imagegate: interrupted", file=sys.stderr)
        return interrupts.exit_code()
    except Exception as e:  # a bug, not an outcome: say so briefly, exit "could not decide"
        import traceback

        traceback.print_exc()
        print(
            f"imagegate: internal error: {type(e).__name__}: {e}\n  please report it with the traceback above",
            file=sys.stderr,
        )
        return 2
    code = rv if isinstance(rv, int) else 0
    # The parser turns an interrupt into 130 itself; a SIGTERM is 143.
    return interrupts.exit_code() if code == EXIT_SIGINT else code
