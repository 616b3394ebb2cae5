"""Command: run."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from imagegate import accept, runner
from imagegate.cli import _accept as o
from imagegate.cli._app import Format, app
from imagegate.drivers.interface import Driver
from imagegate.drivers.select import DriverName, driver_name, needs_engine
from imagegate.errors import UsageError
from imagegate.gpus import parse as gpus_parse
from imagegate.report.progress import setup_logging

_MEMORY = o.opt("8g", "--memory", help="Container memory limit.")
_JOBS = o.opt(
    None,
    "--jobs",
    "-j",
    metavar="N",
    help="Groups of in-image stages run at once, a container each (default: the CPU count).",
)
_SKIP = o.opt(
    [],
    "--skip",
    metavar="ID",
    help="Leave stage ID out (repeatable): SKIPPED, and so are the stages that need it.",
)
_PULL = o.opt(
    "missing", "--pull", help="Pull IMAGE through the engine: missing (as docker run), never, always."
)
_HERE = o.opt(False, "--here", help="Run in this environment: the same as --driver here.")
_DRIVER = o.opt(
    None,
    "--driver",
    metavar="NAME",
    help="Where the probes run: docker (default; DOCKER_HOST is honoured), podman, rootfs (no "
    "engine: IMAGE from any transport, layers verified while unpacked, run under bubblewrap), here.",
)
_GPUS = o.opt(
    None,
    "--gpus",
    help="Give the probes GPUs: all, a count, or ids (0,1); the run starts with the GPU node "
    "check. Default: none (GPUs hidden).",
)
_PYTHON = o.opt(None, "--python", help="With --here: the interpreter to run the probes with.")
_SOURCE = o.opt(None, "--source", help="For the layers stage: read the image from this transport.")
_EXPECT_CONFIG = o.opt(None, "--expect-config", help="For the layers stage: the official config digest.")
_VERBOSE = o.opt(0, "--verbose", "-v", count=True, help="More detail on stderr (-v, -vv).")


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
    pipeline: str = o.PIPELINE,
    module: list[str] = o.MODULES,
    out: Path = o.OUT,
    fmt: Format = o.FMT,
    require_complete: bool = o.REQUIRE_COMPLETE,
    timeout: float = o.TIMEOUT,
    memory: str = _MEMORY,
    jobs: int = _JOBS,
    skip: list[str] = _SKIP,
    pull: str = _PULL,
    here: bool = _HERE,
    driver_choice: str = _DRIVER,
    gpus: str = _GPUS,
    python: str = _PYTHON,
    source: str = _SOURCE,
    expect_config: str = _EXPECT_CONFIG,
    report: list[str] = o.REPORT,
    advisory_db: Path = o.ADVISORY_DB,
    key: str = o.KEY,
    no_sign: bool = o.NO_SIGN,
    attach: bool = o.ATTACH,
    insecure: bool = o.INSECURE,
    quiet: bool = o.QUIET,
    verbose: int = _VERBOSE,
) -> None:
    """Run a pipeline of probes against IMAGE and give a verdict with its evidence."""
    setup_logging(verbose, quiet)
    silent = quiet or fmt is Format.json
    notify = o.notifier(silent)
    driver: Driver | None = None
    try:
        name = driver_name(driver_choice, here)
        _check_input(image, name, jobs, timeout)
        outputs = o.outputs(
            reports=report, fmt=fmt, key=key, no_sign=no_sign, notify=notify,
            attach=attach, insecure=insecure, reference=image,
        )  # fmt: skip
        gpu_request = gpus_parse(gpus)
        opts = runner.RunOptions(
            pipeline=pipeline, modules=module, skip=skip, jobs=jobs or os.cpu_count() or 1, out=out,
            timeout=timeout, source=source, expect_config=expect_config, advisory_db=advisory_db,
            gpus=gpu_request.spec if gpu_request else None,
        )  # fmt: skip
        prep = runner.prepare(opts)
        driver = accept.driver_for(
            here=False, name=name, python=python, memory=memory, pull=pull, gpus=gpu_request,
            notify=notify, expect_config=expect_config, insecure=insecure,
        )  # fmt: skip
        with o.progress(opts, silent):
            observer = runner.DriverObserver(driver, image, opts, notify)
            done = accept.accept(prep, observer, out, outputs, notify)
    except KeyboardInterrupt:
        raise o.interrupted(driver) from None
    raise o.finish(done, fmt, require_complete, quiet)


def _check_input(image: str | None, name: DriverName | None, jobs: int | None, timeout: float | None) -> None:
    """IMAGE and DOCKER_HOST are checked before the engine is asked anything."""
    if name is not DriverName.here and image is None:
        raise UsageError(
            "no IMAGE given", hint="imagegate run IMAGE -p PIPELINE, or --here for this environment"
        )
    if needs_engine(name):
        from imagegate.enginehost import check_docker_host
        from imagegate.oci.reference import check_image

        assert image is not None
        check_image(image)
        check_docker_host(os.environ)
    o.check_timeout(timeout)
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs {jobs}: must be 1 or more")
