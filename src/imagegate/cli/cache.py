"""Commands: cache unpack|list|prune|remove (the root cache). Parse, call imagegate.rootfs,
render."""

from functools import partial

import typer
from typer import Argument

from imagegate.cli import _app
from imagegate.cli._app import Format, Option, app, report_error, show

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

_DIR = _app.CACHE_DIR
_MAX_SIZE_ENV = "IMAGEGATE_CACHE_MAX"
_MAX_SIZE = Option(
    "100GiB", "--max-size", envvar=_MAX_SIZE_ENV, help="Bound on the cache: older roots are evicted past it."
)


@cache_app.command(
    "unpack",
    epilog="Examples:\n\n  imagegate cache unpack docker://mirror.example/app:1 --expect-config sha256:<digest>\n\n"
    "  imagegate cache unpack docker-daemon:app:1 --cache-dir /var/cache/imagegate --format json",
)
def unpack(
    source: str = _app.SOURCE,
    expect_config: str | None = _app.EXPECT_CONFIG,
    platform: str | None = _app.PLATFORM,
    insecure: bool = _app.INSECURE,
    cache_dir: str | None = _DIR,
    max_size: str = _MAX_SIZE,
    max_layer_size: str = _app.MAX_LAYER,
    max_image_size: str = Option(
        "256GiB", "--max-image-size", help="Stop when all layers together decompress past this."
    ),
    fmt: Format = _app.FORMAT,
    quiet: bool = _app.QUIET,
    timeout: float = _app.TIMEOUT,
) -> None:
    """Verify every layer while unpacking it into the cache; print the root's folder.
    Exit 1 when a layer is not the declared bytes or holds a hostile entry (nothing kept)."""
    from imagegate._support.sizes import parse_size
    from imagegate.domain.digest import check_digest
    from imagegate.errors import EXIT_ACCEPTED
    from imagegate.oci.transports import open_sources  # lazy: the OCI modules load when a command runs
    from imagegate.report import console_cache
    from imagegate.report.progress import layer_progress
    from imagegate.rootfs import Limits, RootCache, materialize

    if expect_config:
        check_digest(expect_config, what="--expect-config")
    limits = Limits(max_layer_bytes=parse_size(max_layer_size), max_total_bytes=parse_size(max_image_size))
    with (
        _app.within(timeout),
        open_sources([source], platform=platform, insecure=insecure) as (src,),
        RootCache(cache_dir, parse_size(max_size)) as cache,
        layer_progress(quiet) as sink,
    ):
        root = materialize(src, cache=cache, expect_config=expect_config, limits=limits, progress=sink)
    show(fmt, partial(console_cache.root_json, root), partial(console_cache.render_root, root))
    raise typer.Exit(EXIT_ACCEPTED)


@cache_app.command(
    "list", epilog="Examples:\n\n  imagegate cache list\n\n  imagegate cache list --format json"
)
def list_roots(cache_dir: str | None = _DIR, fmt: Format = _app.FORMAT) -> None:
    """The cached roots, least recently used first."""
    from imagegate.report import console_cache
    from imagegate.rootfs import RootCache

    with RootCache(cache_dir) as cache:
        listing = (cache.folder, cache.entries())
    show(fmt, partial(console_cache.entries_json, *listing), partial(console_cache.render_entries, *listing))


@cache_app.command(
    "prune", epilog="Examples:\n\n  imagegate cache prune --max-size 50GiB\n\n  imagegate cache prune --all"
)
def prune(
    cache_dir: str | None = _DIR,
    max_size: str = _MAX_SIZE,
    everything: bool = Option(False, "--all", help="Remove every root no run is using."),
) -> None:
    """Evict least recently used roots (and what interrupted runs left behind)."""
    from imagegate._support.sizes import parse_size
    from imagegate.report import console_cache
    from imagegate.rootfs import RootCache

    limit = 0 if everything else parse_size(max_size)
    with RootCache(cache_dir) as cache:
        removed = cache.prune(limit)
        console_cache.render_pruned(removed, cache.total_bytes())


@cache_app.command("remove", epilog="Examples:\n\n  imagegate cache remove sha256:<chainID>")
def remove(
    chain_ids: list[str] = Argument(..., help="chainIDs (sha256:...) as `cache list` shows them."),
    cache_dir: str | None = _DIR,
) -> None:
    """Remove roots by chainID. Exit 3 when one is absent or in use (the others are removed)."""
    from imagegate.rootfs import RootCache

    with RootCache(cache_dir) as cache:
        removed, problems = cache.remove_each(chain_ids)
    for chain_id in removed:
        print(f"removed {chain_id}")
    for p in problems[:-1]:
        report_error(p)
    if problems:
        raise problems[-1]
