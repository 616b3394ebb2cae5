"""One self-contained HTML page per attempt, for people who would rather look than read: the
verdict, a timeline of the stages, the reasons, the layer table, each stage's output and links
to the raw evidence files. No script, no font, no image from anywhere: a Content-Security-Policy
forbids every fetch, so the page shows the same offline, from a CI artifact or a laptop."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from urllib.parse import quote

from imagegate.domain.results import RunRecord, StageResult, Status
from imagegate.report import view
from imagegate.report.provenance import Provenance

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

COLOR = {
    Status.PASS: "#1a7f37",
    Status.FAIL: "#cf222e",
    Status.ERROR: "#8250df",
    Status.DEFERRED: "#bf8700",
    Status.SKIPPED: "#6e7781",
}

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
main{max-width:1100px;margin:0 auto;padding:24px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px}
.card{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:16px;margin:12px 0}
.verdict{display:inline-block;font-size:26px;font-weight:700;color:#fff;padding:6px 16px;border-radius:6px}
.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin-top:12px}
.facts dt{color:#59636e} .facts dd{margin:0;font-family:ui-monospace,monospace;word-break:break-all}
table{border-collapse:collapse;width:100%} th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #d8dee4;vertical-align:top}
th{color:#59636e;font-weight:600} .num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
code,pre{font-family:ui-monospace,SFMono-Regular,monospace;font-size:12px}
pre{background:#f6f8fa;border:1px solid #d8dee4;border-radius:6px;padding:8px;overflow:auto;max-height:320px;white-space:pre-wrap}
.badge{display:inline-block;color:#fff;border-radius:4px;padding:0 6px;font-size:12px;font-weight:600}
.tl{display:grid;grid-template-columns:160px 1fr 70px;gap:4px 8px;align-items:center}
.track{position:relative;height:18px;background:#eaeef2;border-radius:3px}
.bar{position:absolute;top:0;height:18px;border-radius:3px;min-width:3px}
.scroll{overflow-x:auto} #layers td:last-child{min-width:220px}
#stages td{overflow-wrap:anywhere} #stages td:nth-child(1),#stages td:nth-child(2),#stages td:nth-child(4){overflow-wrap:normal;white-space:nowrap}
ul.reasons{margin:4px 0 12px 0;padding-left:20px} details{margin:6px 0} summary{cursor:pointer}
"""


def _badge(status: Status) -> str:
    return f'<span class="badge" style="background:{COLOR[status]}">{status.value}</span>'


def verdict_color(verdict: str) -> str:
    if verdict == "PASS":
        return COLOR[Status.PASS]
    return (
        COLOR[Status.FAIL]
        if verdict == "FAIL"
        else COLOR[Status.ERROR]
        if verdict == "ERROR"
        else COLOR[Status.DEFERRED]
    )


def _facts(record: RunRecord) -> str:
    img, env = record.image, record.environment
    rows = [
        ("image", img.reference),
        ("config digest", img.config_digest or "-"),
        ("manifest digest", img.manifest_digest or "-"),
        ("platform", img.platform or "-"),
        (
            "pipeline",
            f"{record.pipeline.get('name', '?')} v{record.pipeline.get('version', '?')} ({record.pipeline.get('source', '?')})",
        ),
        (
            "environment",
            f"driver {env.get('driver') or '?'}, engine {env.get('engine') or '-'}, python {env.get('python') or '?'}",
        ),
        ("started / finished", f"{record.started_at} / {record.finished_at}"),
        ("attempt", record.attempt_dir),
        ("imagegate", record.imagegate_version),
    ]
    body = "".join(f"<dt>{escape(k)}</dt><dd>{escape(str(v))}</dd>" for k, v in rows)
    return f'<dl class="facts">{body}</dl>'


def _timeline(record: RunRecord) -> str:
    timed = view.timeline(record)
    total = view.timeline_span(timed)
    rows = []
    for t in timed:
        s = t.stage
        left, width = 100 * t.start_s / total, 100 * s.duration_s / total
        rows.append(
            f"<div><code>{escape(s.id)}</code> {_badge(s.status)}</div>"
            f'<div class="track" title="{escape(s.token)}: {escape(s.detail[:200])}">'
            f'<div class="bar" style="left:{left:.2f}%;width:{width:.2f}%;background:{COLOR[s.status]}"></div></div>'
            f'<div class="num">{s.duration_s:.2f} s</div>'
        )
    return f'<div class="tl" id="timeline">{"".join(rows)}</div>'


def _href(record: RunRecord, rel: str, base: Path | None) -> str:
    return quote(view.link(record, rel, base))


def _stage_table(record: RunRecord, base: Path | None) -> str:
    rows = []
    for s in record.stages:
        files = " ".join(
            f'<a href="{_href(record, f.path, base)}">{escape(Path(f.path).name)}</a>' for f in s.evidence
        )
        rows.append(
            f'<tr data-stage="{escape(s.id)}" data-status="{s.status.value}"><td><code>{escape(s.id)}</code></td>'
            f"<td>{_badge(s.status)}</td><td><code>{escape(s.token)}</code></td>"
            f'<td class="num">{s.duration_s:.2f} s</td><td>{escape((view.split_reasons(s.detail) or [""])[0])}</td>'
            f"<td>{files}</td></tr>"
        )
    head = "<tr><th>stage</th><th>status</th><th>token</th><th>time</th><th>detail</th><th>evidence</th></tr>"
    return f'<table id="stages">{head}{"".join(rows)}</table>'


def _reasons(record: RunRecord) -> str:
    parts = []
    for s in view.not_passed(record):
        count, said = view.counted_reasons(s.detail)
        items = "".join(f"<li>{escape(r)}</li>" for r in said)
        counted = f": {escape(count)}" if count else ""
        parts.append(
            f'<div>{_badge(s.status)} <code>{escape(s.id)}</code>{counted}<ul class="reasons">{items}</ul></div>'
        )
    return "".join(parts) or "<p>Every stage passed.</p>"


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, str) and value.startswith("sha256:"):
        return f'<code title="{escape(value)}">{escape(view.short_digest(value, 16))}</code>'
    return escape(value if isinstance(value, str) else json.dumps(value))


def _layers(record: RunRecord) -> str:
    found = view.layer_table(record)
    if found is None:
        return ""
    stage, layers = found
    cols = [
        ("#", "index"),
        ("status", "status"),
        ("compression", "compression"),
        ("digest (manifest)", "expected_digest"),
        ("digest (read)", "actual_digest"),
        ("size", "actual_size"),
        ("diffID (config)", "expected_diff_id"),
        ("diffID (recomputed)", "actual_diff_id"),
        ("detail", "detail"),
    ]
    head = "".join(f"<th>{escape(c)}</th>" for c, _ in cols)
    # Layers are numbered from 1, as `imagegate layers` prints them.
    shown = [{**x, "index": i + 1 if isinstance(i := x.get("index"), int) else i} for x in layers]
    rows = "".join("<tr>" + "".join(f"<td>{_cell(x.get(k))}</td>" for _, k in cols) + "</tr>" for x in shown)
    return (
        f"<h2>Layers <small>({escape(stage.id)}: {escape(stage.detail[:160])})</small></h2>"
        f'<div class="card scroll"><table id="layers"><tr>{head}</tr>{rows}</table></div>'
    )


def _outputs(record: RunRecord) -> str:
    parts = []
    for s in record.stages:
        streams = [(n, view.stage_output(record, s, f"{n}.txt")) for n in ("stdout", "stderr")]
        body = "".join(f"<div>{n}</div><pre>{escape(text)}</pre>" for n, text in streams if text)
        detail = f"<div>detail</div><pre>{escape(s.detail)}</pre>" if s.detail else ""
        parts.append(
            f"<details{' open' if s.status in (Status.FAIL, Status.ERROR) else ''}>"
            f"<summary><code>{escape(s.id)}</code> {_badge(s.status)}</summary>{detail}{body or '<p>no output</p>'}</details>"
        )
    return "".join(parts)


def _evidence(record: RunRecord, base: Path | None) -> str:
    items = "".join(
        f'<li><a href="{_href(record, rel, base)}">{escape(rel)}</a></li>'
        for rel in view.evidence_files(record)
    )
    return f'<ul id="evidence">{items}</ul>'


def _stage_summary(stages: list[StageResult]) -> str:
    counts = {st: sum(1 for s in stages if s.status is st) for st in Status}
    return ", ".join(f"{n} {st.value.lower()}" for st, n in counts.items() if n)


def _chain(record: RunRecord) -> str:
    line = view.chain_line(record)
    return f'<p id="chain"><strong>Chain:</strong> {escape(line)}</p>' if line else ""


def _not_run(record: RunRecord) -> str:
    note = view.deferred_note(record)
    return f'<p id="not-run"><strong>Not run:</strong> {escape(note)}</p>' if note else ""


def _provenance(provenance: Provenance | None) -> str:
    if provenance is None:
        return ""
    color = COLOR[Status.PASS] if provenance.signature == "verified" and provenance.ok else COLOR[Status.FAIL]
    if provenance.ok and provenance.signature != "verified":
        color = COLOR[Status.DEFERRED]
    items = "".join(f"<li>{escape(line)}</li>" for line in provenance.lines())
    return (
        f'<div id="provenance" class="card" data-ok="{str(provenance.ok).lower()}" '
        f'data-signature="{escape(provenance.signature)}" style="border:2px solid {color}">'
        f'<strong style="color:{color}">Attestation</strong><ul class="reasons">{items}</ul></div>\n'
    )


def render(record: RunRecord, base: Path | None = None, *, provenance: Provenance | None = None) -> str:
    """`base`: the folder the page is written to, so that evidence links work from there.
    `provenance`: what vouches for the statement (a report rendered again from a folder)."""
    v = record.verdict
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>{escape(v)} · {escape(view.title(record))}</title>
<style>{STYLE}</style></head>
<body><main>
{_provenance(provenance)}<div class="card">
<h1>{escape(view.title(record))}</h1>
<div id="verdict" class="verdict" data-verdict="{escape(v)}" style="background:{verdict_color(v)}">{escape(v)}</div>
<span style="margin-left:12px">{len(record.stages)} stages: {_stage_summary(record.stages)} · {view.elapsed_s(record):.1f} s</span>
{_chain(record)}{_not_run(record)}{_facts(record)}
</div>
<h2>Timeline</h2><div class="card">{_timeline(record)}</div>
<h2>Stages</h2><div class="card">{_stage_table(record, base)}</div>
<h2>Reasons</h2><div class="card" id="reasons">{_reasons(record)}</div>
{_layers(record)}
<h2>Stage output</h2><div class="card">{_outputs(record)}</div>
<h2>Raw evidence</h2><div class="card">{_evidence(record, base)}</div>
</main></body></html>
"""
