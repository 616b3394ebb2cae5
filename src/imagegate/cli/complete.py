"""Command: complete."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console

from imagegate import runner
from imagegate.cli import _sign
from imagegate.cli._app import app
from imagegate.drivers.interface import Driver
from imagegate.errors import UsageError
from imagegate.gpus import parse as gpus_parse
from imagegate.model import exit_code
from imagegate.report import console as console_report


@app.command(
    epilog="Examples:\n\n"
    "  imagegate complete imagegate-runs/sha256-ab12…/20260101T000000.000Z-1a2b3c --gpus all\n\n"
    "  imagegate complete runs/ref-local/20260101T000000.000Z-1a2b3c --here --gpus all\n\n"
    "Runs exactly the stages ATTEMPT deferred (after the GPU node check when --gpus is given), "
    "with its own pipeline and plan, against the same image (refused, exit 3, when its ID or "
    "digest differs; with --here, the same interpreter and distributions). Writes a new attempt "
    "beside the earlier one whose signed statement links it and whose verdict covers both; the "
    "earlier attempt is never changed. Exit codes as for run."
)
def complete(
    attempt: Path = typer.Argument(..., help="The earlier attempt folder, or its attestation file."),
    gpus: str = typer.Option(
        None, "--gpus", help="Give the probes GPUs: all, a count, or ids (0,1). Default: none (GPUs hidden)."
    ),
    here: bool = typer.Option(
        False, "--here", help="Run in this environment instead of a container (local driver)."
    ),
    python: str = typer.Option(None, "--python", help="With --here: the interpreter to run the probes with."),
    out: Path = typer.Option(
        None, "--out", "-o", help="Evidence folder (default: the one holding the earlier attempt)."
    ),
    timeout: float = typer.Option(
        None, "--timeout", help="Overall deadline in seconds (default: the stages' timeouts added up)."
    ),
    memory: str = typer.Option("8g", "--memory", help="Container memory limit."),
    pull: str = typer.Option(
        "never", "--pull", help="Pull the image through the engine: never (default), missing, always."
    ),
    require_complete: bool = typer.Option(False, "--require-complete", help="A deferred verdict exits 1."),
    key: str = _sign.key_option(),
    no_sign: bool = _sign.no_sign_option(),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress messages on stderr."),
) -> None:
    """Complete an attempt's deferred stages (e.g. on a GPU host) in a new, linked attempt."""
    err = Console(stderr=True)
    notify: Callable[[str], None] = (
        (lambda _m: None)
        if quiet
        else (lambda m: err.print(f"[dim]imagegate: {m}[/dim]", soft_wrap=True, highlight=False))
    )
    driver: Driver | None = None
    try:
        if python and not here:
            raise UsageError(
                "--python goes with --here", hint="in a container the image's own python is used"
            )
        signing_key = _sign.resolve(key, no_sign, notify)
        gpu_request = gpus_parse(gpus)
        if here:
            from imagegate.drivers.local import LocalDriver

            driver = LocalDriver(python, gpus=gpu_request)
        else:
            from imagegate.drivers.docker import DockerDriver

            driver = DockerDriver(memory=memory, pull=pull, notify=notify, gpus=gpu_request)
        from imagegate.complete import complete as completing

        opts = runner.RunOptions(pipeline="", timeout=timeout, jobs=os.cpu_count() or 1)
        record = completing(
            attempt, driver, opts, gpus=gpu_request.spec if gpu_request else None, out=out, notify=notify
        )
        _sign.sign(record, signing_key, notify)
    except KeyboardInterrupt:
        left = sorted(getattr(driver, "live", ()))
        print(
            f"imagegate: interrupted; container {', '.join(left)} may be left: docker rm -f {' '.join(left)}"
            if left
            else "imagegate: interrupted; nothing was left running",
            file=sys.stderr,
        )
        raise typer.Exit(130) from None
    code = exit_code(record.verdict, require_complete=require_complete)
    rejected_by = "--require-complete" if code != exit_code(record.verdict) else None
    console_report.render(record, console_report.make_console(stderr=False), rejected_by=rejected_by)
    raise typer.Exit(code)
