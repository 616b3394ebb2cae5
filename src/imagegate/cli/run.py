"""Command: run."""

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

from imagegate.cli import _accept as o
from imagegate.cli._app import CACHE_DIR, NO_CACHE, Format, Option, app
from imagegate.domain import servemodel as modelpath
from imagegate.domain.gpus import GpuRequest
from imagegate.domain.gpus import parse as gpus_parse
from imagegate.errors import UsageError

if TYPE_CHECKING:  # imported where used: `run --help` never loads the pipeline models, the drivers
    from imagegate.drivers.interface import Driver
    from imagegate.drivers.select import DriverName
    from imagegate.usecases import accept, runner
    from imagegate.usecases import index as multiplatform
    from imagegate.usecases.reuse_attempt import ReusePolicy


@dataclass(frozen=True)
class Placement:
    """Where and how the probes run: the driver, its limits, the stages taken and the deadline."""

    timeout: float | None = o.TIMEOUT
    memory: str = o.MEMORY
    jobs: int | None = Option(
        None,
        "--jobs",
        "-j",
        metavar="N",
        help="Groups of in-image stages run at once, a container each (default: the CPU count).",
    )
    skip: list[str] = Option(
        [],
        "--skip",
        metavar="ID",
        help="Leave stage ID out (repeatable): it does not run, so it is DEFERRED (never PASS; `complete` runs it), and the stages that need it SKIPPED.",
    )
    fail_fast: bool = Option(
        False,
        "--fail-fast",
        help="Once a stage FAILs or cannot run (no verdict can accept the image), stop the stages still "
        "running: SKIPPED, named so. Default: every stage runs, so that every failure is listed.",
    )
    pull: str = Option("missing", "--pull", help=o.PULL_HELP)
    here: bool = Option(False, "--here", help="Run in this environment: the same as --driver here.")
    driver: str | None = o.DRIVER
    gpus: str | None = o.GPUS
    python: str | None = o.PYTHON
    sign_unisolated: bool = o.SIGN_UNISOLATED
    source: str | None = o.SOURCE
    expect_config: str | None = o.EXPECT_CONFIG
    cache_dir: str | None = CACHE_DIR
    no_cache: bool = NO_CACHE
    model: str | None = o.MODEL
    reuse: bool = Option(
        False,
        "--reuse",
        help="Answer from an earlier attempt in --out of this very run (the image digest IMAGE names now, "
        "the plan, probes bundle, imagegate version, driver and inputs), signed with this run's key and "
        "verifying with every evidence file: a new attempt linking it, its stages' times kept. Never for "
        "ERROR, never past --reuse-within, never for a plan with the vulnerability audit or the GPU node check.",
    )
    reuse_within: str = Option(
        "24h",
        "--reuse-within",
        metavar="DURATION",
        help="With --reuse: the oldest attempt reused (90s, 30m, 24h).",
    )
    all_platforms: bool = Option(
        False,
        "--all-platforms",
        help="IMAGE names a multi-platform index: run each platform manifest this host runs, by digest, "
        "then sign the statement about the index (as imagegate index), naming the platforms not run.",
    )

    def run_options(
        self, a: o.Accepting, gpu: GpuRequest | None, model: str | None = None
    ) -> "runner.RunOptions":
        return a.run_options(
            model=model,
            source=self.source,
            expect_config=self.expect_config,
            gpus=gpu.spec if gpu else None,
            skip=self.skip,
            jobs=self.jobs or os.cpu_count() or 1,
            fail_fast=self.fail_fast,
            cache_dir=self.cache_dir,
            no_cache=self.no_cache,
        )

    def reuse_policy(self, outputs: "accept.Outputs") -> "ReusePolicy | None":
        """--reuse, checked before the image is looked at: it needs this run's own signing key."""
        if not self.reuse:
            return None
        from imagegate.pipeline.spec import parse_duration
        from imagegate.usecases.reuse_attempt import ReusePolicy

        try:
            within = parse_duration(self.reuse_within)
        except ValueError as e:
            raise UsageError(f"--reuse-within: {e}") from None
        from imagegate.attest.keys import keyless_key

        if outputs.key is None or keyless_key(outputs.key) is not None:
            raise UsageError(
                "--reuse answers from an attempt signed with this run's key, and this run has "
                + ("none (--no-sign)" if outputs.key is None else "a new one each signature (keyless)"),
                hint="sign with a key (--key PATH), or drop --reuse",
            )
        if self.all_platforms:
            raise UsageError("--reuse is for one image: not with --all-platforms", hint="drop one of them")
        return ReusePolicy(within, outputs.key.public)

    def make_driver(
        self,
        name: "DriverName | None",
        gpu: GpuRequest | None,
        outputs: "accept.Outputs",
        a: o.Accepting,
        notify: o.Notify,
        model: Path | None = None,
    ) -> "Driver":
        from imagegate.cli import _checks
        from imagegate.drivers.select import DriverOptions

        opts = DriverOptions(
            self.memory,
            self.pull,
            notify,
            gpu,
            self.python,
            self.expect_config,
            insecure=a.insecure,
            sign_unisolated=self.sign_unisolated,
            cache_dir=self.cache_dir,
            model=model,
        )
        return _checks.make_driver(name, opts, outputs.key)


@app.command(
    epilog="Examples:\n\n"
    "  imagegate run myorg/vllm:0.11 -p vllm\n\n"
    "  imagegate run app:latest -p python -m numpy -m av --format json > statement.json\n\n"
    "  imagegate run app:latest -p ./my-pipeline.yaml --require-complete\n\n"
    "  imagegate run --here -p python -m requests      # this environment, e.g. inside a Pod\n\n"
    "  imagegate run myorg/vllm:0.11 -p gpu --gpus all  # the GPU node check alone\n\n"
    "  imagegate run docker://mirror.example/vllm:0.11 -p vllm --driver rootfs --expect-config sha256:...\n\n"
    + o.EXIT_CODES[:-1]
    + ", 130 interrupted (SIGINT), 143 terminated (SIGTERM); the container is removed either way."
)
@o.grouped
def run(
    image: str | None = typer.Argument(
        None, help="Image reference or ID in the engine (DOCKER_HOST is honoured)."
    ),
    a: o.Accepting = o.Accepting(),
    p: Placement = Placement(),
    verbose: int = o.VERBOSE,
) -> None:
    """Run a pipeline of probes against IMAGE and give a verdict with its evidence."""
    from imagegate.cli import _checks
    from imagegate.drivers.select import DriverName, driver_name
    from imagegate.report.progress import run_shown, setup_logging
    from imagegate.usecases import accept, runner

    setup_logging(verbose, a.quiet)
    notify = o.notifier(a.silent)
    with o.interrupts():
        name = driver_name(p.driver, p.here)
        _checks.check_run_input(image, name, p.jobs, p.timeout, p.memory, p.expect_config)
        gpu = gpus_parse(p.gpus)
        model = modelpath.check(p.model) if p.model else None
        here = name is DriverName.here
        opts = p.run_options(a, gpu, modelpath.in_sandbox(model, here) if model else None)
        prep = runner.prepare(opts)
        _checks.check_stage_inputs(prep, p.expect_config, rootfs=name is DriverName.rootfs)
        if p.all_platforms:
            _all_platforms(image, a, p, name, gpu, model, opts, prep, notify)
        with accept.within(prep, p.timeout):  # a signer's server (Vault, Fulcio) too: by the deadline
            outputs = a.outputs(image, notify)
            driver = p.make_driver(name, gpu, outputs, a, notify, model)
            _checks.check_rootfs_reference(image, name)
            with run_shown(a.silent) as display:
                observer = runner.DriverObserver(driver, image, opts, notify, display)
                request = accept.Request(prep, observer, a.out, outputs, p.reuse_policy(outputs))
                done = accept.accept(request, notify)
    o.finish(done, a.fmt, a.quiet, outputs.key)


def _all_platforms(
    image: str | None,
    a: o.Accepting,
    p: Placement,
    name: "DriverName | None",
    gpu: GpuRequest | None,
    model: Path | None,
    opts: "runner.RunOptions",
    prep: "runner.Prepared",
    notify: o.Notify,
) -> NoReturn:
    """`run --all-platforms`: one run a platform this host runs, then the index statement."""
    from imagegate.cli import _checks
    from imagegate.report.progress import run_shown
    from imagegate.usecases import accept, runner
    from imagegate.usecases import index as multiplatform

    image = _index_reference(image, a, name)
    outputs = a.outputs(image, notify)
    if outputs.key is None:
        raise UsageError(
            "--all-platforms signs the statement about the index: it needs a key", hint="drop --no-sign"
        )

    def run_one(pinned: str) -> accept.Accepted:
        driver = p.make_driver(name, gpu, outputs, a, notify, model)
        with run_shown(a.silent) as display:
            observer = runner.DriverObserver(driver, pinned, opts, notify, display)
            return accept.accept(accept.Request(prep, observer, a.out, outputs), notify)

    with accept.within(prep, p.timeout):
        done, judged = multiplatform.run_platforms(
            image,
            run_one,
            outputs.key,
            a.out,
            attach_it=a.attach,
            insecure=a.insecure,
            require_complete=a.require_complete,
            notify=notify,
            alert=_checks.alert,
        )
    _show_index(done, judged, a.fmt)
    raise typer.Exit(judged.code)


def _show_index(done: "list[accept.Accepted]", judged: "multiplatform.IndexJudged", fmt: Format) -> None:
    """The index statement (--format json), or each platform's table and then the index's."""
    if fmt is Format.json:
        from imagegate.attest.sign import serialize

        sys.stdout.write(serialize(judged.statement).decode() + "\n")
        return
    from imagegate.report import console as console_report
    from imagegate.report import console_attest

    console = console_report.make_console()
    for one in done:
        console_report.render(one.record, console, rejected_by=one.rejected_by)
    console_attest.render_index(judged.statement, judged.folder)


def _index_reference(image: str | None, a: o.Accepting, name: "DriverName | None") -> str:
    """--all-platforms reads the index IMAGE names in its registry, and each platform's run is an
    attempt of its own (no single --report)."""
    from imagegate.attest.attach import names_a_registry
    from imagegate.drivers.select import DriverName

    if image is None or name is DriverName.here or not names_a_registry(image):
        raise UsageError(
            f"--all-platforms: {image or 'no IMAGE'} is not an image in a registry; it reads the index "
            "IMAGE names there",
            hint="name the multi-platform image with its registry, e.g. registry.example/team/app:1",
        )
    if a.report:
        raise UsageError(
            "--all-platforms and --report: each platform's run is an attempt of its own",
            hint="leave --report out and render each attempt later: imagegate report ATTEMPT",
        )
    return image
