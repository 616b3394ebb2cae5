"""Commands: report (re-render stored evidence), audit (an inventory of images and mirrors)."""

from __future__ import annotations

import enum
import io
import json
import sys
from pathlib import Path

import typer
from rich.console import Console

from imagegate.cli._app import app
from imagegate.drivers.interface import Driver
from imagegate.errors import UsageError
from imagegate.model import RunRecord
from imagegate.report import batch as batch_view
from imagegate.report import console as console_report
from imagegate.report import formats, load
from imagegate.report.progress import ItemsBar, setup_logging

_VERBOSE_HELP = "More logs on stderr: -v progress, -vv debug."


class ReportFormat(str, enum.Enum):
    table = "table"
    json = "json"
    junit = "junit"
    markdown = "markdown"
    html = "html"


@app.command(
    epilog="Examples:\n\n"
    "  imagegate report imagegate-runs/sha256-8b57.../20261129T160643.646Z-2046e2\n\n"
    "  imagegate report ATTEMPT_DIR --format junit -o junit.xml\n\n"
    "  imagegate report ATTEMPT_DIR --format html -o report.html\n\n"
    "  imagegate report imagegate-runs/sha256-8b57... -f markdown   # latest attempt\n\n"
    "html is one self-contained page; json is the stored statement exactly as the run wrote it. "
    "Exit codes: 0 written, 3 not an attempt folder or the file cannot be written."
)
def report(
    attempt: Path = typer.Argument(
        ..., help="An attempt folder (OUT/<image>/<attempt>), or an image folder for its latest attempt."
    ),
    fmt: ReportFormat = typer.Option(
        ReportFormat.table, "--format", "-f", help="table, json, junit, markdown or html."
    ),
    output: Path = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout."),
) -> None:
    """Render a report again from an attempt's stored evidence, in any format."""
    try:
        folder = load.resolve_attempt(attempt)
        if fmt is ReportFormat.json:
            text = load.statement_text(folder)
        else:
            record = load.load_attempt(folder)
            if fmt is ReportFormat.table and output is None:
                console_report.render(record, console_report.make_console())
                return
            if fmt is ReportFormat.table:
                text = _table(record)
            else:
                text = formats.render(record, fmt.value, output.parent if output else None)
        if output is None:
            sys.stdout.write(text)
        else:
            formats.write_outside_evidence(output, text)
    except OSError as e:
        raise UsageError(f"writing {output}: {e.strerror}", hint="check the --output path") from e


def _table(record: RunRecord) -> str:
    console = Console(record=True, width=160, file=io.StringIO())
    console_report.render(record, console)
    return console.export_text()


@app.command(
    epilog="Examples:\n\n"
    "  imagegate audit inventory.yaml\n\n"
    "  imagegate audit inventory.yaml --jobs 8 --json audit.json -o imagegate-runs\n\n"
    "  imagegate audit inventory.yaml --json - > audit.json   # the table goes to stderr\n\n"
    "An inventory (relative paths are relative to it):\n\n"
    "  apiVersion: imagegate/v1\n\n"
    "  kind: Inventory\n\n"
    "  images: [{image: myorg/vllm:0.11, pipeline: vllm}, {image: app:latest, modules: [numpy]}]\n\n"
    "  mirrors: [{official: docker.io/vllm/vllm-openai:v0.11.0, mirror: mirror.example/vllm:0.11}]\n\n"
    "Exit code: the worst item's: 3 input error, then 1 rejected or different, then 2 could not "
    "decide, else 0.",
)
def audit(
    inventory: Path = typer.Argument(
        ..., help="Inventory YAML: images with pipelines, (official, mirror) pairs."
    ),
    out: Path = typer.Option(
        Path("imagegate-runs"), "--out", "-o", help="Evidence folder of the image runs."
    ),
    jobs: int = typer.Option(4, "--jobs", "-j", min=1, max=64, help="Items checked at the same time."),
    json_out: Path = typer.Option(
        None, "--json", help="Also write the JSON report here ('-': stdout, alone)."
    ),
    platform: str = typer.Option(None, "--platform", help="os/arch[/variant] for the mirror pairs."),
    memory: str = typer.Option("8g", "--memory", help="Container memory limit of each image run."),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help=_VERBOSE_HELP),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="No progress, no logs; the table and errors only."
    ),
) -> None:
    """Audit many images and mirror copies at once: one table, one JSON report, the worst exit code."""
    err = console_report.make_console(stderr=True)
    setup_logging(verbose, quiet)
    to_stdout = json_out is not None and str(json_out) == "-"
    try:
        from imagegate import batch  # lazy: keeps CLI start-up fast

        inv = batch.load(inventory)

        def docker_driver() -> Driver:
            from imagegate.drivers.docker import DockerDriver

            return DockerDriver(memory=memory)

        opts = batch.BatchOptions(out=out, jobs=jobs, platform=platform)
        total = len(inv.image_list.images) + len(inv.image_list.mirrors)
        with ItemsBar(total, "audit", quiet=quiet, console=err) as bar:
            result = batch.run_batch(
                inv,
                opts,
                docker_driver,
                lambda r: bar.advance(f"{r.kind} {r.name}: {r.outcome}"),
            )
        text = json.dumps(batch.to_json(result), indent=2, sort_keys=True) + "\n"
        if to_stdout:
            sys.stdout.write(text)
        elif json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(text, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"writing {json_out}: {e.strerror}", hint="check the --json path") from e
    # A machine format on stdout keeps stdout to itself: the table goes to stderr then.
    batch_view.render(result, err if to_stdout else console_report.make_console())
    raise typer.Exit(result.exit_code)
