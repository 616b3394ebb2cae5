"""The typer app, the options several commands share, and how an ImagegateError becomes a
message and an exit code: commands let errors rise; `run_main` (imagegate.cli) catches them
once, around the whole app, and calls `report_error`."""

import contextlib
import enum
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import typer
from typer import Argument

from imagegate import version_line
from imagegate._support import deadline
from imagegate.errors import ImagegateError, UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from imagegate.rootfs.known import Known


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _named_metavar(option: Callable[_P, _R]) -> Callable[_P, _R]:
    """`option` (typer.Option), its signature kept: a parameter's default is typer's option, so
    each parameter is checked against typer's own types."""

    def named(*args: _P.args, **kw: _P.kwargs) -> _R:
        default, decls = args[0], args[1:]  # (default, *param_decls), as every caller passes them
        if "metavar" not in kw and not isinstance(default, bool | enum.Enum) and not kw.get("count"):
            long = max((d for d in decls if isinstance(d, str) and d.startswith("--")), key=len, default=None)
            if long is not None:
                kw["metavar"] = long.lstrip("-").upper().replace("-", "_")
        return option(*args, **kw)

    return named


# typer.Option with a placeholder named after the option (`--memory MEMORY`, `--key PATH` where a
# metavar is given), never the type's (`<str>`, `<list[str]>`): help reads as a command line.
# Flags, counters and choices keep typer's own.
Option = _named_metavar(typer.Option)


app = typer.Typer(
    name="imagegate",
    help=(
        "Accept or reject a container image before it reaches GPUs: staged probes inside the "
        "image, layer identity, signed attestations.\n\n"
        "Exit codes: 0 accepted, 1 rejected, 2 could not decide, 3 usage or input error, "
        "130 interrupted (SIGINT), 143 terminated (SIGTERM)."
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},  # subcommands inherit it
)


class Format(str, enum.Enum):
    """`--format` of the commands that print either a table or JSON."""

    table = "table"
    json = "json"


SOURCES_HELP = (
    "docker://REF or a bare REF (a registry), docker-daemon:REF (the local engine, DOCKER_HOST "
    "honoured), docker-archive:PATH[:NAME:TAG] (docker save), oci:DIR[:TAG] (OCI layout)."
)
# The options of the commands that read an image's blobs (layers, compare, cache unpack): one
# declaration each, so that their help reads the same everywhere.
SOURCE = Argument(..., help=SOURCES_HELP)
EXPECT_CONFIG = Option(
    None, "--expect-config", help="The official config digest (sha256:...) the layers are verified against."
)
PLATFORM = Option(None, "--platform", help="os/arch[/variant] to pick from an index [linux/amd64].")
INSECURE = Option(
    False,
    "--insecure",
    help="Registries: skip TLS verification, fall back to HTTP (every registry the command reads or writes).",
)
JOBS = Option(None, "--jobs", "-j", min=1, max=64, help="Layers verified in parallel.")
MAX_LAYER = Option(
    "64GiB", "--max-layer-size", help="Stop a layer that decompresses past this (decompression bomb)."
)
QUIET = Option(
    False, "--quiet", "-q", help="No progress on stderr (messages, bars); the result and errors only."
)
REQUIRE_COMPLETE = Option(
    False, "--require-complete", help="A deferred verdict (CPU_PASS_…_DEFERRED) is not accepted: exit 1."
)
# verify and complete: the keys a chain of attestations may be signed with, in one file.
TRUSTED_KEYS = Option(
    [],
    "--trusted-keys",
    metavar="FILE",
    help="PEM public keys one after another (cat ci.pub gpu.pub > trusted.pem), each trusted (repeatable).",
)
# run, complete, pod run, index: the one key an attempt is signed with.
SIGNING_KEY = Option(
    [],
    "--key",
    metavar="PATH|URI",
    help="Signing key (a PEM file, a pkcs11: URI of a key in a token, hashivault://NAME, a key in "
    "Vault's transit engine, or sigstore:TRUST to sign keyless with the CI's identity; once); default "
    "$IMAGEGATE_SIGNING_KEY, else the user's key, created on first use.",
)
# The root cache (`cache …`, and `run --driver rootfs`).
CACHE_DIR = Option(
    None,
    "--cache-dir",
    envvar="IMAGEGATE_CACHE",
    help="The root cache folder, yours alone (mode 0700) [$XDG_CACHE_HOME/imagegate/roots].",
)
# layers, compare, audit: verified pairs (blob digest -> size, diffID) kept in the root cache.
NO_CACHE = Option(
    False,
    "--no-cache",
    help="Read every blob (run: the layers stage's), even one this machine verified before: no "
    "verified pair of the root cache is used or written; a blob shared by images of this run is "
    "still read once.",
)
FORMAT = Option(Format.table, "--format", help="table, or json on stdout.")
# The Kubernetes objects: pod render/run/collect and fleet render
KUBE_NAMESPACE = Option(
    "default", "--namespace", "-n", help="Namespace of the Secret, the ConfigMap and the Job."
)
KUBE_VERSION = Option("1.30", "--kube-version", help="Validate against this Kubernetes version's schemas.")
KUBE_CONTEXT = Option(None, "--context", help="The kubectl context (default: kubectl's current one).")
# report and fleet report: the one key the attestations they read must verify with
ATTESTATION_KEY = Option(
    None,
    "--key",
    "-k",
    help="Public key (PEM) the attestation must verify with; without it the "
    "signature is not checked (and the report says so).",
)
# One deadline over the whole command (imagegate._support.deadline): a stalled or trickling server ends it.
# One meaning, one text; the default is each command's own (shown by the parser).
TIMEOUT_HELP = (
    "Deadline for the whole command, in seconds: every wait ends by then (a server that stalls or "
    "trickles too), exit 2 (run, complete: by default 30 min to get the image, plus the stages' "
    "timeouts added up)."
)
TIMEOUT = Option(deadline.DEFAULT_S, "--timeout", metavar="SECONDS", help=TIMEOUT_HELP)
VERIFY_TIMEOUT = Option(deadline.VERIFY_DEFAULT_S, "--timeout", metavar="SECONDS", help=TIMEOUT_HELP)
# complete, index, compare --carry: the keys the statements they read in may be signed with.
TRUST = Option(
    [],
    "--trust",
    metavar="PUB",
    help="A public key (PEM) the statements read in may be signed with (repeatable); default: the "
    "signing key's own (compare --carry: --attest's).",
)
EVIDENCE_HELP = "Evidence folder; each run adds a new attempt (complete: by default the earlier attempt's)."


@contextlib.contextmanager
def known_blobs(cache_dir: str | None, no_cache: bool) -> "Iterator[Known]":
    """rootfs/known.py's known_blobs for a command: a cache that cannot be used is said on stderr."""
    from imagegate.rootfs.known import known_blobs as opened

    with opened(cache_dir, no_cache, lambda m: typer.echo(f"imagegate: {m}", err=True)) as known:
        yield known


@contextlib.contextmanager
def within(seconds: float) -> Iterator[deadline.Deadline]:
    """The command's body under its --timeout: every wait in it ends by then (exit 2, naming
    what it waited for)."""
    from imagegate.cli._checks import check_timeout

    check_timeout(seconds)
    with deadline.covering(seconds) as d, deadline.armed():
        yield d


def show(fmt: Format, doc: Callable[[], object], table: Callable[["Console"], None]) -> None:
    """On stdout: `doc()` as JSON, or the table, as --format asks."""
    if fmt is Format.json:
        import json  # here: --help and completion never need it

        print(json.dumps(doc(), indent=2, default=str))
        return
    from imagegate.report.console import make_console

    table(make_console(soft_wrap=True, highlight=False, markup=False))


def report_error(err: ImagegateError) -> int:
    """Print `err` (and its hint) to stderr; return its exit code."""
    if "imagegate.drivers.docker" in sys.modules:  # an engine's pull failure comes from there
        from imagegate.oci.pullfailure import worded

        err = worded(err)
    msg = f"imagegate: error: {err}"
    if err.hint:
        msg += f"\n  hint: {err.hint}"
    print(msg, file=sys.stderr)
    return err.exit_code


EXIT_USAGE = 3


def report_usage(err: typer.TyperException, args: list[str], commands: Iterable[str]) -> int:
    """A parser error (an unknown option or command, a missing or bad value) in the voice of
    every other error: one line saying what is wrong, a hint naming the help to read; exit 3.
    `commands`: the top-level command names, for an error the parser raised outside a command."""
    ctx = getattr(err, "ctx", None)
    if type(err).__name__ == "NoArgsIsHelpError":  # a group named alone: its help is the answer
        err.show()  # type: ignore[attr-defined]
        return EXIT_USAGE
    words: list[str] = []  # the command's words as typed, under the program's own name (not `python -m …`)
    while ctx is not None:
        words.insert(0, ctx.info_name if ctx.parent is not None else "imagegate")
        ctx = ctx.parent
    if not words:  # an option's missing value is raised before its command's context exists
        words = ["imagegate", *[a for a in args[:1] if a in commands]]
    what = err.format_message().strip().removesuffix(".")
    if what[:1].isupper() and what[1:2].islower():  # "No such option" reads as the rest of ours
        what = what[0].lower() + what[1:]
    hint = " ".join(words) + (
        " --help shows what it takes" if len(words) > 1 else " --help lists the commands"
    )
    return report_error(UsageError(what, hint=hint))


def version_callback(value: bool) -> None:
    if value:
        print(version_line())
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = Option(
        False, "--version", callback=version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """imagegate."""
