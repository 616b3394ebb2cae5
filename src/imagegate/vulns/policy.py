"""The pipeline's policy over findings: what counts (any finding, or a severity and above), what
is ignored (each ignore has a reason and an expiry date), and that an expired ignore fails the
stage until someone renews or removes it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from imagegate.pipeline.params import VulnIgnore, VulnsParams
from imagegate.vulns import severity
from imagegate.vulns.findings import Finding


@dataclass(frozen=True)
class Decision:
    failed: bool
    counted: tuple[Finding, ...]  # fail the stage
    ignored: tuple[tuple[Finding, VulnIgnore], ...]  # an ignore in force covers them
    below: tuple[Finding, ...]  # under the severity threshold
    expired: tuple[VulnIgnore, ...]  # past their date: each fails the stage

    def state(self, f: Finding) -> str:
        if f in self.counted:
            return "counted"
        return "ignored" if any(f is g for g, _ in self.ignored) else "below_threshold"

    def ignore_of(self, f: Finding) -> VulnIgnore | None:
        return next((i for g, i in self.ignored if g is f), None)


def covers(ignore: VulnIgnore, f: Finding) -> bool:
    if ignore.id.upper() not in f.ids:
        return False
    return ignore.package is None or canonicalize_name(ignore.package) == f.package


def counts(f: Finding, params: VulnsParams) -> bool:
    if params.fail_on == "any":
        return True
    if f.severity is None:
        return params.unknown_severity == "fail"
    return severity.rank(f.severity) >= severity.rank(params.fail_on)


def decide(findings: Sequence[Finding], params: VulnsParams, today: dt.date | None = None) -> Decision:
    """`today` is a UTC date; an ignore applies up to and including its `expires` day."""
    today = today or dt.datetime.now(dt.timezone.utc).date()
    active = [i for i in params.ignore if i.expires >= today]
    expired = tuple(i for i in params.ignore if i.expires < today)
    counted, ignored, below = [], [], []
    for f in findings:
        hit = next((i for i in active if covers(i, f)), None)
        if hit is not None:
            ignored.append((f, hit))
        elif counts(f, params):
            counted.append(f)
        else:
            below.append(f)
    return Decision(bool(counted or expired), tuple(counted), tuple(ignored), tuple(below), expired)
