"""The policy: thresholds, ignores with a reason and an expiry date, expired ignores fail."""

from __future__ import annotations

import datetime as dt

import pytest
from pydantic import ValidationError

from imagegate.pipeline.params import VulnIgnore, VulnsParams
from imagegate.vulns.findings import Finding
from imagegate.vulns.policy import decide

TODAY = dt.date(2026, 6, 1)
PIP = Finding("PYSEC-2023-228", ("CVE-2023-5752",), "pip", "23.0.1", ("23.3",), "low", 3.3)
PILLOW = Finding("PYSEC-2023-227", ("CVE-2023-44271",), "pillow", "9.5.0", ("10.0.0",), "high", 7.5)
UNRATED = Finding("PYSEC-2023-74", ("CVE-2023-32681",), "requests", "2.25.1", ("2.31.0",))


def params(**kw: object) -> VulnsParams:
    return VulnsParams.model_validate(kw)


def test_fail_on_any() -> None:
    d = decide([PIP, PILLOW], params(), TODAY)
    assert d.failed and d.counted == (PIP, PILLOW)
    assert not decide([], params(), TODAY).failed


def test_severity_threshold_and_unknown_severity() -> None:
    d = decide([PIP, PILLOW, UNRATED], params(fail_on="high"), TODAY)
    assert d.counted == (PILLOW, UNRATED) and d.below == (PIP,)
    d = decide([PIP, UNRATED], params(fail_on="medium", unknown_severity="pass"), TODAY)
    assert not d.failed and d.below == (PIP, UNRATED)


def test_ignore_by_id_or_alias_until_its_expiry_day() -> None:
    for vid in ("PYSEC-2023-228", "cve-2023-5752"):
        ig = {"id": vid, "reason": "pip is not run in production", "expires": "2026-06-01"}
        d = decide([PIP], params(ignore=[ig]), TODAY)
        assert not d.failed and d.state(PIP) == "ignored"
        assert d.ignore_of(PIP) is not None and d.ignore_of(PIP).reason == ig["reason"]  # type: ignore[union-attr]
        # the day after its expiry it covers nothing: the finding counts, and the run fails
        after = decide([PIP], params(ignore=[ig]), TODAY + dt.timedelta(days=1))
        assert after.failed and after.counted == (PIP,) and after.state(PIP) != "ignored"


def test_expired_ignore_fails_and_no_longer_covers() -> None:
    ig = {"id": "CVE-2023-5752", "reason": "accepted for the 0.9 release", "expires": "2026-05-31"}
    d = decide([PIP], params(ignore=[ig]), TODAY)
    assert d.failed and d.counted == (PIP,) and [i.id for i in d.expired] == ["CVE-2023-5752"]


def test_expired_ignore_fails_even_when_nothing_matches_it() -> None:
    ig = {"id": "PYSEC-2000-1", "reason": "old", "expires": "2020-01-01"}
    d = decide([], params(ignore=[ig]), TODAY)
    assert d.failed and not d.counted


def test_ignore_scoped_to_a_package() -> None:
    ig = {"id": "PYSEC-2023-228", "reason": "r", "expires": "2099-01-01", "package": "Pillow"}
    assert decide([PIP], params(ignore=[ig]), TODAY).failed
    ig["package"] = "PIP"
    assert not decide([PIP], params(ignore=[ig]), TODAY).failed


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"id": "PYSEC-2023-228", "expires": "2099-01-01"}, r"reason\n\s+Field required"),
        ({"id": "PYSEC-2023-228", "reason": "  ", "expires": "2099-01-01"}, "an ignore needs a reason"),
        ({"id": "PYSEC-2023-228", "reason": "r"}, r"expires\n\s+Field required"),
        (
            {"id": "PYSEC-2023-228", "reason": "r", "expires": "someday"},
            r"expires\n\s+Input should be a valid date",
        ),
        (
            {"id": "PYSEC-2023-228", "reason": "r", "expires": "2099-01-01", "until": "x"},
            r"until\n\s+Extra inputs are not permitted",
        ),
    ],
)
def test_an_ignore_needs_a_reason_and_an_expiry_date(entry: dict[str, str], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        VulnIgnore.model_validate(entry)
