"""What the accepting commands (run, pod run, pod collect, complete) share: each option declared
once, the common ones as one group; rendering the outcome. The work itself
is `imagegate.usecases.accept`."""

import contextlib
import dataclasses
import functools
import inspect
import os
import shlex
import sys
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypedDict

import typer

from imagegate._support.interrupts import EXIT_SIGINT
from imagegate._support.resources import builtin_pipelines
from imagegate.cli import _app
from imagegate.cli._app import SIGNING_KEY, Format, Option
from imagegate.domain.servemodel import IN_SANDBOX
from imagegate.errors import UsageError

NOTHING_LEFT = "nothing was left running"  # accept.NOTHING_LEFT, without importing the use case

if TYPE_CHECKING:  # imported where used: `--help` never loads the pipeline models
    from _typeshed import DataclassInstance
    from typing_extensions import Unpack  # typing's own from Python 3.11

    from imagegate.attest import keys
    from imagegate.usecases import accept
    from imagegate.usecases.runner import RunOptions

Notify = Callable[[str], None]
EXIT_CODES = (
    "Exit codes: 0 accepted (PASS, or a deferred verdict, that reaches a level), 1 rejected (FAIL, "
    "no level reached, or deferred with --require-complete), 2 could not decide (ERROR; --attach "
    "that could not attach: the image's tag moved while it ran, nothing signed, or the registry "
    "refused), 3 usage or input error (--attach with no key to sign with: refused before the run)."
)


# Options that several accepting commands take: one declaration each, so their help reads the same.
PIPELINE = Option(
    "python",
    "--pipeline",
    "-p",
    metavar="NAME|FILE",
    help=f"Built-in name ({', '.join(builtin_pipelines())}) or a YAML file.",
)
MODULES = Option([], "--module", "-m", help="Module for the find_spec stage (repeatable).")
# run, complete: by default 30 min to get the image plus the stages' timeouts (_checks.check_timeout)
TIMEOUT = Option(None, "--timeout", metavar="SECONDS", help=_app.TIMEOUT_HELP)
KEY = SIGNING_KEY
NO_SIGN = Option(False, "--no-sign", help="Do not sign the attempt.")
REQUIRE_COMPLETE = _app.REQUIRE_COMPLETE
QUIET = _app.QUIET
PYTHON = Option(None, "--python", help="With --here: the interpreter to run the probes with.")
SIGN_UNISOLATED = Option(
    False,
    "--sign-unisolated",
    help="With --here where bubblewrap cannot hide the signing key from the probes: sign anyway (the statement says keyIsolation: none).",
)
MEMORY = Option("8g", "--memory", help="Container memory limit of each run.")
EXPECT_CONFIG = _app.EXPECT_CONFIG
GPUS = Option(
    None,
    "--gpus",
    help="Give the probes GPUs: all, a count, ids (0,1), device=ID or a GPU-… UUID; the run starts with the GPU node check (the rootfs driver injects them as CDI describes them). Default: none (GPUs hidden).",
)


ATTACH = Option(
    False,
    "--attach",
    help="Push the signed statements to the image's repository (as cosign attaches .att, and as "
    "referrers), replacing the earlier ones of the same pipeline there: to the digest IMAGE names "
    "there, read once before signing (a tag moved since the run began: exit 2, nothing signed). "
    "Needs a key: with none, refused before the run.",
)
# The serve stages' model, for run and for the deferred serve stage complete runs.
MODEL = Option(
    None,
    "--model",
    metavar="PATH",
    help=f"The serve stages' model: a host folder bound read-only at {IN_SANDBOX} (--here: used "
    "where it is); checked before anything runs (complete: without it, the earlier plan's path).",
)
# Where the stages run: run, and the deferred stages complete runs.
DRIVER = Option(
    None,
    "--driver",
    metavar="NAME",
    help="Where the probes run: docker (default; DOCKER_HOST is honoured), podman, rootfs (no "
    "engine: the image read from its transport, complete: the one it was judged from; layers "
    "verified while unpacked, run under bubblewrap), here.",
)


PULL_HELP = (
    "Pull the image through the engine: missing, never, always (default: run missing, as docker "
    "run; complete never, the image judged being the engine's own)."
)
# The outside stages' (layers) transport: run, pod run, pod collect.
SOURCE = Option(
    None,
    "--source",
    help="For the outside stages (layers): read the image from this transport (default: the "
    "engine's copy; in a Pod, its imageID's digest).",
)
VERBOSE = Option(0, "--verbose", "-v", count=True, help="More detail on stderr: -v progress, -vv debug.")


# How a verdict is shown and reported: run, pod run, pod collect and complete alike.
FORMAT = Option(
    Format.table, "--format", help="table, or json: the in-toto statement on stdout, nothing else."
)
REPORT = Option(
    [],
    "--report",
    metavar="FORMAT=PATH",
    help="Also write FORMAT=PATH (repeatable): json, junit, markdown, html, sarif; PATH - is stdout.",
)


class RunWords(TypedDict, total=False):
    """The runner.RunOptions words a command adds to Accepting's, only those it gives."""

    source: str | None
    expect_config: str | None
    gpus: str | None
    skip: Sequence[str]
    jobs: int
    model: str | None
    startup_budget: float | None
    fail_fast: bool
    cache_dir: str | None
    no_cache: bool


@dataclass(frozen=True)
class Accepting:
    """The options every command that gives a verdict on an image takes (`complete`: some)."""

    pipeline: str = PIPELINE
    module: list[str] = MODULES
    out: Path = Option(
        Path("imagegate-runs"),
        "--out",
        "-o",
        metavar="FOLDER",
        help=_app.EVIDENCE_HELP,
    )
    fmt: Format = FORMAT
    require_complete: bool = REQUIRE_COMPLETE
    report: list[str] = REPORT
    advisory_db: Path | None = Option(
        None,
        "--advisory-db",
        metavar="FOLDER",
        help="OSV advisory folder for an offline vulnerability audit.",
    )
    key: list[str] = KEY
    no_sign: bool = NO_SIGN
    attach: bool = ATTACH
    insecure: bool = _app.INSECURE
    quiet: bool = QUIET

    @property
    def silent(self) -> bool:
        return self.quiet or self.fmt is Format.json  # stdout then is the statement's alone

    def run_options(self, **kw: "Unpack[RunWords]") -> "RunOptions":
        from imagegate.usecases.runner import RunOptions

        return RunOptions(self.pipeline, self.module, self.out, advisory_db=self.advisory_db, **kw)

    def outputs(self, reference: str | None, notify: Notify) -> "accept.Outputs":
        from imagegate.cli import _checks

        return _checks.outputs(
            self.report,
            key=signing_key(self.key),
            no_sign=self.no_sign,
            attach=self.attach,
            insecure=self.insecure,
            require_complete=self.require_complete,
            reference=reference,
            statement_on_stdout=self.fmt is Format.json,
            notify=notify,
            warn=warn,
        )


def signing_key(given: list[str]) -> str | None:
    """--key as typer gives a repeatable option: a signing key named twice is refused, both
    named, rather than the last one silently taken (only one key signs an attempt)."""
    if len(given) > 1:
        raise UsageError(
            f"--key given {len(given)} times ({', '.join(given)}): an attempt is signed with one key",
            hint="pass --key once (complete: the keys it trusts for the earlier attempt are --trust PUB)",
        )
    return given[0] if given else None


# A command of any signature, rewritten for typer: no narrower type says that.
def grouped(command: Callable[..., None]) -> Callable[..., None]:  # type: ignore[explicit-any]
    """Typer has no parameter groups: a parameter typed with an options dataclass becomes that
    class's fields (typer options), in place, and the command gets the class built from them."""
    kw_only = inspect.Parameter.KEYWORD_ONLY
    groups: dict[str, type[DataclassInstance]] = {}
    params: list[inspect.Parameter] = []
    for p in inspect.signature(command, eval_str=True).parameters.values():
        if not (isinstance(p.annotation, type) and dataclasses.is_dataclass(p.annotation)):
            params.append(p.replace(kind=kw_only))
            continue
        groups[p.name] = p.annotation
        hints = typing.get_type_hints(p.annotation)
        for f in dataclasses.fields(p.annotation):
            params.append(inspect.Parameter(f.name, kw_only, default=f.default, annotation=hints[f.name]))

    @functools.wraps(command)
    def with_groups(**kw: object) -> None:
        for name, cls in groups.items():
            kw[name] = cls(**{f.name: kw.pop(f.name) for f in dataclasses.fields(cls)})
        command(**kw)

    with_groups.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    with_groups.__annotations__ = {p.name: p.annotation for p in params}
    return with_groups


def notifier(quiet: bool) -> Notify:
    if quiet:  # a quiet or JSON run loads no console at all
        return lambda _m: None
    from rich.text import Text  # here: `--help` and completion never build a console

    from imagegate.report.console import make_console

    err = make_console(stderr=True)  # in a log one line each, however long (a digest, a path)
    # Text, not markup: a message's own brackets ("[1/2]", an argv) are printed as they are.
    return lambda m: err.print(Text(f"imagegate: {m}", style="dim"), soft_wrap=True, highlight=False)


def warn(message: str) -> None:
    print(f"imagegate: warning: {message}", file=sys.stderr)  # even when quiet


@contextlib.contextmanager
def interrupts() -> Iterator[None]:
    """SIGINT, or SIGTERM through the entry point's handlers: say what the work may have left
    (the observer knows)."""
    try:
        yield
    except KeyboardInterrupt as e:
        # Only an interrupt inside accept() can know more; one before it was imported left nothing.
        use_case = sys.modules.get("imagegate.usecases.accept")
        left = e.left if use_case is not None and isinstance(e, use_case.Interrupted) else NOTHING_LEFT
        print(f"imagegate: interrupted; {left}", file=sys.stderr)
        raise typer.Exit(EXIT_SIGINT) from None  # 143 for SIGTERM: run_main tells them apart


def finish(
    done: "accept.Accepted", fmt: Format, quiet: bool, key: "keys.SigningKey | None" = None
) -> NoReturn:
    """The outcome: what was signed and attached, then the statement (--format json) or the
    table, then how to check it (`key`: what signed it); exit with the verdict's code."""
    say = notifier(quiet or fmt is Format.json)
    for line in done_lines(done):
        say(line)
    if done.attached is not None and done.attached.left is not None:  # with its exit 1, even when quiet
        print(f"imagegate: {done.attached.left}", file=sys.stderr)
    if fmt is Format.json:
        from imagegate.report import formats

        sys.stdout.write(formats.statement_text(done.statement))  # as signed, byte for byte
        if not quiet:  # stdout is the statement's alone; where the evidence went still matters
            print(f"imagegate: evidence: {done.record.attempt_dir}", file=sys.stderr)
            for line in next_step(done, key):
                print(f"imagegate: {line}", file=sys.stderr)
        if done.rejected_by:  # no table to say it on: why exit 1, even when quiet
            print(f"imagegate: verdict {done.record.verdict} rejected: {done.rejected_by}", file=sys.stderr)
    else:
        from imagegate.report import console as console_report

        # A machine format on stdout keeps stdout to itself: the table goes to stderr then.
        console = console_report.make_console(stderr=done.used_stdout)
        console_report.render(done.record, console, rejected_by=done.rejected_by)
        for line in next_step(done, key):
            console.print(line, soft_wrap=True, highlight=False, markup=False)
    raise typer.Exit(done.exit_code)


def done_lines(done: "accept.Accepted") -> list[str]:
    """What the run did after its verdict, as the use case returned it: signing, attaching."""
    lines = []
    if done.reused is not None:
        lines.append(
            f"reused attempt {done.reused}: verified with this run's key, each evidence file hashed "
            f"again; its stages ran then (finished {done.record.finished_at})"
        )
    if done.signed is not None:
        lines.append(f"signed {done.signed.dsse_path} {_with(done.signed.signer)}")
    a = done.attached
    if a is not None:
        if a.tag:
            lines.append(
                f"attached to {a.reference} ({a.tag}, {a.layers} attestation(s); referrers via {a.via})"
            )
        else:  # keyless, no timestamp authority: the referrers alone (referrers.attach_and_refer)
            lines.append(f"attached to {a.reference} as {a.layers} Sigstore bundle referrer(s), via {a.via}")
        if a.replaced:
            from imagegate.attest.referrers import REPLACED_KEPT

            lines.append(f"replaced {', '.join(a.replaced)}: {REPLACED_KEPT}")
        lines += [f"kept {k}" for k in a.kept]
    return lines


def next_step(done: "accept.Accepted", key: "keys.SigningKey | None") -> list[str]:
    """After a signed run, its last lines: the public key to give verifiers, and the command that
    checks this run's statement, as the user can paste it (paths relative under the cwd)."""
    if done.signed is None or key is None:
        return []
    from imagegate.attest import keys, sign

    statement = pasteable(done.signed.dsse_path)
    keyless = keys.keyless_key(key)
    if keyless is not None:  # who signed is the certificate's identity
        who = keyless.identity
        bundle = pasteable(done.signed.dsse_path.with_name(sign.BUNDLE_FILE))
        return [
            f"signed keyless: identity {who.identity}, issuer {who.issuer}; the bundle carries the "
            "certificate, the log entry and the timestamps",
            f"to verify: imagegate verify {bundle} --identity {shlex.quote(who.identity)} "
            f"--issuer {shlex.quote(who.issuer)} --trusted-root TRUSTED_ROOT.json",
        ]
    pub = keys.public_key_file(key)
    if pub is None and key.path is None:  # a key in a token or Vault: its public half is read from it
        store = "Vault" if key.where.startswith("hashivault://") else "the token"
        return [
            f"public key: in {store} (fingerprint {done.signed.fingerprint}); "
            f"write it with: imagegate public-key --key '{key.where}' --out signer.pub",
            f"to verify: imagegate verify {statement} --key signer.pub",
        ]
    if pub is None:  # a key of the user's own, with no .pub beside it
        return [
            f"public key: none beside {key.where} (fingerprint {done.signed.fingerprint})",
            f"to verify: imagegate verify {statement} --key PUB",
        ]
    return [
        f"public key: {pasteable(pub)}",
        f"to verify: imagegate verify {statement} --key {pasteable(pub)}",
    ]


def _with(signer: str) -> str:
    """'with key FINGERPRINT', or 'keyless, as IDENTITY (issuer ISSUER)'."""
    return signer if signer.startswith("keyless") else f"with {signer}"


def pasteable(path: Path) -> str:
    """`path` for a shell: relative to the cwd when under it, else to ~ when under the home
    folder (unquoted, for the shell to expand), quoted where it must be."""
    full = Path(path).absolute()
    with contextlib.suppress(ValueError, OSError):
        return shlex.quote(os.fspath(full.relative_to(Path.cwd())))
    with contextlib.suppress(ValueError, RuntimeError):  # RuntimeError: no home folder known
        return "~/" + shlex.quote(os.fspath(full.relative_to(Path.home())))
    return shlex.quote(os.fspath(path))
