"""The console view of a run: a table of stages, the verdict line, the evidence path."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from imagegate.model import RunRecord, Status

STYLE = {
    Status.PASS: "green",
    Status.FAIL: "bold red",
    Status.ERROR: "bold magenta",
    Status.DEFERRED: "yellow",
    Status.SKIPPED: "dim",
}


def one_line(text: str, width: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def render(record: RunRecord, console: Console) -> None:
    table = Table(title=f"imagegate {record.pipeline['name']} · {record.image.reference}", title_justify="left")
    table.add_column("stage")
    table.add_column("status")
    table.add_column("token")
    table.add_column("time", justify="right")
    table.add_column("reason", overflow="fold")
    for s in record.stages:
        table.add_row(
            s.id,
            Text(s.status.value, style=STYLE[s.status]),
            s.token,
            f"{s.duration_s:.2f}s",
            one_line(s.detail),
        )
    console.print(table)
    style = "bold green" if record.verdict == "PASS" else "bold red" if record.verdict in ("FAIL", "ERROR") else "bold yellow"
    console.print(Text.assemble("verdict: ", (record.verdict, style)))
    console.print(f"image: {record.image.config_digest or record.image.reference}")
    console.print(f"evidence: {record.attempt_dir}")
