"""Severity of an advisory: the CVSS v3 base score computed from its vector (FIRST's CVSS v3.1
specification, section 7), or the database's own rating (GHSA-style `database_specific`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

LEVELS = ("low", "medium", "high", "critical")

_AV = {"N": 0.85, "A": 0.62, "L": 0.55, "P": 0.2}
_AC = {"L": 0.77, "H": 0.44}
_PR_UNCHANGED = {"N": 0.85, "L": 0.62, "H": 0.27}
_PR_CHANGED = {"N": 0.85, "L": 0.68, "H": 0.5}
_UI = {"N": 0.85, "R": 0.62}
_CIA = {"H": 0.56, "L": 0.22, "N": 0.0}
# GHSA says MODERATE where CVSS says medium.
_WORDS = {"low": "low", "moderate": "medium", "medium": "medium", "high": "high", "critical": "critical"}


def _roundup(x: float) -> float:
    # CVSS v3.1 Appendix A: round up to one decimal without floating-point surprises.
    n = round(x * 100000)
    return n / 100000.0 if n % 10000 == 0 else (math.floor(n / 10000) + 1) / 10.0


def cvss3_base_score(vector: str) -> float:
    """Base score of a CVSS:3.x vector; ValueError when a base metric is missing or unknown."""
    parts = vector.strip().split("/")
    if not parts[0].startswith("CVSS:3"):
        raise ValueError(f"not a CVSS v3 vector: {vector!r}")
    m = dict(p.split(":", 1) for p in parts[1:] if ":" in p)
    try:
        changed = {"U": False, "C": True}[m["S"]]
        pr = (_PR_CHANGED if changed else _PR_UNCHANGED)[m["PR"]]
        iss = 1 - (1 - _CIA[m["C"]]) * (1 - _CIA[m["I"]]) * (1 - _CIA[m["A"]])
        exploitability = 8.22 * _AV[m["AV"]] * _AC[m["AC"]] * pr * _UI[m["UI"]]
    except KeyError as e:
        raise ValueError(f"CVSS vector {vector!r}: missing or unknown base metric {e}") from e
    impact = 7.52 * (iss - 0.029) - 3.25 * (iss - 0.02) ** 15 if changed else 6.42 * iss
    if impact <= 0:
        return 0.0
    total = 1.08 * (impact + exploitability) if changed else impact + exploitability
    return _roundup(min(total, 10.0))


def level_of_score(score: float) -> str | None:
    if score <= 0:
        return None  # "none" is below every threshold
    return "low" if score < 4 else "medium" if score < 7 else "high" if score < 9 else "critical"


def rank(level: str) -> int:
    return LEVELS.index(level)


def assess(records: Iterable[Mapping[str, Any]]) -> tuple[str | None, float | None]:
    """The highest severity any of the records (an advisory, its affected entries) states:
    `severity: [{type: CVSS_V3, score: vector}]` or `database_specific: {severity: WORD}`.
    Other score types (CVSS v2, v4) are not rated here."""
    level: str | None = None
    score: float | None = None
    for rec in records:
        for s in rec.get("severity") or []:
            if isinstance(s, Mapping) and s.get("type") == "CVSS_V3" and isinstance(s.get("score"), str):
                try:
                    value = cvss3_base_score(s["score"])
                except ValueError:
                    continue
                score = max(score or 0.0, value)
                level = higher(level, level_of_score(value))
        ds = rec.get("database_specific")
        word = ds.get("severity") if isinstance(ds, Mapping) else None
        if isinstance(word, str):
            level = higher(level, _WORDS.get(word.lower()))
    return level, score


def higher(a: str | None, b: str | None) -> str | None:
    if a is None or b is None:
        return a or b
    return a if rank(a) >= rank(b) else b
