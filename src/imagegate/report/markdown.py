"""Markdown: for pull-request comments, wikis and the GitHub Actions step summary (GitHub
Flavored Markdown: tables, <details>)."""

from __future__ import annotations

from pathlib import Path

from imagegate.domain.results import RunRecord, Status
from imagegate.report import view
from imagegate.report.provenance import Provenance

ICON = {
    Status.PASS: "✅",
    Status.FAIL: "❌",
    Status.ERROR: "⛔",
    Status.DEFERRED: "⏸️",
    Status.SKIPPED: "⏭️",
}


def verdict_icon(verdict: str) -> str:
    if verdict == "PASS":
        return "✅"
    return "❌" if verdict == "FAIL" else "⛔" if verdict == "ERROR" else "⏸️"


def cell(text: str, width: int = 160) -> str:
    """One table cell: one line, pipes escaped, HTML tags shown as text (GitHub renders them)."""
    text = " ".join(text.split())
    if len(text) > width:
        text = text[: width - 1] + "…"
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def code(text: str) -> str:
    return "`" + text.replace("`", "'") + "`"


def provenance_lines(provenance: Provenance | None) -> list[str]:
    """A quoted block under the heading: what vouches for the statement, what differs from it."""
    if provenance is None:
        return []
    icon = "🔏" if provenance.ok and provenance.signature == "verified" else "⚠️" if provenance.ok else "🚨"
    lines = provenance.lines()
    return [
        f"> {icon} **Attestation:** {cell(lines[0], 400)}",
        *(f"> - {cell(x, 400)}" for x in lines[1:]),
        "",
    ]


def render(record: RunRecord, base: Path | None = None, *, provenance: Provenance | None = None) -> str:
    del base  # evidence is named by path; a summary or comment has nowhere to link it to
    img = record.image
    lines = [
        f"## {verdict_icon(record.verdict)} imagegate: {record.verdict}: {code(img.reference)}",
        "",
        *provenance_lines(provenance),
        " · ".join(
            [
                f"pipeline {code(str(record.pipeline.get('name', '?')))} v{record.pipeline.get('version', '?')}",
                f"config {code(view.short_digest(img.config_digest))}",
                f"driver {record.environment.get('driver') or '?'}",
                f"{view.elapsed_s(record):.1f} s",
            ]
        ),
        "",
        *([f"**Chain:** {cell(chain, 400)}", ""] if (chain := view.chain_line(record)) else []),
        *([f"**Not run:** {cell(note, 400)}", ""] if (note := view.deferred_note(record)) else []),
        "| stage | status | token | time | reason |",
        "|---|---|---|---:|---|",
    ]
    for s in record.stages:
        lines.append(
            f"| {s.id} | {ICON[s.status]} {s.status.value} | {code(s.token)} | {s.duration_s:.2f} s | {cell(s.detail)} |"
        )
    problems = [s for s in view.not_passed(record)]
    if problems:
        lines += ["", "### Reasons", ""]
        for s in problems:
            count, parts = view.counted_reasons(s.detail)
            lines.append(f"- **{s.id}** {s.status.value}" + (f": {count}" if count else ""))
            lines += [f"  - {cell(r, 400)}" for r in parts]
    lines += ["", f"Evidence: {code(record.attempt_dir)}", ""]
    return "\n".join(lines)
