"""Machine-readable reports of a run, written with `run --report FMT=PATH` (several at once) or
re-rendered later from stored evidence. Each format is one function RunRecord -> text."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from imagegate.attest.statement import build_statement
from imagegate.errors import UsageError
from imagegate.model import RunRecord


def render_json(record: RunRecord) -> str:
    return json.dumps(build_statement(record), indent=2, sort_keys=True) + "\n"


FORMATS: dict[str, Callable[[RunRecord], str]] = {
    "json": render_json,
}


def parse_spec(spec: str) -> tuple[str, Path]:
    """'junit=out/report.xml' -> ('junit', Path('out/report.xml'))."""
    fmt, sep, path = spec.partition("=")
    if not sep or not path:
        raise UsageError(f"--report {spec!r}: expected FORMAT=PATH", hint=f"formats: {', '.join(FORMATS)}")
    if fmt not in FORMATS:
        raise UsageError(f"--report {spec!r}: unknown format {fmt!r}", hint=f"formats: {', '.join(FORMATS)}")
    return fmt, Path(path)


def write_reports(record: RunRecord, specs: list[tuple[str, Path]]) -> list[Path]:
    written = []
    for fmt, path in specs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(FORMATS[fmt](record))
        written.append(path)
    return written
