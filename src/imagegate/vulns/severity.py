"""Severity of an advisory: the CVSS base score computed from its vector (v2, v3.x or v4.0, by
the `cvss` library, which follows FIRST's specifications and their reference calculators), or the
database's own rating (GHSA-style `database_specific`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from imagegate._support.jsontypes import JsonMapping
from imagegate.vulns.strict import iterated

LEVELS = ("low", "medium", "high", "critical")

# GHSA says MODERATE where CVSS says medium.
_WORDS = {"low": "low", "moderate": "medium", "medium": "medium", "high": "high", "critical": "critical"}
# OSV's severity types, by the CVSS version that scores them.
SCORED = ("CVSS_V2", "CVSS_V3", "CVSS_V4")


def base_score(kind: str, vector: str) -> float:
    """Base score of an OSV severity entry's vector; ValueError when it is not a valid vector of
    its kind."""
    from cvss import CVSS2, CVSS3, CVSS4
    from cvss.exceptions import CVSSError

    calculator = {"CVSS_V2": CVSS2, "CVSS_V3": CVSS3, "CVSS_V4": CVSS4}.get(kind)
    if calculator is None:
        raise ValueError(f"not a CVSS severity type: {kind!r}")
    try:
        return float(calculator(vector.strip()).base_score)
    except (CVSSError, AttributeError, KeyError, IndexError) as e:
        raise ValueError(f"{kind} vector {vector!r}: {e}") from e


def cvss3_base_score(vector: str) -> float:
    """Base score of a CVSS:3.x vector; ValueError when it is not one."""
    if not vector.strip().startswith("CVSS:3"):
        raise ValueError(f"not a CVSS v3 vector: {vector!r}")
    return base_score("CVSS_V3", vector)


def level_of_v2_score(score: float) -> str | None:
    # CVSS v2 has no "critical": NVD's v2 ratings stop at high (7.0-10.0).
    level = level_of_score(score)
    return "high" if level == "critical" else level


def level_of_score(score: float) -> str | None:
    if score <= 0:
        return None  # "none" is below every threshold
    return "low" if score < 4 else "medium" if score < 7 else "high" if score < 9 else "critical"


def rank(level: str) -> int:
    return LEVELS.index(level)


def assess(records: Iterable[JsonMapping]) -> tuple[str | None, float | None]:
    """The highest severity any of the records (an advisory, its affected entries) states:
    `severity: [{type: CVSS_V2 | CVSS_V3 | CVSS_V4, score: vector}]` or `database_specific:
    {severity: WORD}`. A vector that does not score is passed over."""
    level: str | None = None
    score: float | None = None
    for rec in records:
        for s in iterated(rec.get("severity") or []):
            if isinstance(s, Mapping) and s.get("type") in SCORED and isinstance(s.get("score"), str):
                try:
                    value = base_score(str(s["type"]), s["score"])
                except ValueError:
                    continue
                score = max(score or 0.0, value)
                level = higher(
                    level, (level_of_v2_score if s["type"] == "CVSS_V2" else level_of_score)(value)
                )
        ds = rec.get("database_specific")
        word = ds.get("severity") if isinstance(ds, Mapping) else None
        if isinstance(word, str):
            level = higher(level, _WORDS.get(word.lower()))
    return level, score


def higher(a: str | None, b: str | None) -> str | None:
    if a is None or b is None:
        return a or b
    return a if rank(a) >= rank(b) else b
