"""Command: run."""

from __future__ import annotations

import contextlib
import enum
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import typer
from rich.console import Console

from imagegate import runner
from imagegate.cli import _sign
from imagegate.cli._app import app, fail
from imagegate.drivers.interface import Driver
from imagegate.errors import ImagegateError, UsageError
from imagegate.model import exit_code
from imagegate.report import console as console_report
from imagegate.report import formats
from imagegate.report.progress import LayerBars, StageView, setup_logging


class Format(str, enum.Enum):
    table = "table"
    json = "json"


def _sigterm(_signum: int, _frame: FrameType | None) -> None:
    # Turn SIGTERM (CI cancelling the job) into the same path as Ctrl-C: containers get removed.
    raise KeyboardInterrupt


@app.command(
    epilog="Examples:\n\n"
    "  imagegate run myorg/vllm:0.11 -p vllm\n\n"
    "  imagegate run app:latest -p python -m numpy -m av --format json > statement.json\n\n"
    "  imagegate run app:latest -p ./my-pipeline.yaml --require-complete\n\n"
    "  imagegate run --here -p python -m requests      # this environment, e.g. inside a Pod\n\n"
    "Exit codes: 0 accepted (PASS, or a deferred verdict), 1 rejected (FAIL, or deferred with "
    "--require-complete), 2 could not decide (ERROR), 3 usage or input error."
)
def run(
    image: str = typer.Argument(None, help="Image reference or ID in the engine (DOCKER_HOST is honoured)."),
    pipeline: str = typer.Option(
        "python",
        "--pipeline",
        "-p",
        help="Built-in name (python, vllm, sglang, sglang-disagg) or a YAML file.",
    ),
    module: list[str] = typer.Option(
        [], "--module", "-m", help="Module for the find_spec stage (repeatable)."
    ),
    out: Path = typer.Option(
        Path("imagegate-runs"), "--out", "-o", help="Evidence folder; each run adds a new attempt."
    ),
    fmt: Format = typer.Option(
        Format.table, "--format", help="table, or json: the in-toto statement on stdout, nothing else."
    ),
    require_complete: bool = typer.Option(False, "--require-complete", help="A deferred verdict exits 1."),
    timeout: float = typer.Option(
        None, "--timeout", help="Overall deadline in seconds (default: the stages' timeouts added up)."
    ),
    memory: str = typer.Option("8g", "--memory", help="Container memory limit."),
    pull: str = typer.Option(
        "missing", "--pull", help="Pull IMAGE through the engine: missing (as docker run), never, always."
    ),
    here: bool = typer.Option(
        False, "--here", help="Run in this environment instead of a container (local driver)."
    ),
    python: str = typer.Option(None, "--python", help="With --here: the interpreter to run the probes with."),
    source: str = typer.Option(
        None, "--source", help="For the layers stage: read the image from this transport."
    ),
    expect_config: str = typer.Option(
        None, "--expect-config", help="For the layers stage: the official config digest."
    ),
    report: list[str] = typer.Option(
        [],
        "--report",
        help="Also write FORMAT=PATH (repeatable): json, junit, markdown, html; PATH - is stdout.",
    ),
    advisory_db: Path = typer.Option(
        None, "--advisory-db", help="OSV advisory folder for an offline vulnerability audit."
    ),
    key: str = _sign.key_option(),
    no_sign: bool = _sign.no_sign_option(),
    attach: bool = typer.Option(
        False, "--attach", help="Push the signed attestation to IMAGE's repository (as cosign attaches .att)."
    ),
    insecure: bool = typer.Option(False, "--insecure", help="With --attach: plain HTTP to the registry."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress messages on stderr."),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="More detail on stderr (-v, -vv)."),
) -> None:
    """Run a pipeline of probes against IMAGE and give a verdict with its evidence."""
    setup_logging(verbose, quiet)
    err = Console(stderr=True)
    notify: Callable[[str], None] = (
        (lambda _m: None)
        if quiet or fmt is Format.json
        else (lambda m: err.print(f"[dim]imagegate: {m}[/dim]", soft_wrap=True, highlight=False))
    )
    try:
        if image is None and not here:
            raise UsageError(
                "no IMAGE given", hint="imagegate run IMAGE -p PIPELINE, or --here for this environment"
            )
        if python and not here:
            raise UsageError(
                "--python goes with --here", hint="in a container the image's own python is used"
            )
        if attach and no_sign:
            raise UsageError("--attach needs a signed attestation", hint="drop --no-sign")
        reports = formats.parse_specs(report)
        if fmt is Format.json and any(p == formats.STDOUT for _, p in reports):
            raise UsageError(
                "--format json and --report FORMAT=- both want stdout", hint="write the report to a file"
            )
        # A bad key or passphrase fails before the work, not after it.
        signing_key = _sign.resolve(key, no_sign, notify)
        extra: dict[str, Any] = {}
        if advisory_db is not None:
            extra["advisory_db"] = advisory_db
        driver: Driver
        if here:
            from imagegate.drivers.local import LocalDriver

            driver = LocalDriver(python)
        else:
            from imagegate.drivers.docker import DockerDriver

            driver = DockerDriver(memory=memory, pull=pull, notify=notify)
        opts = runner.RunOptions(
            pipeline=pipeline,
            modules=module,
            out=out,
            timeout=timeout,
            source=source,
            expect_config=expect_config,
            extra=extra,
        )
        if threading_main():
            signal.signal(signal.SIGTERM, _sigterm)
        silent = quiet or fmt is Format.json
        err_console = Console(stderr=True, highlight=False)
        bars = LayerBars(err_console) if not silent and err_console.is_terminal else None
        if bars is not None:
            opts.extra["layer_progress"] = bars
        with contextlib.nullcontext() if silent else StageView(console=err_console) as view:
            if view is not None:
                opts.on_event = view.event
            try:
                record = runner.run(image or "local", driver, opts, notify)
            finally:
                if bars is not None:
                    bars.close()
        signed = _sign.sign(record, signing_key, notify)
        if signed is not None and attach:
            from imagegate.attest import attach as attest_attach

            done = attest_attach.attach_file(signed.dsse_path, image, insecure=insecure)
            notify(f"attached to {done.reference} ({done.tag}, {done.layers} attestation(s))")
    except ImagegateError as e:
        raise fail(e) from e
    except KeyboardInterrupt:
        print("imagegate: interrupted; the container was removed", file=sys.stderr)
        raise typer.Exit(130) from None
    try:
        used_stdout = formats.write_reports(record, reports)
    except OSError as e:
        raise fail(UsageError(f"writing a report: {e}", hint="check the --report paths")) from e
    if fmt is Format.json:
        # The statement as written beside the evidence (and signed), byte for byte.
        sys.stdout.write((Path(record.attempt_dir) / "statement.json").read_text())
    else:
        # A machine format on stdout keeps stdout to itself: the table goes to stderr then.
        console_report.render(record, Console(stderr=True) if used_stdout else Console())
    raise typer.Exit(exit_code(record.verdict, require_complete=require_complete))


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
