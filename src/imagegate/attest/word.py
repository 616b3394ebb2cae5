"""The word a reader takes from the statements attached to an image (docs/attestations.md, "What
each reader takes as the word"): only statements that verify with a trusted key count, and by
default the rule is the shipped Kyverno ClusterPolicy's, the strictest of the controllers —
every trusted statement read must accept the image and be fresh — so that `verify --image` is
never looser than the admission it predicts. Of those it reads, it shows the one that decides:
the newest that refuses, else the newest stale one, else the newest."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from imagegate._support.jsontypes import JsonMapping, obj
from imagegate.attest.platforms import INDEX_PREDICATE_TYPE
from imagegate.attest.replace import canonical_pipeline, instant, outcome, pipeline_of, when
from imagegate.attest.vsa import TEST_RESULT_PREDICATE_TYPE, TIME_FIELD, VSA_PREDICATE_TYPE
from imagegate.errors import UsageError

if TYPE_CHECKING:  # verify reads the word; the word needs only the shape of its reports
    from imagegate.attest.verify import Report

# The freshness bound of the shipped policies (data/policies/kyverno-clusterpolicy.yaml: 168h).
DEFAULT_MAX_AGE = timedelta(hours=168)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(text: str) -> timedelta | None:
    """`168h`, `7d`, `90m`, `3600s` (or a bare number of seconds); `0` or `none`: no bound."""
    if text.strip().lower() in ("0", "none", "off"):
        return None
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if found is None:
        raise UsageError(
            f"--max-age {text!r}: not a duration", hint="e.g. 168h, 7d, 90m; 0 turns freshness off"
        )
    return timedelta(seconds=float(found.group(1)) * _UNITS[found.group(2) or "s"])


@dataclass(frozen=True)
class Scope:
    """What a reader reads: one pipeline or all, statements no older than `max_age` (None: any)."""

    pipeline: str | None = None
    max_age: timedelta | None = DEFAULT_MAX_AGE
    now: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    @staticmethod
    def of(pipeline: str | None, max_age: str | None) -> Scope:
        return Scope(
            canonical_pipeline(pipeline) if pipeline else None,
            DEFAULT_MAX_AGE if max_age is None else parse_age(max_age),
        )


def trusted(report: Report) -> bool:
    """A statement whose signature verified with a trusted key and whose form and subject are
    right: the verdict check, if any, is what is judged after."""
    return report.statement is not None and all(c.ok for c in report.checks if c.name != "verdict")


def refuses(statement: JsonMapping) -> bool:
    """Whether the statement's own word refuses the image: a verdict `run` does not exit 0 on,
    a VSA not PASSED, a test-result neither PASSED nor WARNED (what each controller's rule
    refuses; an outcome no one defined accepts nothing)."""
    from imagegate.domain.results import exit_code
    from imagegate.errors import EXIT_ACCEPTED

    kind = statement.get("predicateType")
    said = outcome(statement)
    if kind == VSA_PREDICATE_TYPE:
        return said != "PASSED"
    if kind == TEST_RESULT_PREDICATE_TYPE:
        return said not in ("PASSED", "WARNED")
    try:
        return exit_code(said) != EXIT_ACCEPTED
    except ValueError:
        return True  # a verdict this imagegate does not write accepts nothing


def fresh_as_of(statement: JsonMapping) -> datetime | None:
    """The instant a freshness rule reads: a VSA's `timeVerified` (an index's oldest run), an
    index statement's `verifiedOn` (the same), else when it was said."""
    pred = obj(statement.get("predicate"))
    kind = statement.get("predicateType")
    if kind == VSA_PREDICATE_TYPE:
        return instant(pred.get("timeVerified"))
    if kind == INDEX_PREDICATE_TYPE:
        return instant(pred.get("verifiedOn"))
    if kind == TEST_RESULT_PREDICATE_TYPE:
        return instant(pred.get(TIME_FIELD))
    return when(statement)


def _stale(statement: JsonMapping, scope: Scope) -> bool:
    if scope.max_age is None:
        return False
    said = fresh_as_of(statement)
    return said is None or scope.now - said > scope.max_age


def _in_scope(report: Report, scope: Scope) -> bool:
    return scope.pipeline is None or pipeline_of(report.statement or {}) == scope.pipeline


def the_word(reports: Sequence[Report], scope: Scope) -> Report | None:
    """Of the verified reports of one image's statements, the one that decides under `scope`,
    with a check named `word` saying why it and not another; None when none is trusted."""
    read = [r for r in reports if trusted(r) and _in_scope(r, scope)]
    if not read:
        return None
    newest_first = sorted(read, key=lambda r: when(r.statement or {}) or _EPOCH, reverse=True)
    refusing = [r for r in newest_first if refuses(r.statement or {})]
    stale = [r for r in newest_first if _stale(r.statement or {}, scope)]
    chosen = (refusing or stale or newest_first)[0]
    _explain(chosen, newest_first, scope, is_stale=bool(stale) and not refusing)
    return chosen


def _said(report: Report, *, where: bool = False) -> str:
    """What a statement said, of which pipeline, when (and, for another than the one shown, where)."""
    st = report.statement or {}
    moment = when(st)
    said = f"{outcome(st)} of pipeline {pipeline_of(st) or '?'}, said {moment.isoformat() if moment else 'no time'}"
    return f"{said}, at {report.source}" if where else said


def _explain(chosen: Report, newest_first: list[Report], scope: Scope, *, is_stale: bool) -> None:
    of = f"{len(newest_first)} trusted statement(s) read"
    of += f" of pipeline {scope.pipeline}" if scope.pipeline else " (every pipeline: --pipeline reads one)"
    if is_stale:
        bound = f"{scope.max_age.total_seconds() / 3600:g}h" if scope.max_age else ""
        chosen.add(
            "word",
            "failed",
            f"{_said(chosen)}: older than {bound} (--max-age; the shipped policies refuse a "
            f"statement past 168h); {of}",
        )
        return
    mine = pipeline_of(chosen.statement or {})
    later = [
        r
        for r in newest_first[: newest_first.index(chosen)]
        if not refuses(r.statement or {}) and pipeline_of(r.statement or {}) == mine
    ]
    if refuses(chosen.statement or {}) and later:
        chosen.add(
            "word",
            "ok",
            f"{_said(chosen)}, still attached beside the later {_said(later[0], where=True)}: the shipped "
            "ClusterPolicy refuses on every trusted failing statement, and so does this; attach the "
            f"later attempt again to supersede it (same key, same pipeline), or remove it; {of}",
        )
        return
    chosen.add("word", "ok", f"{_said(chosen)}: the newest that decides, of {of}")
