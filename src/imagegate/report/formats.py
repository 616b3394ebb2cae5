"""Machine-readable reports of a run, written with `run --report FMT=PATH` (several at once,
`-` for stdout) or re-rendered later from stored evidence (`imagegate report`). Each format is
one function (RunRecord, folder the report goes to) -> text."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TextIO

from imagegate._support.jsontypes import JsonObject
from imagegate.attest.statement import build_statement
from imagegate.domain.results import RunRecord
from imagegate.domain.statements import Acceptance, Predicate, Statement
from imagegate.errors import UsageError
from imagegate.report.provenance import Provenance

if TYPE_CHECKING:
    from imagegate.attest.keys import PublicKey, SigningKey

STDOUT = Path("-")


class Renderer(Protocol):
    """`base`: the folder the report is written to (None: stdout, links are relative to the
    current folder); only formats that link to evidence files use it. `provenance`: what vouches
    for the statement, shown by every format when a report is rendered again from a folder."""

    def __call__(
        self, record: RunRecord, base: Path | None = None, *, provenance: Provenance | None = None
    ) -> str: ...


def render_json(record: RunRecord, base: Path | None = None, *, provenance: Provenance | None = None) -> str:
    del base, provenance  # the statement itself: nothing may be added to it (rerender says it on stderr)
    return statement_text(build_statement(record))


def statement_text(statement: Statement[Predicate] | JsonObject) -> str:
    """The statement as statement.json holds it (and `--format json` prints it), byte for byte."""
    doc = statement.to_json() if isinstance(statement, Statement) else statement
    return json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n"


# name -> "module:function", imported when a report of that format is written (start-up time)
FORMATS: dict[str, str] = {
    "json": "imagegate.report.formats:render_json",
    "junit": "imagegate.report.junit:render",
    "markdown": "imagegate.report.markdown:render",
    "html": "imagegate.report.html:render",
    "sarif": "imagegate.report.sarif:render",
}


def renderer(fmt: str) -> Renderer:
    module, _, func = FORMATS[fmt].partition(":")
    fn: Renderer = getattr(importlib.import_module(module), func)
    return fn


def parse_spec(spec: str) -> tuple[str, Path]:
    """'junit=out/report.xml' -> ('junit', Path('out/report.xml')); 'junit=-' is stdout."""
    fmt, sep, path = spec.partition("=")
    if not sep or not path:
        raise UsageError(f"--report {spec!r}: expected FORMAT=PATH", hint=f"formats: {', '.join(FORMATS)}")
    if fmt not in FORMATS:
        raise UsageError(f"--report {spec!r}: unknown format {fmt!r}", hint=f"formats: {', '.join(FORMATS)}")
    return fmt, Path(path)


def parse_specs(specs: list[str]) -> list[tuple[str, Path]]:
    """All --report values; at most one of them may go to stdout."""
    parsed = [parse_spec(s) for s in specs]
    for _, path in parsed:  # before the run: an earlier attempt's evidence is never a target
        if path != STDOUT and (attempt := attempt_folder_of(path)) is not None:
            raise UsageError(
                f"--report {path}: inside the attempt folder {attempt}, whose files are evidence",
                hint="write the report somewhere else, e.g. beside the evidence folder",
            )
    if sum(1 for _, p in parsed if p == STDOUT) > 1:
        raise UsageError(
            "--report: only one report can go to stdout (-)", hint="write the others to files: FORMAT=PATH"
        )
    return parsed


def render(
    record: RunRecord,
    fmt: str,
    base: Path | None = None,
    statement: Statement[Predicate] | None = None,
    provenance: Provenance | None = None,
) -> str:
    """`statement`: the run's own, when known (the json report is that statement, not a rebuild).
    `provenance`: what vouches for it (the run's own envelope, checked), shown by every format
    but json, which stays the statement alone."""
    if fmt == "json" and statement is not None:
        return statement_text(statement)
    if provenance is None:
        return renderer(fmt)(record, base)
    return renderer(fmt)(record, base, provenance=provenance)


def attempt_folder_of(path: Path) -> Path | None:
    """The attempt folder `path` would land in (a folder holding plan.json and run.json), if any."""
    for parent in path.resolve().parents:
        if (parent / "plan.json").is_file() and (parent / "run.json").is_file():
            return parent
    return None


def write_outside_evidence(path: Path, text: str) -> None:
    """Write a report, never into an attempt folder: evidence is never overwritten or added to
    after the run (its files are hashed into the signed statement)."""
    attempt = attempt_folder_of(path)
    if attempt is not None:
        raise UsageError(
            f"{path}: inside the attempt folder {attempt}, whose files are evidence",
            hint="write the report somewhere else, e.g. beside the evidence folder",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def rerender(
    attempt: Path,
    fmt: str,
    output: Path | None = None,
    key: PublicKey | None = None,
    stderr: TextIO | None = None,
    sarif_location: str | None = None,
) -> Provenance:
    """`imagegate report`: an attempt folder's report (or an image folder's latest attempt's) in
    `fmt` (a format, "table": the console view, "github": the workflow commands), to `output` or
    stdout, from the statement as signed (`sarif_location`: sarif.render's `location`). Returns what vouches for it (`Provenance.ok` False:
    the caller exits non-zero); json, which must stay the statement alone, says it on stderr."""
    from imagegate.report import console, github, load

    try:
        folder = load.resolve_attempt(attempt)
        loaded = load.read_attempt(folder, key)
        record, provenance = loaded.record, loaded.provenance
        text: str | None
        if fmt == "json":
            text = (
                load.statement_text(folder)  # unsigned: statement.json as the run wrote it
                if provenance.signature in ("unsigned", "unreadable")
                else statement_text(loaded.statement)  # the signed payload, in statement.json's layout
            )
            for line in provenance.lines():
                (stderr or sys.stderr).write(f"imagegate: attestation: {line}\n")
        elif fmt == "table":
            text = console.render_text(record, provenance=provenance) if output else None
        elif fmt == "github":
            text = github.render(record, provenance)
        elif fmt == "sarif":
            from imagegate.report import sarif

            text = sarif.render(record, provenance=provenance, location=sarif_location)
        else:
            text = renderer(fmt)(record, output.parent if output else None, provenance=provenance)
        if text is None:  # the table on stdout: a terminal's own width and colours
            console.render(record, console.make_console(), provenance=provenance)
        elif output is None:
            sys.stdout.write(text)
        else:
            write_outside_evidence(output, text)
    except OSError as e:
        raise UsageError(f"writing {output}: {e.strerror}", hint="check the --output path") from e
    return provenance


def write_reports(
    record: RunRecord,
    specs: list[tuple[str, Path]],
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    env: Mapping[str, str] | None = None,
    statement: Statement[Predicate] | None = None,
    provenance: Provenance | None = None,
) -> bool:
    """Write each report; in GitHub Actions also the step summary and the annotations (on
    stderr). Returns whether a report went to stdout: then the caller prints nothing else there."""
    used_stdout = False
    for fmt, path in specs:
        if path == STDOUT:
            out = stdout or sys.stdout
            out.write(render(record, fmt, statement=statement, provenance=provenance))
            out.flush()
            used_stdout = True
            continue
        write_outside_evidence(path, render(record, fmt, path.parent, statement, provenance))
    from imagegate.report import github

    github.publish(record, stderr or sys.stderr, env)
    return used_stdout


def writer(
    specs: list[tuple[str, Path]],
) -> Callable[[RunRecord, Statement[Acceptance], Path, SigningKey | None], bool]:
    """Writes the --report files of a run (accept.Outputs.write_reports): what vouches for it is
    the envelope just written, read back and checked with the signing key's public half, as
    `imagegate report --key` says."""

    def write(
        record: RunRecord, statement: Statement[Acceptance], folder: Path, key: SigningKey | None
    ) -> bool:
        from imagegate.report import load

        provenance = (
            load.read_attempt(folder, key.public if key is not None else None).provenance if specs else None
        )
        try:
            return write_reports(record, list(specs), statement=statement, provenance=provenance)
        except OSError as e:
            raise UsageError(f"writing a report: {e}", hint="check the --report paths") from e

    return write
