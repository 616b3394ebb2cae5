"""The console view of an audit: one table, one row per image or mirror pair, then the count
and the exit code."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from imagegate.audit.batch import AuditResult
from imagegate.report.console import one_line

_MEANING = {0: "accepted", 1: "rejected", 2: "undecided", 3: "input error"}
_STYLE = {0: "green", 1: "bold red", 2: "bold magenta", 3: "bold magenta"}


def render(result: AuditResult, console: Console) -> None:
    table = Table(title=f"imagegate audit · {result.inventory}", title_justify="left")
    table.add_column("kind", no_wrap=True)
    table.add_column("name", no_wrap=True, overflow="fold")
    table.add_column("outcome", no_wrap=True)
    table.add_column("exit", justify="right", no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column("detail", overflow="ellipsis", no_wrap=True, max_width=80)
    table.add_column("evidence", overflow="fold")
    for i in result.items:
        table.add_row(
            i.kind,
            i.name,
            Text(i.outcome, style=_STYLE.get(i.exit_code, "bold")),
            str(i.exit_code),
            f"{i.duration_s:.1f}s",
            one_line(i.detail, 80),
            i.evidence or "",
        )
    console.print(table)
    counts: dict[str, int] = {}
    for i in result.items:
        key = _MEANING.get(i.exit_code, f"exit {i.exit_code}")
        counts[key] = counts.get(key, 0) + 1
    summary = ", ".join(f"{n} {what}" for what, n in counts.items())
    code = result.exit_code
    console.print(
        Text.assemble(
            f"audit: {len(result.items)} items: {summary}; exit ",
            (f"{code} ({_MEANING.get(code, '?')})", _STYLE.get(code, "bold")),
        )
    )
