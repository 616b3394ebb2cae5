"""What the accepting commands (run, pod run, pod collect, complete) share: their options, the
key resolved before the work, the progress display, and rendering the outcome. The work itself
is `imagegate.accept`."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from imagegate.accept import Accepted, Outputs, check_outputs
from imagegate.attest import keys as attest_keys
from imagegate.cli._app import Format
from imagegate.errors import UsageError
from imagegate.model import exit_code
from imagegate.runner import RunOptions

Notify = Callable[[str], None]


def opt(default: Any, *names: str, **kw: Any) -> Any:
    return typer.Option(default, *names, **kw)


PIPELINE_HELP = "Built-in name (python, vllm, sglang, sglang-disagg) or a YAML file."
OUT_HELP = "Evidence folder; each run adds a new attempt."
FORMAT_HELP = "table, or json: the in-toto statement on stdout, nothing else."
TIMEOUT_HELP = "Overall deadline in seconds (default: the stages' timeouts added up)."
REPORT_HELP = "Also write FORMAT=PATH (repeatable): json, junit, markdown, html; PATH - is stdout."
ATTACH_HELP = "Push the signed attestation to IMAGE's repository (as cosign attaches .att)."
KEY_HELP = "Signing key (PEM); default $IMAGEGATE_SIGNING_KEY, else the user's key, created on first use."
EXIT_CODES = (
    "Exit codes: 0 accepted (PASS, or a deferred verdict), 1 rejected (FAIL, or deferred with "
    "--require-complete), 2 could not decide (ERROR), 3 usage or input error."
)


PIPELINE = opt("python", "--pipeline", "-p", help=PIPELINE_HELP)
MODULES = opt([], "--module", "-m", help="Module for the find_spec stage (repeatable).")
OUT = opt(Path("imagegate-runs"), "--out", "-o", help=OUT_HELP)
FMT = opt(Format.table, "--format", help=FORMAT_HELP)
REQUIRE_COMPLETE = opt(False, "--require-complete", help="A deferred verdict exits 1.")
TIMEOUT = opt(None, "--timeout", help=TIMEOUT_HELP)
REPORT = opt([], "--report", help=REPORT_HELP)
ADVISORY_DB = opt(None, "--advisory-db", help="OSV advisory folder for an offline vulnerability audit.")
KEY = opt(None, "--key", help=KEY_HELP)
NO_SIGN = opt(False, "--no-sign", help="Do not sign the attempt.")
ATTACH = opt(False, "--attach", help=ATTACH_HELP)
INSECURE = opt(False, "--insecure", help="With --attach: plain HTTP to the registry.")
QUIET = opt(False, "--quiet", "-q", help="No progress messages on stderr.")


def notifier(quiet: bool) -> Notify:
    err = Console(stderr=True)
    return (
        (lambda _m: None)
        if quiet
        else (lambda m: err.print(f"[dim]imagegate: {m}[/dim]", soft_wrap=True, highlight=False))
    )


def check_timeout(seconds: float | None) -> None:
    from imagegate.pipeline.model import check_duration

    try:
        if seconds is not None:
            check_duration(seconds)
    except ValueError as e:
        raise UsageError(f"--timeout: {e}", hint="give seconds, e.g. --timeout 1800") from e


def outputs(
    *,
    reports: list[str],
    fmt: Format,
    key: str | None,
    no_sign: bool,
    notify: Notify,
    attach: bool = False,
    insecure: bool = False,
    reference: str | None = None,
) -> Outputs:
    """Checked before the work: a bad report path, key or passphrase fails first, not after the run."""
    from imagegate.report import formats

    check_outputs(Outputs(attach=attach), reference, no_sign=no_sign)
    specs = formats.parse_specs(reports)
    if fmt is Format.json and any(p == formats.STDOUT for _, p in specs):
        raise UsageError(
            "--format json and --report FORMAT=- both want stdout", hint="write the report to a file"
        )
    return Outputs(_signing_key(key, no_sign, notify), attach, insecure, specs)


def _signing_key(key: str | None, no_sign: bool, notify: Notify) -> attest_keys.SigningKey | None:
    """With no key named and no default key possible (a read-only home), the run goes on
    unsigned and says so: the verdict and its evidence are still written."""
    if no_sign:
        return None
    try:
        return attest_keys.resolve_signing_key(key, notify=notify)
    except attest_keys.DefaultKeyUnavailable as e:
        typer.echo(f"imagegate: warning: the attempt will not be signed: {e}\n  hint: {e.hint}", err=True)
        return None


@contextlib.contextmanager
def progress(opts: RunOptions, silent: bool) -> Iterator[None]:
    """Stage progress and layer bars on a terminal; a line every 15 s in a CI log while the
    engine prepares a big image's export; nothing when silent."""
    if silent:
        yield
        return
    from imagegate.report.progress import LayerBars, StageView, WaitLines

    err = Console(stderr=True, highlight=False)
    bars = LayerBars(err) if err.is_terminal else None
    opts.progress = bars or WaitLines(err)
    try:
        with StageView(console=err) as view:
            opts.on_event = view.event
            yield
    finally:
        if bars is not None:
            bars.close()


def finish(done: Accepted, fmt: Format, require_complete: bool, quiet: bool) -> typer.Exit:
    """The outcome: the statement (--format json) or the table, and the exit code."""
    from imagegate.report import console as console_report
    from imagegate.report import formats

    record = done.record
    code = exit_code(record.verdict, require_complete=require_complete)
    if fmt is Format.json:
        sys.stdout.write(formats.statement_text(done.statement))  # as signed, byte for byte
        if not quiet:  # stdout is the statement's alone; where the evidence went still matters
            print(f"imagegate: evidence: {record.attempt_dir}", file=sys.stderr)
    else:
        # A machine format on stdout keeps stdout to itself: the table goes to stderr then.
        rejected_by = "--require-complete" if code != exit_code(record.verdict) else None
        console = console_report.make_console(stderr=done.used_stdout)
        console_report.render(record, console, rejected_by=rejected_by)
    return typer.Exit(code)


def interrupted(driver: Any) -> typer.Exit:
    """SIGINT, or SIGTERM through the entry point's handlers (which set the code, 130 or 143).
    "Removed" is said only when the engine confirmed it (the driver forgets a container then)."""
    left = sorted(getattr(driver, "live", ()))
    print(
        f"imagegate: interrupted; container {', '.join(left)} may be left: docker rm -f {' '.join(left)}"
        if left
        else "imagegate: interrupted; nothing was left running",
        file=sys.stderr,
    )
    return typer.Exit(130)
