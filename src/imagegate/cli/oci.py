"""Commands: layers, compare (image identity). Parse, call imagegate.oci, render, map errors."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from imagegate.cli._app import Format, app
from imagegate.errors import UsageError
from imagegate.model import EXIT_ACCEPTED, EXIT_REJECTED
from imagegate.oci.digest import check_digest
from imagegate.report import console_oci
from imagegate.report.console import make_console
from imagegate.report.progress import LayerBars, WaitLines

if TYPE_CHECKING:  # the OCI modules load when a command runs: CLI start-up stays fast
    from imagegate.oci.sources.interface import Source
    from imagegate.oci.verify import Progress as ProgressSink


_SOURCES_HELP = (
    "docker://REF or a bare REF (a registry), docker-daemon:REF (the local engine, DOCKER_HOST "
    "honoured), docker-archive:PATH[:NAME:TAG] (docker save), oci:DIR[:TAG] (OCI layout)."
)
# Options both commands take (typer reads these defaults; sharing them keeps the help identical).
_PLATFORM = typer.Option(None, "--platform", help="os/arch[/variant] to pick from an index [linux/amd64].")
_INSECURE = typer.Option(False, "--insecure", help="Registry: skip TLS verification, fall back to HTTP.")
_JOBS = typer.Option(None, "--jobs", "-j", min=1, max=64, help="Layers verified in parallel.")
_MAX_LAYER = typer.Option(
    "64GiB", "--max-layer-size", help="Stop a layer that decompresses past this (decompression bomb)."
)
_QUIET = typer.Option(False, "--quiet", "-q", help="No progress bars.")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if not m:
        raise UsageError(f"invalid size {text!r}", hint="write it like 64GiB, 500M or 1048576")
    return int(m.group(1)) * _UNITS[m.group(2)]


@contextmanager
def _session(quiet: bool, *sources: Source) -> Iterator[ProgressSink]:
    """Progress bars on stderr while it is a terminal (and not --quiet); sources closed after."""
    from imagegate.oci.sources.interface import ImageSource
    from imagegate.oci.verify import NoProgress

    err = Console(stderr=True, highlight=False, markup=False)
    bars = None if quiet or not err.is_terminal else LayerBars(err)
    try:
        if bars is not None:
            bars.progress.start()
        yield bars or (NoProgress() if quiet else WaitLines(err))
    finally:
        if bars is not None:
            bars.progress.stop()
        for src in sources:
            if isinstance(src, ImageSource):
                src.close()


def _open(spec: str, platform: str | None, insecure: bool) -> Source:
    from imagegate.oci.transports import open_source

    return open_source(spec, platform=platform, insecure=insecure)


@app.command(
    epilog="Examples:\n\n"
    "  imagegate layers myorg/vllm:0.11\n\n"
    "  imagegate layers docker-daemon:myorg/vllm:0.11 --expect-config sha256:4f0c...\n\n"
    "  imagegate layers docker-archive:vllm.tar --format json > layers.json\n\n"
    "  imagegate layers oci:./layout:0.11 --platform linux/arm64\n\n"
    "  imagegate layers 127.0.0.1:5000/team/app:1 --jobs 8\n\n"
    "Exit codes: 0 every layer verified, 1 a mismatch (or not the expected config), "
    "2 the image could not be read, 3 usage or input error."
)
def layers(
    source: str = typer.Argument(..., help=_SOURCES_HELP),
    expect_config: str = typer.Option(
        None, "--expect-config", help="The official config digest (sha256:...)."
    ),
    platform: str = _PLATFORM,
    insecure: bool = _INSECURE,
    jobs: int = _JOBS,
    fmt: Format = typer.Option(Format.table, "--format", help="table, or json on stdout."),
    max_layer_size: str = _MAX_LAYER,
    quiet: bool = _QUIET,
) -> None:
    """Verify an image's config digest, every layer's digest and size, and every diffID."""
    if expect_config:
        check_digest(expect_config, what="--expect-config")
    limit = _size(max_layer_size)
    src = _open(source, platform, insecure)
    with _session(quiet, src) as sink:
        from imagegate.oci.verify import verify_source

        report = verify_source(
            src, expect_config=expect_config, jobs=jobs, max_uncompressed=limit, progress=sink
        )
    if fmt is Format.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        console_oci.render_verify(report, make_console(soft_wrap=True, highlight=False, markup=False))
    raise typer.Exit(EXIT_ACCEPTED if report.ok else EXIT_REJECTED)


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=str)


@app.command(
    name="compare",
    epilog="Examples:\n\n"
    "  imagegate compare docker.io/vllm/vllm-openai:v0.11.0 mirror.example/vllm/vllm-openai:v0.11.0\n\n"
    "  imagegate compare docker-archive:official.tar 127.0.0.1:5000/vllm:0.11 --deep\n\n"
    "Says exactly one of: identical (same manifest digest; no blob read unless --deep); same "
    "content (config digest equal, every diffID verified, compression may differ); different image "
    "(with the layers and config fields that differ); corrupt (a blob does not match).\n\n"
    "Exit codes: 0 same content, 1 different or corrupt, 2 could not decide, 3 usage error.",
)
def compare_cmd(
    official: str = typer.Argument(..., help="The official image. " + _SOURCES_HELP),
    mirror: str = typer.Argument(..., help="The copy to audit, in the same forms."),
    deep: bool = typer.Option(
        False, "--deep", help="Read and verify every blob of both images, even if identical."
    ),
    platform: str = _PLATFORM,
    insecure: bool = _INSECURE,
    jobs: int = _JOBS,
    fmt: Format = typer.Option(Format.table, "--format", help="table (text), or json on stdout."),
    max_layer_size: str = _MAX_LAYER,
    quiet: bool = _QUIET,
) -> None:
    """Is MIRROR the same content as OFFICIAL? Exact about what differs."""
    limit = _size(max_layer_size)
    a = _open(official, platform, insecure)
    b = _open(mirror, platform, insecure)
    with _session(quiet, a, b) as sink:
        from imagegate.oci.compare import compare

        result = compare(a, b, deep=deep, jobs=jobs, max_uncompressed=limit, progress=sink)
    if fmt is Format.json:
        print(_json(result.to_dict()))
    else:
        console_oci.render_compare(result, make_console(soft_wrap=True, highlight=False, markup=False))
    raise typer.Exit(result.exit_code)
