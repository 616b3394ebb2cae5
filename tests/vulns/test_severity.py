from __future__ import annotations

import pytest

from imagegate.vulns.severity import assess, cvss3_base_score, level_of_score


@pytest.mark.parametrize(
    ("vector", "score"),
    [
        ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H", 9.8),
        ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:N/I:N/A:H", 7.5),
        ("CVSS:3.1/AV:N/AC:L/PR:N/UI:R/S:C/C:L/I:L/A:N", 6.1),
        ("CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:U/C:H/I:N/A:N", 5.5),
        ("CVSS:3.0/AV:N/AC:L/PR:N/UI:N/S:C/C:H/I:H/A:H", 10.0),
        ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:N/I:N/A:N", 0.0),
    ],
)
def test_cvss3_base_scores(vector: str, score: float) -> None:
    assert cvss3_base_score(vector) == score


def test_bad_vectors() -> None:
    with pytest.raises(ValueError, match="not a CVSS v3 vector: 'AV:N/AC:L/Au:N"):
        cvss3_base_score("AV:N/AC:L/Au:N/C:P/I:P/A:P")  # CVSS v2
    with pytest.raises(ValueError, match="base metric"):
        cvss3_base_score("CVSS:3.1/AV:N/AC:L")


def test_levels_and_sources() -> None:
    assert [level_of_score(s) for s in (0.0, 3.9, 4.0, 7.0, 9.0)] == [
        None,
        "low",
        "medium",
        "high",
        "critical",
    ]
    assert assess([{"database_specific": {"severity": "MODERATE"}}]) == ("medium", None)
    # The highest of what the advisory and its affected entries say.
    rec = {"severity": [{"type": "CVSS_V3", "score": "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:N/I:N/A:H"}]}
    assert assess([rec, {"database_specific": {"severity": "CRITICAL"}}]) == ("critical", 7.5)
    assert assess([{"severity": [{"type": "CVSS_V4", "score": "CVSS:4.0/AV:N"}]}]) == (None, None)
