"""Commands: cache unpack|list|prune|remove (the root cache). Parse, call imagegate.rootfs,
render, map errors."""

from __future__ import annotations

import dataclasses
import datetime
import json

import typer

from imagegate.cli._app import Format, app, report_error
from imagegate.cli.oci import (
    _INSECURE,
    _MAX_LAYER,
    _PLATFORM,
    _QUIET,
    _SOURCES_HELP,
    _open,
    _session,
    _size,
)
from imagegate.errors import ImagegateError, UsageError
from imagegate.model import EXIT_ACCEPTED
from imagegate.oci.digest import check_digest
from imagegate.report.console import make_console

cache_app = typer.Typer(
    help=(
        "Image roots unpacked without an engine (every layer verified while it is written), kept "
        "by chainID for later runs, least recently used evicted first.\n\n"
        "Examples:\n\n  imagegate cache unpack docker://mirror.example/app:1 --expect-config sha256:<digest>\n\n"
        "  imagegate cache list\n\n  imagegate cache prune --max-size 50GiB"
    ),
    no_args_is_help=True,
)
app.add_typer(cache_app, name="cache")

_DIR = typer.Option(
    None,
    "--cache-dir",
    envvar="IMAGEGATE_CACHE",
    help="The root cache folder [$XDG_CACHE_HOME/imagegate/roots].",
)
_MAX_SIZE = typer.Option(
    "100GiB",
    "--max-size",
    envvar="IMAGEGATE_CACHE_MAX",
    help="Bound on the cache: older roots are evicted past it.",
)
_FORMAT = typer.Option(Format.table, "--format", help="table, or json on stdout.")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


@cache_app.command(
    "unpack",
    epilog="Examples:\n\n  imagegate cache unpack docker://mirror.example/app:1 --expect-config sha256:<digest>\n\n"
    "  imagegate cache unpack docker-daemon:app:1 --cache-dir /var/cache/imagegate --format json",
)
def unpack(
    source: str = typer.Argument(..., help=_SOURCES_HELP),
    expect_config: str = typer.Option(
        None, "--expect-config", help="The official config digest (sha256:...)."
    ),
    platform: str = _PLATFORM,
    insecure: bool = _INSECURE,
    cache_dir: str = _DIR,
    max_size: str = _MAX_SIZE,
    max_layer_size: str = _MAX_LAYER,
    max_image_size: str = typer.Option(
        "256GiB", "--max-image-size", help="Stop when all layers together decompress past this."
    ),
    fmt: Format = _FORMAT,
    quiet: bool = _QUIET,
) -> None:
    """Verify every layer while unpacking it into the cache; print the root's folder.
    Exit 1 when a layer is not the declared bytes or holds a hostile entry (nothing kept)."""
    from imagegate.rootfs import Limits, RootCache, materialize

    if expect_config:
        check_digest(expect_config, what="--expect-config")
    limits = Limits(max_layer_bytes=_size(max_layer_size), max_total_bytes=_size(max_image_size))
    src = _open(source, platform, insecure)
    with RootCache(cache_dir, _size(max_size)) as cache, _session(quiet, src) as sink:
        root = materialize(src, cache=cache, expect_config=expect_config, limits=limits, progress=sink)
    if fmt is Format.json:
        doc = {
            "path": root.path,
            "chain_id": root.chain_id,
            "config_digest": root.config_digest,
            "manifest_digest": root.manifest_digest,
            "cached": root.cached,
            "size": root.size,
            "not_applied": list(root.not_applied),
            "verification": root.report.to_dict(),
        }
        print(json.dumps(doc, indent=2))
    else:
        out = make_console(soft_wrap=True, highlight=False, markup=False)
        how = (
            "reused from the cache"
            if root.cached
            else f"{len(root.report.layers)} layers verified and unpacked"
        )
        out.print(
            f"{root.path}\n  chainID {root.chain_id}, config {root.config_digest}, {_gib(root.size)}: {how}"
        )
        for note in root.not_applied:
            out.print(f"  not applied: {note}")
    raise typer.Exit(EXIT_ACCEPTED)


@cache_app.command(
    "list", epilog="Examples:\n\n  imagegate cache list\n\n  imagegate cache list --format json"
)
def list_roots(cache_dir: str = _DIR, fmt: Format = _FORMAT) -> None:
    """The cached roots, least recently used first."""
    from imagegate.rootfs import RootCache

    with RootCache(cache_dir) as cache:
        entries = sorted(cache.entries(), key=lambda e: e.last_used)
        folder = cache.folder
    if fmt is Format.json:
        print(json.dumps({"folder": folder, "roots": [dataclasses.asdict(e) for e in entries]}, indent=2))
        return
    out = make_console(soft_wrap=True, highlight=False, markup=False)
    for entry in entries:
        used = datetime.datetime.fromtimestamp(entry.last_used).isoformat(timespec="seconds")
        busy = "  (in use)" if entry.in_use else ""
        out.print(f"{entry.chain_id}  {_gib(entry.size)}  used {used}  from {entry.unpacked_from}{busy}")
    total = sum(x.size for x in entries)
    out.print(f"{len(entries)} roots, {_gib(total)} in {folder}")


@cache_app.command(
    "prune", epilog="Examples:\n\n  imagegate cache prune --max-size 50GiB\n\n  imagegate cache prune --all"
)
def prune(
    cache_dir: str = _DIR,
    max_size: str = typer.Option(
        None,
        "--max-size",
        envvar="IMAGEGATE_CACHE_MAX",
        help="Evict until the cache holds at most this [100GiB].",
    ),
    everything: bool = typer.Option(False, "--all", help="Remove every root no run is using."),
) -> None:
    """Evict least recently used roots (and what interrupted runs left behind)."""
    from imagegate.rootfs import RootCache

    limit = 0 if everything else _size(max_size or "100GiB")
    with RootCache(cache_dir) as cache:
        removed = cache.prune(limit)
        left = cache.total_bytes()
    for entry in removed:
        print(f"removed {entry.chain_id} ({_gib(entry.size)})")
    print(f"{len(removed)} roots removed; {_gib(left)} left")


@cache_app.command("remove", epilog="Examples:\n\n  imagegate cache remove sha256:<chainID>")
def remove(
    chain_ids: list[str] = typer.Argument(..., help="chainIDs (sha256:...) as `cache list` shows them."),
    cache_dir: str = _DIR,
) -> None:
    """Remove roots by chainID. Exit 3 when one is absent or in use (the others are removed)."""
    from imagegate.rootfs import RootCache

    problems: list[ImagegateError] = []
    with RootCache(cache_dir) as cache:
        for c in chain_ids:
            try:
                if cache.remove(check_digest(c, what="chainID")):
                    print(f"removed {c}")
                else:
                    problems.append(_absent(c, cache.folder))
            except ImagegateError as e:
                problems.append(e)
    for p in problems[:-1]:
        report_error(p)
    if problems:
        raise problems[-1]


def _absent(chain_id: str, folder: str) -> ImagegateError:
    return UsageError(
        f"no root {chain_id} in the cache {folder}", hint="`imagegate cache list` shows the chainIDs"
    )
