"""The console view of a run: a table of stages, the reasons of what did not pass, the verdict
line, the evidence path."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, TypedDict

from rich.console import Console
from rich.table import Table
from rich.text import Text

from imagegate.domain.results import RunRecord, StageResult, Status
from imagegate.report import view
from imagegate.report.provenance import Provenance
from imagegate.report.view import counted_reasons

if TYPE_CHECKING:
    from typing_extensions import Unpack  # in typing from 3.11; imagegate runs on 3.10 too

STYLE = {
    Status.PASS: "green",
    Status.FAIL: "bold red",
    Status.ERROR: "bold magenta",
    Status.DEFERRED: "yellow",
    Status.SKIPPED: "dim",
}


# Outside a terminal (a CI log, a file) lines are never cut: a log is read with grep and scrolled
# sideways, and an ellipsis there hides the one reason that was needed.
LOG_WIDTH = 100_000
TERMINAL_REASON_WIDTH = 90


def a_terminal(console: Console) -> bool:
    """Whether the console writes to a terminal a person watches. rich says so of any stream when
    FORCE_COLOR or TTY_COMPATIBLE is set, as CI runners often set them for colours: a log then
    keeps its colours but gets no bars and no width."""
    isatty = getattr(console.file, "isatty", None)
    return console.is_terminal and callable(isatty) and bool(isatty())


class ConsoleOptions(TypedDict, total=False):
    """What callers pass on to rich's Console beside `stderr`."""

    soft_wrap: bool
    highlight: bool
    markup: bool
    width: int


def make_console(*, stderr: bool = False, **kwargs: Unpack[ConsoleOptions]) -> Console:
    """A console on stdout or stderr: a terminal's own width, or no width limit anywhere else."""
    console = Console(stderr=stderr, **kwargs)
    if a_terminal(console) or "width" in kwargs:
        return console
    wide: ConsoleOptions = {**kwargs, "width": LOG_WIDTH}  # no width was given: this one
    return Console(stderr=stderr, **wide)


def one_line(text: str, width: int | None = TERMINAL_REASON_WIDTH) -> str:
    text = " ".join(text.split())
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def verdict_style(verdict: str) -> str:
    if verdict == "PASS":
        return "bold green"
    return "bold red" if verdict in ("FAIL", "ERROR") else "bold yellow"


def _time(stage: StageResult) -> str:
    # A stage that never reported (the run was cut before it) has no time of its own: "-", not
    # a "0.00s" that reads as "ran and took nothing".
    if stage.duration_s == 0 and not stage.evidence and stage.status is Status.ERROR:
        return "-"
    return f"{stage.duration_s:.2f}s"


def render_provenance(provenance: Provenance, console: Console) -> None:
    style = (
        "green"
        if provenance.ok and provenance.signature == "verified"
        else "yellow"
        if provenance.ok
        else "bold red"
    )
    for line in provenance.lines():
        console.print(
            Text.assemble(("attestation: ", "bold"), (line, style)), soft_wrap=True, highlight=False
        )


def render(
    record: RunRecord,
    console: Console,
    *,
    rejected_by: str | None = None,
    provenance: Provenance | None = None,
) -> None:
    """`rejected_by`: the option that turns an accepting verdict into a rejection (e.g.
    --require-complete), named on the verdict line so the log says why the job failed.
    `provenance`: what vouches for the statement (a report rendered again from a folder), said
    first and again under the verdict."""
    if provenance is not None:
        render_provenance(provenance, console)
    title = f"imagegate {record.pipeline['name']} · {record.image.reference}"
    # Narrow consoles drop the token column and list tokens below; a log has room for all.
    wide = console.width >= 120
    cut = console.is_terminal  # only a terminal cuts the reason column to its width
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
    limit = max(16, min(TERMINAL_REASON_WIDTH, room)) if cut else None
    table.add_column("reason", overflow="ellipsis", no_wrap=True, max_width=limit)
    for s in record.stages:
        cells: list[str | Text] = [s.id, Text(s.status.value, style=STYLE[s.status])]
        if wide:
            cells.append(s.token)
        table.add_row(*cells, _time(s), one_line(s.detail, limit))
    console.print(table)
    if not wide:
        console.print("tokens: " + " ".join(s.token for s in record.stages), soft_wrap=True, highlight=False)
    _full_reasons(record, console, limit)
    said = view.beside(record)
    note = said.note  # the token names the deferred stages, not what they held back
    verdict = Text.assemble(
        "verdict: ", (record.verdict, verdict_style(record.verdict)), f" ({note})" if note else ""
    )
    if rejected_by:
        verdict.append(f" → rejected: {rejected_by}", style="bold red")
    console.print(verdict, soft_wrap=True)
    if said.chain:
        console.print(said.chain, soft_wrap=True, highlight=False)
    console.print(
        f"image: {record.image.config_digest or record.image.reference}", soft_wrap=True, highlight=False
    )
    console.print(f"evidence: {record.attempt_dir}", soft_wrap=True, highlight=False)
    if provenance is not None and not provenance.ok:
        render_provenance(provenance, console)  # under the verdict too: the last lines a log shows


def _full_reasons(record: RunRecord, console: Console, limit: int | None) -> None:
    """The full reasons of every stage that did not pass, one problem a line: the table keeps one."""
    for s in record.stages:
        count, parts = counted_reasons(s.detail)
        if s.status is Status.PASS or (len(parts) <= 1 and (limit is None or len(s.detail) <= limit)):
            continue
        head = Text.assemble((f"{s.id} {s.status.value}:", STYLE[s.status]))
        console.print(head.append(f" {count}") if count else head)  # "pip_check FAIL: 2 problems"
        for part in parts:
            console.print(f"  - {part}", soft_wrap=True, highlight=False, markup=False)


def render_text(record: RunRecord, width: int = 160, provenance: Provenance | None = None) -> str:
    """The console view as plain text (a report file)."""
    console = Console(record=True, width=width, file=io.StringIO())
    render(record, console, provenance=provenance)
    return console.export_text()
