"""Commands: report (re-render stored evidence), audit (an inventory of images and mirrors).
Parse, call imagegate.report and imagegate.usecases.audit, render."""

import enum
from functools import partial
from pathlib import Path

import typer
from typer import Argument

from imagegate.cli import _accept as o
from imagegate.cli import _app
from imagegate.cli._app import Option, app


class ReportFormat(str, enum.Enum):
    table = "table"
    json = "json"
    junit = "junit"
    markdown = "markdown"
    html = "html"
    sarif = "sarif"
    github = "github"


@app.command(
    epilog="Examples:\n\n"
    "  imagegate report imagegate-runs/sha256-8b57.../20261129T160643.646Z-2046e2\n\n"
    "  imagegate report ATTEMPT_DIR --format junit -o junit.xml\n\n"
    "  imagegate report ATTEMPT_DIR --format html -o report.html\n\n"
    "  imagegate report imagegate-runs/sha256-8b57... -f markdown   # latest attempt\n\n"
    "  imagegate report ATTEMPT_DIR --key gate.pub   # check the signature too\n\n"
    "Every format is rendered from the statement as signed (attestation.dsse.json's payload) and "
    "says whether the signature was checked (--key), and flags a statement.json or an evidence "
    "file that differs from what was signed, or an attempt that was never signed. html is one "
    "self-contained page; sarif is SARIF 2.1.0 for code-scanning pages (a result per broken requirement, missing module and advisory, each at a file of the repository: --sarif-location, else the pipeline file, else the attempt's statement.json); json is the signed statement (statement.json where the attempt is "
    "unsigned), the flags on stderr; github is the GitHub Actions workflow commands. "
    "Exit codes: 0 written; 1 written, but statement.json or an evidence file differs from what "
    "was signed, the envelope cannot be read, or --key does not verify it (or the attempt is "
    "unsigned); 3 not an attempt folder, a key that cannot be read, or the file cannot be written."
)
def report(
    attempt: Path = Argument(
        ..., help="An attempt folder (OUT/<image>/<attempt>), or an image folder for its latest attempt."
    ),
    fmt: ReportFormat = Option(
        ReportFormat.table, "--format", "-f", help="table, json, junit, markdown, html, sarif or github."
    ),
    output: Path | None = Option(None, "--output", "-o", help="Write to this file instead of stdout."),
    key: Path | None = _app.ATTESTATION_KEY,
    sarif_location: str | None = Option(
        None,
        "--sarif-location",
        metavar="PATH",
        help="sarif: the repository file every result points at (e.g. the Dockerfile), relative to the root; default: the pipeline file, else the attempt's statement.json.",
    ),
) -> None:
    """Render a report again from an attempt's signed statement, in any format."""
    from imagegate.attest.keys import load_public_key
    from imagegate.errors import UsageError
    from imagegate.report.formats import rerender

    if sarif_location is not None and fmt is not ReportFormat.sarif:
        raise UsageError("--sarif-location is for --format sarif", hint="add -f sarif, or leave it out")
    provenance = rerender(
        attempt, fmt.value, output, load_public_key(key) if key else None, sarif_location=sarif_location
    )
    raise typer.Exit(0 if provenance.ok else 1)


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
    "  mirror_sets: [{mirror: mirror.example/vllm/*, official: docker.io/vllm/{repository}:{tag}}]\n\n"
    "A mirror set is every tag of a repository (or of every repository the catalog lists under "
    "NAMESPACE/*; `tags:` names or patterns them), each compared with its official image. A blob "
    "several images share is read once; one this machine verified before is not read again "
    "(--no-cache reads it), so an interrupted audit run again reads only what it had not read.\n\n"
    "Exit code: the worst item's: 3 input error, then 1 rejected or different, then 2 could not "
    "decide, else 0.",
)
def audit(
    inventory: Path = Argument(..., help="Inventory YAML: images with pipelines, (official, mirror) pairs."),
    out: Path = Option(Path("imagegate-runs"), "--out", "-o", metavar="FOLDER", help=_app.EVIDENCE_HELP),
    jobs: int = Option(4, "--jobs", "-j", min=1, max=64, help="Items checked at the same time."),
    json_out: Path | None = Option(
        None, "--json", help="Also write the JSON report here ('-': stdout, alone)."
    ),
    platform: str | None = _app.PLATFORM,
    memory: str = o.MEMORY,
    verbose: int = o.VERBOSE,
    quiet: bool = _app.QUIET,
    timeout: float = _app.TIMEOUT,
    key: list[str] = o.KEY,
    no_sign: bool = o.NO_SIGN,
    cache_dir: str | None = _app.CACHE_DIR,
    no_cache: bool = _app.NO_CACHE,
) -> None:
    """Audit many images and mirror copies at once: one table, one JSON report, the worst exit code."""
    from imagegate._support.sizes import parse_memory
    from imagegate.cli import _checks
    from imagegate.drivers.docker import DockerDriver
    from imagegate.report import batch as batch_view
    from imagegate.report.console import make_console
    from imagegate.report.progress import ItemsBar, setup_logging
    from imagegate.usecases import audit as batch  # lazy: keeps CLI start-up fast

    parse_memory(memory)  # before any item runs: a typo is one error, not one per image
    err = make_console(stderr=True)
    # The key (and its passphrase) before any item runs: each image's attempt is signed.
    outputs = _checks.outputs(key=o.signing_key(key), no_sign=no_sign, warn=o.warn)
    setup_logging(verbose, quiet)
    items = batch.load(inventory)
    with (
        _app.within(timeout),
        _app.known_blobs(cache_dir, no_cache) as known,
        ItemsBar(len(items), "audit", quiet=quiet, console=err) as bar,
    ):
        result = batch.run_batch(
            items,
            batch.BatchOptions(
                out=out, jobs=jobs, platform=platform, outputs=outputs, known=known, progress=bar
            ),
            partial(DockerDriver, memory=memory),
            lambda r: bar.advance(f"{r.kind} {r.name}: {r.outcome}"),
            bar.more,
        )
    # A machine format on stdout keeps stdout to itself: the table goes to stderr then.
    batch_view.render(result, err if batch_view.write_json(result, json_out) else make_console())
    raise typer.Exit(result.exit_code)
