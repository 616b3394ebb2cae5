"""Machine-readable reports of a run, written with `run --report FMT=PATH` (several at once,
`-` for stdout) or re-rendered later from stored evidence (`imagegate report`). Each format is
one function (RunRecord, folder the report goes to) -> text."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from imagegate.attest.statement import build_statement
from imagegate.errors import UsageError
from imagegate.model import RunRecord

STDOUT = Path("-")

# `base`: the folder the report is written to (None: stdout, links are relative to the current
# folder); only formats that link to evidence files use it.
Renderer = Callable[[RunRecord, Path | None], str]


def render_json(record: RunRecord, base: Path | None = None) -> str:
    del base
    return statement_text(build_statement(record))


def statement_text(statement: dict[str, Any]) -> str:
    """The statement as statement.json holds it (and `--format json` prints it), byte for byte."""
    return json.dumps(statement, indent=2, sort_keys=True, default=str) + "\n"


# name -> "module:function", imported when a report of that format is written (start-up time)
FORMATS: dict[str, str] = {
    "json": "imagegate.report.formats:render_json",
    "junit": "imagegate.report.junit:render",
    "markdown": "imagegate.report.markdown:render",
    "html": "imagegate.report.html:render",
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
    record: RunRecord, fmt: str, base: Path | None = None, statement: dict[str, Any] | None = None
) -> str:
    """`statement`: the run's own, when known (the json report is that statement, not a rebuild)."""
    if fmt == "json" and statement is not None:
        return statement_text(statement)
    return renderer(fmt)(record, base)


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


def rerender(attempt: Path, fmt: str, output: Path | None = None) -> None:
    """`imagegate report`: an attempt folder's report (or an image folder's latest attempt's) in
    `fmt` (a format, or "table": the console view), to `output` or stdout."""
    from imagegate.report import console, load

    try:
        folder = load.resolve_attempt(attempt)
        text: str | None
        if fmt == "json":  # the statement as the run wrote it, not a rebuild
            text = load.statement_text(folder)
        elif fmt == "table":
            text = console.render_text(load.load_attempt(folder)) if output else None
        else:
            text = render(load.load_attempt(folder), fmt, output.parent if output else None)
        if text is None:  # the table on stdout: a terminal's own width and colours
            console.render(load.load_attempt(folder), console.make_console())
        elif output is None:
            sys.stdout.write(text)
        else:
            write_outside_evidence(output, text)
    except OSError as e:
        raise UsageError(f"writing {output}: {e.strerror}", hint="check the --output path") from e


def write_reports(
    record: RunRecord,
    specs: list[tuple[str, Path]],
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    env: Mapping[str, str] | None = None,
    statement: dict[str, Any] | None = None,
) -> bool:
    """Write each report; in GitHub Actions also the step summary and the annotations (on
    stderr). Returns whether a report went to stdout: then the caller prints nothing else there."""
    used_stdout = False
    for fmt, path in specs:
        if path == STDOUT:
            out = stdout or sys.stdout
            out.write(render(record, fmt, statement=statement))
            out.flush()
            used_stdout = True
            continue
        write_outside_evidence(path, render(record, fmt, path.parent, statement))
    from imagegate.report import github

    github.publish(record, stderr or sys.stderr, env)
    return used_stdout
