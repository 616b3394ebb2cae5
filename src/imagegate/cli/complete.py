"""Command: complete."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from imagegate import accept, runner
from imagegate.cli import _accept as o
from imagegate.cli._app import Format, app
from imagegate.drivers.interface import Driver
from imagegate.gpus import parse as gpus_parse


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
    gpus: str = o.opt(
        None, "--gpus", help="Give the probes GPUs: all, a count, or ids (0,1). Default: none (GPUs hidden)."
    ),
    here: bool = o.opt(
        False, "--here", help="Run in this environment instead of a container (local driver)."
    ),
    python: str = o.opt(None, "--python", help="With --here: the interpreter to run the probes with."),
    out: Path = o.opt(
        None, "--out", "-o", help="Evidence folder (default: the one holding the earlier attempt)."
    ),
    timeout: float = o.TIMEOUT,
    memory: str = o.opt("8g", "--memory", help="Container memory limit."),
    pull: str = o.opt(
        "never", "--pull", help="Pull the image through the engine: never (default), missing, always."
    ),
    require_complete: bool = o.REQUIRE_COMPLETE,
    key: str = o.KEY,
    no_sign: bool = o.NO_SIGN,
    quiet: bool = o.QUIET,
) -> None:
    """Complete an attempt's deferred stages (e.g. on a GPU host) in a new, linked attempt."""
    from imagegate import complete as completing

    notify = o.notifier(quiet)
    driver: Driver | None = None
    try:
        o.check_timeout(timeout)
        outputs = o.outputs(reports=[], fmt=Format.table, key=key, no_sign=no_sign, notify=notify)
        gpu_request = gpus_parse(gpus)
        earlier, prep = completing.prepare(attempt, gpu_request.spec if gpu_request else None)
        driver = accept.driver_for(
            here=here, python=python, memory=memory, pull=pull, gpus=gpu_request, notify=notify
        )
        opts = runner.RunOptions(pipeline="", timeout=timeout, jobs=os.cpu_count() or 1)
        observer = completing.CompletionObserver(earlier, driver, opts, notify)
        root = out or earlier.dir.parent.parent  # beside the earlier attempt by default
        done = accept.accept(prep, observer, root, outputs, notify)
    except KeyboardInterrupt:
        raise o.interrupted(driver) from None
    raise o.finish(done, Format.table, require_complete, quiet)
