"""Command: run."""

from __future__ import annotations

import contextlib
import enum
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from imagegate import runner
from imagegate.cli import _sign
from imagegate.cli._app import app, fail
from imagegate.drivers.interface import Driver
from imagegate.drivers.select import DriverName, DriverOptions, driver_name, make_driver, needs_engine
from imagegate.errors import ImagegateError, UsageError
from imagegate.gpus import parse as gpus_parse
from imagegate.model import exit_code
from imagegate.report import console as console_report
from imagegate.report import formats
from imagegate.report.progress import LayerBars, StageView, WaitLines, setup_logging


class Format(str, enum.Enum):
    table = "table"
    json = "json"


@app.command(
    epilog="Examples:\n\n"
    "  imagegate run myorg/vllm:0.11 -p vllm\n\n"
    "  imagegate run app:latest -p python -m numpy -m av --format json > statement.json\n\n"
    "  imagegate run app:latest -p ./my-pipeline.yaml --require-complete\n\n"
    "  imagegate run --here -p python -m requests      # this environment, e.g. inside a Pod\n\n"
    "  imagegate run myorg/vllm:0.11 -p gpu --gpus all  # the GPU node check alone\n\n"
    "  imagegate run docker://mirror.example/vllm:0.11 -p vllm --driver rootfs --expect-config sha256:...\n\n"
    "Exit codes: 0 accepted (PASS, or a deferred verdict), 1 rejected (FAIL, or deferred with "
    "--require-complete), 2 could not decide (ERROR), 3 usage or input error, 130 interrupted "
    "(SIGINT), 143 terminated (SIGTERM); the container is removed either way."
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
    jobs: int = typer.Option(
        None,
        "--jobs",
        "-j",
        metavar="N",
        help="Groups of in-image stages run at once, a container each (default: the CPU count).",
    ),
    skip: list[str] = typer.Option(
        [],
        "--skip",
        metavar="ID",
        help="Leave stage ID out (repeatable): SKIPPED, and so are the stages that need it.",
    ),
    pull: str = typer.Option(
        "missing", "--pull", help="Pull IMAGE through the engine: missing (as docker run), never, always."
    ),
    here: bool = typer.Option(False, "--here", help="Run in this environment: the same as --driver here."),
    driver_choice: str = typer.Option(
        None,
        "--driver",
        metavar="NAME",
        help="Where the probes run: docker (default; DOCKER_HOST is honoured), podman, rootfs (no "
        "engine: IMAGE from any transport, layers verified while unpacked, run under bubblewrap), here.",
    ),
    gpus: str = typer.Option(
        None,
        "--gpus",
        help="Give the probes GPUs: all, a count, or ids (0,1); the run starts with the GPU node "
        "check. Default: none (GPUs hidden).",
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
    driver: Driver | None = None
    try:
        name = driver_name(driver_choice, here)
        here = name is DriverName.here
        if image is None and not here:
            raise UsageError(
                "no IMAGE given", hint="imagegate run IMAGE -p PIPELINE, or --here for this environment"
            )
        if needs_engine(name):
            _check_engine_input(image)
        if timeout is not None:
            _check_timeout(timeout)
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
        gpu_request = gpus_parse(gpus)
        if gpu_request is not None:
            extra["gpus"] = gpu_request.spec  # the plan starts with the node check
        driver = make_driver(
            name,
            DriverOptions(memory, pull, notify, gpu_request, python, expect_config, insecure=insecure),
        )
        if jobs is not None and jobs < 1:
            raise UsageError(f"--jobs {jobs}: must be 1 or more")
        opts = runner.RunOptions(
            pipeline=pipeline,
            modules=module,
            skip=skip,
            jobs=jobs or os.cpu_count() or 1,
            out=out,
            timeout=timeout,
            source=source,
            expect_config=expect_config,
            extra=extra,
        )
        silent = quiet or fmt is Format.json
        err_console = Console(stderr=True, highlight=False)
        bars = LayerBars(err_console) if not silent and err_console.is_terminal else None
        if not silent and bars is None:
            # A CI log: a line every 15 s while the engine prepares a big image's export.
            opts.extra["layer_progress"] = WaitLines(err_console)
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
        # The entry point's handlers made SIGTERM take this path too; it sets the code (130, 143).
        # Say "removed" only when the engine confirmed it (the driver forgets a container then).
        left = sorted(getattr(driver, "live", ()))
        if left:
            print(
                f"imagegate: interrupted; container {', '.join(left)} may be left: docker rm -f {' '.join(left)}",
                file=sys.stderr,
            )
        else:
            print("imagegate: interrupted; nothing was left running", file=sys.stderr)
        raise typer.Exit(130) from None
    try:
        used_stdout = formats.write_reports(record, reports)
    except OSError as e:
        raise fail(UsageError(f"writing a report: {e}", hint="check the --report paths")) from e
    except ImagegateError as e:
        raise fail(e) from e
    code = exit_code(record.verdict, require_complete=require_complete)
    if fmt is Format.json:
        # The statement as written beside the evidence (and signed), byte for byte.
        sys.stdout.write((Path(record.attempt_dir) / "statement.json").read_text())
        if not quiet:  # stdout is the statement's alone; where the evidence went still matters
            print(f"imagegate: evidence: {record.attempt_dir}", file=sys.stderr)
    else:
        # A machine format on stdout keeps stdout to itself: the table goes to stderr then.
        rejected_by = "--require-complete" if code != exit_code(record.verdict) else None
        console_report.render(
            record, console_report.make_console(stderr=used_stdout), rejected_by=rejected_by
        )
    raise typer.Exit(code)


def _check_engine_input(image: str) -> None:
    """IMAGE and DOCKER_HOST are checked before the engine is asked anything."""
    import os

    from imagegate.enginehost import check_docker_host
    from imagegate.oci.reference import check_image

    check_image(image)
    check_docker_host(os.environ)


def _check_timeout(seconds: float) -> None:
    from imagegate.pipeline.model import check_duration

    try:
        check_duration(seconds)
    except ValueError as e:
        raise UsageError(f"--timeout: {e}", hint="give seconds, e.g. --timeout 1800") from e
