"""What every report shows, computed once: the headline, the stage outputs read back from the
evidence folder, the reasons of what did not pass, the layer table. Formats only lay it out."""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from imagegate.domain.results import RunRecord, StageResult, Status, recorded_needs, waiting_on_deferred

OUTPUT_CAP = 64 * 1024  # per stream and stage in a report: the evidence folder keeps it all


def each(value: object) -> Iterable[object]:
    """What `for x in value or []` goes through, for a list read from a statement or a stage's
    data: any iterable as it is (a string's characters too: a report shows what it always
    showed), nothing when it is empty or false; anything else reads as absent."""
    return value if value and isinstance(value, Iterable) else ()


def title(record: RunRecord) -> str:
    return f"imagegate {record.pipeline.get('name', '?')}: {record.image.reference}"


def elapsed_s(record: RunRecord) -> float:
    """Wall time of the attempt; the stages added up when the times cannot be read."""
    try:
        start = dt.datetime.fromisoformat(record.started_at.replace("Z", "+00:00"))
        end = dt.datetime.fromisoformat(record.finished_at.replace("Z", "+00:00"))
        return max((end - start).total_seconds(), 0.0)
    except ValueError:
        return sum(s.duration_s for s in record.stages)


def read_capped(path: Path, cap: int = OUTPUT_CAP) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(cap + 1)
    except OSError:
        return ""
    text = data[:cap].decode("utf-8", "replace")
    return (
        text + f"\n[... cut at {cap} bytes; the full file is {path.name} in the evidence]"
        if len(data) > cap
        else text
    )


def stage_output(record: RunRecord, stage: StageResult, name: str) -> str:
    """The stage's stdout.txt or stderr.txt from the evidence folder ('' when it has none)."""
    for f in stage.evidence:
        if Path(f.path).name == name:
            return read_capped(Path(record.attempt_dir) / f.path)
    return ""


def split_reasons(detail: str) -> list[str]:
    """One problem a line: probes join several problems with '; ', and quote a command they
    name, so a '; ' inside a quoted word belongs to the command, not between two problems. A
    quote opens only where a shell word starts (an apostrophe in "image's" does not)."""
    parts, start, i, n = [], 0, 0, len(detail)
    while i < n:
        ch = detail[i]
        if ch in "'\"" and (i == 0 or detail[i - 1] in " =("):
            end = detail.find(ch, i + 1)
            if end != -1:  # an unmatched quote is text, not quoting
                i = end + 1
                continue
        if detail.startswith("; ", i):
            parts.append(detail[start:i])
            start = i + 2
            i += 2
            continue
        i += 1
    parts.append(detail[start:])
    return [p.strip() for p in parts if p.strip()]


# "2 problems: a; b": a count, then the problems it counts (pip_check's FAIL).
_COUNTED = re.compile(r"(\d+) ([a-z][a-z ()]*): (.+)", re.DOTALL)


def counted_reasons(detail: str) -> tuple[str, list[str]]:
    """('2 problems', [a, b]) for '2 problems: a; b', the count told apart from the first
    problem it counts; ('', the problems) for any other detail."""
    parts = split_reasons(detail)
    m = _COUNTED.fullmatch(parts[0]) if len(parts) > 1 else None
    if m is None or int(m[1]) != len(parts):
        return "", parts
    return f"{m[1]} {m[2]}", [m[3], *parts[1:]]


def reasons(stage: StageResult) -> list[str]:
    """One problem a line; a count that heads them is a line of its own ('2 problems:')."""
    count, parts = counted_reasons(stage.detail)
    return [f"{count}:", *parts] if count else parts


def deferred_skips(record: RunRecord) -> dict[str, list[str]]:
    """SKIPPED stage id -> the DEFERRED stages it waited on (model.waiting_on_deferred): checks
    that never ran, though the verdict token names only the deferred ones."""
    return waiting_on_deferred(record.stages, recorded_needs(record.plan))


def deferred_note(record: RunRecord) -> str:
    """For the verdict line: 'skipped because gpu_cli was deferred: gpu_smoke' ('' if none)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for sid, cause in deferred_skips(record).items():
        groups.setdefault(tuple(cause), []).append(sid)
    return "; ".join(
        f"skipped because {', '.join(cause)} {'was' if len(cause) == 1 else 'were'} deferred: {', '.join(ids)}"
        for cause, ids in groups.items()
    )


def chain_line(record: RunRecord) -> str:
    """A completion (`imagegate complete`): which attempt it completes and how they are linked;
    '' for any other attempt."""
    link = record.completes
    if not link:
        return ""
    earlier = [s.id for s in record.stages if s.data.get("from_attempt")]
    now = [s.id for s in record.stages if not s.data.get("from_attempt")]
    return (
        f"completes attempt {link.get('attempt')} (verdict {link.get('verdict')}, envelope sha256 "
        f"{str(link.get('envelopeSha256', ''))[:16]}…): run now: {', '.join(now) or 'none'}; "
        f"results of the earlier attempt: {', '.join(earlier) or 'none'}"
    )


@dataclass(frozen=True)
class Beside:
    """What every report says beside the verdict: the checks a deferred stage held back
    (deferred_note) and, for a completion, its link (chain_line); '' where there is none."""

    note: str
    chain: str


def beside(record: RunRecord) -> Beside:
    return Beside(deferred_note(record), chain_line(record))


def verdict_line(record: RunRecord) -> str:
    note = deferred_note(record)
    return f"{record.verdict} ({note})" if note else record.verdict


def not_passed(record: RunRecord) -> Iterator[StageResult]:
    return (s for s in record.stages if s.status is not Status.PASS)


@dataclass(frozen=True)
class Timed:
    stage: StageResult
    start_s: float  # seconds from the run's start


def timeline(record: RunRecord) -> list[Timed]:
    """Each stage at its start: where the runner saw it begin (stages run side by side), else
    right after the stage before it (a Pod's log, an older statement)."""
    out, t = [], 0.0
    for s in record.stages:
        start = s.started_s if s.started_s is not None else t
        out.append(Timed(s, start))
        t = max(t, start + s.duration_s) if s.started_s is None else t
    return out


def timeline_span(timed: list[Timed]) -> float:
    """The seconds a timeline covers: to the end of the stage that ended last."""
    return max((t.start_s + t.stage.duration_s for t in timed), default=0.0) or 1.0


LAYERS_EVIDENCE = "layers.json"  # stages/layers.py EVIDENCE_FILE: the per-layer table
MAX_LAYERS_EVIDENCE = 16 << 20


def layer_table(record: RunRecord) -> tuple[StageResult, list[dict[str, object]]] | None:
    """The first layers stage's per-layer results, if the run had one: from its `layers.json`
    evidence (the stage's own data holds only the count), or a list in its data."""
    for s in record.stages:
        if s.probe != "layers":
            continue
        layers = s.data.get("layers")
        if not isinstance(layers, list):
            layers = _evidence_layers(record, s)
        if isinstance(layers, list):
            return s, [x for x in layers if isinstance(x, dict)]
    return None


def _evidence_layers(record: RunRecord, stage: StageResult) -> object:
    from imagegate._support.files import read_regular
    from imagegate.oci import untrusted_json

    for f in stage.evidence:
        if Path(f.path).name != LAYERS_EVIDENCE:
            continue
        try:
            raw = read_regular(Path(record.attempt_dir) / f.path, max_bytes=MAX_LAYERS_EVIDENCE)
            doc = untrusted_json.loads(raw, max_bytes=MAX_LAYERS_EVIDENCE)
        except (OSError, ValueError):
            return None  # a report shows what it can: no table, never a crash
        return doc.get("layers") if isinstance(doc, dict) else None
    return None


def evidence_files(record: RunRecord) -> list[str]:
    """Every evidence file, relative to the attempt folder: the stages' and the attempt's own."""
    from imagegate.attest.statement import attempt_evidence

    seen = [f.path for s in record.stages for f in s.evidence]
    return seen + [f.path for f in attempt_evidence(record) if f.path not in seen]


def link(record: RunRecord, rel: str, base: Path | None) -> str:
    """A path to an evidence file as seen from `base` (the folder a report is written to)."""
    target = Path(record.attempt_dir) / rel
    return os.path.relpath(target, base if base is not None else Path.cwd())


def short_digest(d: str | None, n: int = 12) -> str:
    if not d:
        return "-"
    algo, _, hexd = d.partition(":")
    return f"{algo}:{hexd[:n]}" if hexd else d[:n]
