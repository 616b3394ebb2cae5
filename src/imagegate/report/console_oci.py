"""The tables of `imagegate layers` and `imagegate compare` (their JSON is the reports' own
`to_dict()`)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from pathlib import Path

    from imagegate.oci.compare import CompareResult
    from imagegate.oci.layercheck import VerifyReport


def _hex12(d: str | None) -> str:
    return "-" if d is None else d.split(":", 1)[-1][:12]


def render_verify(report: VerifyReport, out: Console) -> None:
    out.print(f"source:   {report.source}")
    if report.index_digest:
        out.print(f"index:    {report.index_digest}")
    out.print(f"manifest: {report.manifest_digest or '(none: legacy docker save archive)'}")
    out.print(f"platform: {report.platform or '?'}")
    c = report.config
    # The blob may hash to its own digest and still be the wrong config: OK only when both hold.
    shown = "NOT THE EXPECTED CONFIG" if c.status.value == "OK" and c.matches_official is False else c.status
    out.print(f"config:   {c.actual_digest} {shown}" + (f" ({c.detail})" if c.detail else ""))
    if c.official_digest:
        out.print(f"expected: {c.official_digest} " + ("MATCH" if c.matches_official else "DIFFERENT"))
    table = Table(box=None, pad_edge=False)
    for col in ("#", "STATUS", "COMPRESSION", "SIZE", "DIGEST", "DIFFID"):
        table.add_column(col, no_wrap=True)
    for x in report.layers:
        table.add_row(
            str(x.index + 1),
            x.status.value,
            x.compression or "-",
            str(x.actual_size if x.actual_size is not None else "-"),
            _hex12(x.expected_digest or x.actual_digest),
            _hex12(x.actual_diff_id or x.expected_diff_id),
        )
    out.print(table)
    for x in report.layers:
        if x.detail:
            out.print(f"layer {x.index + 1} {x.status}: {x.detail}")
            if x.expected_digest or x.actual_digest:
                out.print(f"  digest   expected {x.expected_digest or '-'}  actual {x.actual_digest or '-'}")
            out.print(f"  diffID   expected {x.expected_diff_id or '-'}  actual {x.actual_diff_id or '-'}")
    for p in report.problems:
        out.print(f"problem: {p}")
    n = len(report.layers)
    if report.ok:
        foreign = f" ({report.foreign} foreign layers not verified)" if report.foreign else ""
        known = sum(1 for x in report.layers if x.pair_recorded_at)
        if known:  # said, since the bytes were not read now: --no-cache reads them
            foreign += f" ({known} by a verified pair, not read now; --no-cache reads them)"
        out.print(f"OK: config {c.actual_digest}, {report.verified}/{n} layers verified{foreign}")
    else:
        # Name what failed, first things first; never "0 of N layers failed" as a reason.
        reasons = []
        if c.matches_official is False:
            reasons.append(f"config {c.actual_digest} is not the expected {c.official_digest}")
        if c.status.value != "OK":
            reasons.append(f"config {c.status}")
        if report.failed_layers:
            reasons.append(f"{len(report.failed_layers)} of {n} layers failed")
        if report.problems and not reasons:
            reasons.append(f"{len(report.problems)} problem(s), listed above")
        tail = f" ({report.verified}/{n} layers verified)" if not report.failed_layers else ""
        out.print("FAIL: " + "; ".join(reasons) + tail)


def render_compare(result: CompareResult, out: Console) -> None:
    for label, side in (("official:", result.official), ("mirror:  ", result.mirror)):
        # A legacy docker save archive has no manifest digest: say so rather than "None".
        manifest = side.manifest_digest or "none (docker save archive)"
        out.print(f"{label} {side.source}  manifest {manifest}  config {side.config_digest or '-'}")
    for d in result.layer_diffs:
        out.print(
            f"layer {d.index + 1}: diffID {d.official_diff_id or '-'} (official) vs {d.mirror_diff_id or '-'} (mirror)"
        )
    for f in result.field_diffs:
        out.print(f"config {f.field}: {json.dumps(f.official)} (official) vs {json.dumps(f.mirror)} (mirror)")
    for p in result.problems:
        out.print(f"problem: {p}")
    out.print(result.sentence)


def render_equivalence(files: list[Path], fingerprint: str) -> None:
    """On stderr: stdout may be carrying --format json."""
    print(f"signed with key {fingerprint}:", file=sys.stderr)
    for f in files:
        print(f"  {f}", file=sys.stderr)


def render_not_signed(result: CompareResult) -> None:
    said = {"DIFFERENT": "different image"}.get(result.verdict.value, result.verdict.value.lower())
    print(f"--attest: {said}: no equivalence signed", file=sys.stderr)
