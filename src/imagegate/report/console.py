"""The console view of a run: a table of stages, the reasons of what did not pass, the verdict
line, the evidence path."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from imagegate.model import RunRecord, Status
from imagegate.report import view

STYLE = {
    Status.PASS: "green",
    Status.FAIL: "bold red",
    Status.ERROR: "bold magenta",
    Status.DEFERRED: "yellow",
    Status.SKIPPED: "dim",
}


def one_line(text: str, width: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def verdict_style(verdict: str) -> str:
    if verdict == "PASS":
        return "bold green"
    return "bold red" if verdict in ("FAIL", "ERROR") else "bold yellow"


def render(record: RunRecord, console: Console) -> None:
    title = f"imagegate {record.pipeline['name']} · {record.image.reference}"
    # Narrow consoles (CI logs default to 80 columns) drop the token column and list tokens below.
    wide = console.width >= 120
    table = Table(title=title, title_justify="left")
    widths = [max([5, *(len(s.id) for s in record.stages)]), 8]
    if wide:
        widths.append(max([5, *(len(s.token) for s in record.stages)]))
    widths.append(8)
    table.add_column("stage", no_wrap=True, min_width=widths[0])
    table.add_column("status", no_wrap=True, min_width=widths[1])
    if wide:
        table.add_column("token", no_wrap=True, min_width=widths[2])
    table.add_column("time", justify="right", no_wrap=True, min_width=widths[-1])
    room = console.width - sum(widths) - 3 * (len(widths) + 1) - 1
    table.add_column("reason", overflow="ellipsis", no_wrap=True, max_width=max(16, min(90, room)))
    for s in record.stages:
        cells: list[str | Text] = [s.id, Text(s.status.value, style=STYLE[s.status])]
        if wide:
            cells.append(s.token)
        table.add_row(*cells, f"{s.duration_s:.2f}s", one_line(s.detail))
    console.print(table)
    if not wide:
        console.print("tokens: " + " ".join(s.token for s in record.stages), soft_wrap=True, highlight=False)
    # The full reasons of every stage that did not pass, one problem a line: the table keeps one.
    for s in record.stages:
        if s.status is Status.PASS or (len(s.detail) <= 90 and "; " not in s.detail):
            continue
        console.print(Text.assemble((f"{s.id} {s.status.value}:", STYLE[s.status])))
        for part in s.detail.split("; "):
            console.print(f"  - {part}", soft_wrap=True, highlight=False)
    note = view.deferred_note(record)  # the token names the deferred stages, not what they held back
    console.print(
        Text.assemble(
            "verdict: ", (record.verdict, verdict_style(record.verdict)), f" ({note})" if note else ""
        ),
        soft_wrap=True,
    )
    console.print(
        f"image: {record.image.config_digest or record.image.reference}", soft_wrap=True, highlight=False
    )
    console.print(f"evidence: {record.attempt_dir}", soft_wrap=True, highlight=False)
