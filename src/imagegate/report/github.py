"""GitHub Actions: a step summary (markdown appended to the file `GITHUB_STEP_SUMMARY` names)
and workflow-command annotations (`::error title=...::message`) for the stages that did not pass.

Annotations are written to stderr: the Actions runner reads workflow commands from both streams,
and stdout may be carrying a machine format that must stay clean."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TextIO

from imagegate.domain.results import RunRecord, Status
from imagegate.report import markdown, view
from imagegate.report.provenance import Provenance

# GitHub shows at most 10 annotations of each kind per step: the rest stay in the summary.
MAX_ANNOTATIONS = 10
_COMMAND = {Status.FAIL: "error", Status.ERROR: "error", Status.DEFERRED: "notice"}


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def provenance_line(record: RunRecord, provenance: Provenance) -> str:
    """One annotation for what vouches for the statement: an error when something contradicts
    it, a warning when nothing vouches for it, a notice otherwise."""
    command = (
        "notice"
        if provenance.ok and provenance.signature == "verified"
        else "warning"
        if provenance.ok
        else "error"
    )
    title = f"imagegate attestation ({record.image.reference})"
    return f"::{command} title={escape_property(title)}::{escape_data(chr(10).join(provenance.lines()))}"


def render(record: RunRecord, provenance: Provenance | None = None) -> str:
    """`imagegate report -f github`: the workflow commands (annotations) a run prints in
    GitHub Actions, the attestation's first."""
    lines = [provenance_line(record, provenance)] if provenance is not None else []
    return "".join(x + "\n" for x in [*lines, *annotation_lines(record)])


def annotation_lines(record: RunRecord) -> list[str]:
    lines = []
    held_back = view.deferred_skips(record)  # never ran, though the verdict token does not say so
    for s in record.stages:
        command = _COMMAND.get(s.status) or ("notice" if s.id in held_back else None)
        if command is None:
            continue
        title = f"imagegate {s.token} ({record.image.reference})"
        message = "\n".join(view.reasons(s)) or s.status.value
        if s.id in held_back:
            causes = held_back[s.id]
            message = f"never ran: skipped because {', '.join(causes)} {'was' if len(causes) == 1 else 'were'} deferred"
        lines.append(f"::{command} title={escape_property(title)}::{escape_data(message)}")
    return lines[:MAX_ANNOTATIONS]


def publish(record: RunRecord, stream: TextIO, env: Mapping[str, str] | None = None) -> None:
    """Inside GitHub Actions (only there: the variables say so): append the step summary and
    print the annotations. Elsewhere, nothing."""
    env = os.environ if env is None else env
    summary = env.get("GITHUB_STEP_SUMMARY")
    if summary:
        # Appended: several steps and several runs in one step each add their own part.
        with open(summary, "a", encoding="utf-8") as f:
            f.write(markdown.render(record) + "\n")
    if env.get("GITHUB_ACTIONS") == "true":
        for line in annotation_lines(record):
            stream.write(line + "\n")
        stream.flush()
