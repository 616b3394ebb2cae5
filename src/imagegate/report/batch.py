"""The console view of a batch audit (`imagegate audit`): one table, one row per image or mirror pair, then the count
and the exit code; and where its JSON report is written."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from imagegate.errors import UsageError
from imagegate.pipeline.spec import API_VERSION
from imagegate.report.console import one_line
from imagegate.report.progress import size_text as _size

if TYPE_CHECKING:  # a view of the batch use case's result; the use case runs on accept, which writes reports
    from imagegate.usecases.audit.run import BatchResult

_MEANING = {0: "accepted", 1: "rejected", 2: "undecided", 3: "input error"}
_STYLE = {0: "green", 1: "bold red", 2: "bold magenta", 3: "bold magenta"}


def render(result: BatchResult, console: Console) -> None:
    # Fixed widths, the detail taking what is left: rich would otherwise squeeze whole columns
    # away in an 80-column CI log; narrow consoles drop the kind column.
    wide = console.width >= 120
    cut = console.is_terminal  # a log (not a terminal) keeps every name and detail whole
    longest = max([4, *(len(i.name) for i in result.items)])
    name_w = min(36 if wide else 24, longest) if cut else longest
    outcome_w = max([7, *(len(i.outcome) for i in result.items)])
    widths = {"kind": 6, "name": name_w, "outcome": outcome_w, "exit": 4, "time": 6}
    if not wide:
        del widths["kind"]
    detail_w: int | None = max(12, min(90, console.width - sum(w + 2 for w in widths.values()) - 3))
    if not cut:
        detail_w = None
    table = Table(
        title=f"imagegate audit · {result.image_list}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for col, w in widths.items():
        right = col in ("exit", "time")
        table.add_column(
            col,
            no_wrap=col != "name",
            overflow="fold",
            min_width=w,
            max_width=w,
            justify="right" if right else "left",
        )
    table.add_column("detail", overflow="ellipsis", no_wrap=True, max_width=detail_w)
    for i in result.items:
        cells: list[str | Text] = [i.kind] if wide else []
        cells += [
            i.name,
            Text(i.outcome, style=_STYLE.get(i.exit_code, "bold")),
            str(i.exit_code),
            f"{i.duration_s:.1f}s",
            one_line(i.detail, detail_w),
        ]
        table.add_row(*cells)
    console.print(table)
    # Full paths do not fit a table: one line each, to copy into `imagegate report`.
    for i in result.items:
        if i.evidence:
            console.print(f"evidence {i.name}: {i.evidence}", soft_wrap=True, highlight=False)
    counts: dict[str, int] = {}
    for i in result.items:
        key = _MEANING.get(i.exit_code, f"exit {i.exit_code}")
        counts[key] = counts.get(key, 0) + 1
    summary = ", ".join(f"{n} {what}" for what, n in counts.items())
    _blobs(result, console)
    code = result.exit_code
    console.print(
        Text.assemble(
            f"audit: {len(result.items)} items: {summary}; exit ",
            (f"{code} ({_MEANING.get(code, '?')})", _STYLE.get(code, "bold")),
        )
    )


def _blobs(result: BatchResult, console: Console) -> None:
    """What the listings skipped, and how many layers were read and how many known."""
    for name in result.skipped:
        console.print(f"skipped (listed, not a name): {name}", soft_wrap=True, highlight=False, markup=False)
    if result.blobs is not None and (result.blobs.read or result.blobs.known):
        b = result.blobs
        console.print(
            f"layers: {b.read} read ({_size(b.read_bytes)}), {b.known} known and not read again "
            f"({_size(b.known_bytes)}: read once in this run, or a verified pair)",
            highlight=False,
        )


def write_json(result: BatchResult, path: Path | None) -> bool:
    """The JSON report to `path` (`-`: stdout); whether it went to stdout, which it then keeps
    to itself."""
    if path is None:
        return False
    text = json.dumps(to_json(result), indent=2, sort_keys=True) + "\n"
    if str(path) == "-":
        sys.stdout.write(text)
        return True
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"writing {path}: {e.strerror}", hint="check the --json path") from e
    return False


def to_json(result: BatchResult) -> dict[str, object]:
    # dict[str, object], not JsonObject: json.dumps writes an item's `data` as the item carries it.
    return {
        "apiVersion": API_VERSION,
        "kind": "AuditReport",
        "inventory": result.image_list,
        "startedOn": result.started_at,
        "finishedOn": result.finished_at,
        "exitCode": result.exit_code,
        "outcomes": _outcomes(result),
        "layers": None if result.blobs is None else asdict(result.blobs),
        "skipped": list(result.skipped),
        "items": [
            {
                "kind": i.kind,
                "name": i.name,
                "subject": i.subject,
                "outcome": i.outcome,
                "exitCode": i.exit_code,
                "detail": i.detail,
                "durationSeconds": round(i.duration_s, 3),
                "evidence": i.evidence,
                "data": i.data,
            }
            for i in result.items
        ],
    }


def _outcomes(result: BatchResult) -> dict[str, int]:
    """How many items ended each way (IDENTICAL, SAME_CONTENT, DIFFERENT, CORRUPT, a verdict, ERROR)."""
    counts: dict[str, int] = {}
    for i in result.items:
        counts[i.outcome] = counts.get(i.outcome, 0) + 1
    return counts
