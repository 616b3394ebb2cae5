from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from imagegate.vulns.findings import Package
from imagegate.vulns.osv import AdvisoryDB
from imagegate.vulns.severity import assess, cvss3_base_score, level_of_score
from tests.vulns.conftest import ADVISORY_DB


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
    with pytest.raises(ValueError, match="Missing mandatory metrics"):
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
    # A vector that does not score (v4 without its mandatory metrics) is passed over.
    assert assess([{"severity": [{"type": "CVSS_V4", "score": "CVSS:4.0/AV:N"}]}]) == (None, None)


@pytest.mark.parametrize(
    ("kind", "vector", "expected"),
    [
        # The scores NVD publishes for these vectors; v2 has no "critical".
        ("CVSS_V4", "CVSS:4.0/AV:N/AC:L/AT:N/PR:N/UI:N/VC:H/VI:H/VA:H/SC:N/SI:N/SA:N", ("critical", 9.3)),
        ("CVSS_V4", "CVSS:4.0/AV:N/AC:L/AT:N/PR:N/UI:N/VC:N/VI:N/VA:H/SC:N/SI:N/SA:N", ("high", 8.7)),
        ("CVSS_V2", "AV:N/AC:L/Au:N/C:C/I:C/A:C", ("high", 10.0)),
        ("CVSS_V2", "AV:N/AC:L/Au:N/C:P/I:P/A:P", ("high", 7.5)),
    ],
)
def test_cvss_v2_and_v4_vectors_are_rated(kind: str, vector: str, expected: tuple[str, float]) -> None:
    assert assess([{"severity": [{"type": kind, "score": vector}]}]) == expected


def test_an_advisory_rated_only_by_a_cvss_v4_vector_gets_its_severity(tmp_path: Path) -> None:
    # The PyPA advisory-db's real PYSEC-2024-60 (idna), its rating replaced by a v4 vector alone,
    # as GitHub's advisories now often carry: it was unrated (unknown severity) before.
    record = yaml.safe_load((ADVISORY_DB / "vulns" / "idna" / "PYSEC-2024-60.yaml").read_text())
    record["severity"] = [
        {"type": "CVSS_V4", "score": "CVSS:4.0/AV:N/AC:L/AT:N/PR:N/UI:N/VC:N/VI:N/VA:H/SC:N/SI:N/SA:N"}
    ]
    record.pop("database_specific", None)
    for entry in record["affected"]:
        entry.pop("database_specific", None)
        entry.pop("severity", None)
    (tmp_path / "PYSEC-2024-60.yaml").write_text(yaml.safe_dump(record))
    (finding,) = AdvisoryDB.load(tmp_path).audit([Package("idna", "3.6", ("/site",))]).findings
    assert (finding.id, finding.severity, finding.score) == ("PYSEC-2024-60", "high", 8.7)
