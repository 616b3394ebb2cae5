"""The word a reader takes (attest/word.py), over reports verified with real keys, no registry:
only trusted statements count; every one read must accept and be fresh, as the shipped
ClusterPolicy reads them; the one shown is the newest that refuses, else the newest stale one,
else the newest. The registry side is tests/attest/test_signers.py."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from imagegate.attest import keys, verify, word
from imagegate.attest.vsa import TEST_RESULT_PREDICATE_TYPE, VSA_PREDICATE_TYPE
from imagegate.errors import UsageError
from tests.attest.test_supersede import SUBJECT, acceptance, envelope, index, vsa

A, B = keys.generate(), keys.generate()
NOW = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.timezone.utc)
SCOPE = word.Scope(now=NOW)


def at(hours_ago: float) -> str:
    return (NOW - dt.timedelta(hours=hours_ago)).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def report(
    statement: dict[str, Any], key: keys.SigningKey = A, name: str = "x", expect: str | None = None
) -> verify.Report:
    return verify.verify_envelope(
        envelope(statement, key),
        [A.public],
        source=name,
        predicate_type=str(statement["predicateType"]),
        image_digests=[SUBJECT],
        expect_verdict=expect,
    )


def chosen(*reports: verify.Report, scope: word.Scope = SCOPE) -> verify.Report | None:
    return word.the_word(list(reports), scope)


def test_the_newest_accepting_statement_is_the_word_when_none_refuses() -> None:
    got = chosen(report(acceptance("PASS", at(3)), name="old"), report(acceptance("PASS", at(1)), name="new"))
    assert got is not None and got.source == "new" and got.ok
    assert got.checks[-1].name == "word" and "the newest that decides, of 2 trusted" in got.checks[-1].detail


def test_a_trusted_fail_decides_whether_older_or_newer_than_the_pass() -> None:
    for fail_at, pass_at in ((1, 3), (3, 1)):
        got = chosen(
            report(acceptance("FAIL", at(fail_at)), name="fail"),
            report(acceptance("PASS", at(pass_at)), name="pass"),
        )
        assert got is not None and got.source == "fail" and got.verdict == "FAIL"
        beside = "still attached beside the later PASS" in got.checks[-1].detail
        assert beside == (fail_at > pass_at), got.checks[-1]


def test_of_two_refusing_statements_the_newest_is_shown() -> None:
    got = chosen(report(acceptance("ERROR", at(5)), name="e"), report(acceptance("FAIL", at(2)), name="f"))
    assert got is not None and got.source == "f"


def test_another_signers_or_a_changed_statement_is_not_read() -> None:
    untrusted = report(acceptance("FAIL", at(1)), key=B, name="other")
    got = chosen(untrusted, report(acceptance("PASS", at(2)), name="mine"))
    assert got is not None and got.source == "mine" and "of 1 trusted" in got.checks[-1].detail
    assert chosen(untrusted) is None
    wrong_subject = report(acceptance("FAIL", at(1), subject="sha256:" + "cd" * 32), name="elsewhere")
    assert chosen(wrong_subject) is None


def test_an_expected_verdict_is_judged_on_the_word_not_a_reason_to_skip_it() -> None:
    fail = report(acceptance("FAIL", at(1)), name="fail", expect="PASS")
    got = chosen(fail, report(acceptance("PASS", at(2)), name="pass", expect="PASS"))
    assert got is not None and got.source == "fail" and not got.ok


def test_a_stale_statement_refuses_unless_the_bound_is_lifted() -> None:
    old, fresh = (
        report(acceptance("PASS", at(200)), name="old"),
        report(acceptance("PASS", at(1)), name="fresh"),
    )
    got = chosen(old, fresh)
    assert (
        got is not None and got.source == "old" and not got.ok and "older than 168h" in got.checks[-1].detail
    )
    # (the word is said on the report chosen: each reading from fresh reports, as verify makes them)
    old, fresh = (
        report(acceptance("PASS", at(200)), name="old"),
        report(acceptance("PASS", at(1)), name="fresh"),
    )
    lifted = chosen(old, fresh, scope=word.Scope(max_age=None, now=NOW))
    assert lifted is not None and lifted.source == "fresh" and lifted.ok
    old = report(acceptance("PASS", at(200)), name="old")
    bounded = chosen(old, scope=word.Scope(max_age=dt.timedelta(hours=201), now=NOW))
    assert bounded is not None and bounded.ok
    assert (
        chosen(report(acceptance("PASS", None))) is not None
        and not chosen(report(acceptance("PASS", None))).ok
    )  # type: ignore[union-attr]


def test_a_refusing_statement_is_shown_before_a_stale_one() -> None:
    got = chosen(
        report(acceptance("PASS", at(300)), name="stale"), report(acceptance("FAIL", at(1)), name="fail")
    )
    assert got is not None and got.source == "fail"


def test_one_pipeline_is_read_alone_when_asked() -> None:
    other = report(acceptance("FAIL", at(1), source="builtin:vllm"), name="vllm")
    mine = report(acceptance("PASS", at(2)), name="python")
    asked = chosen(other, mine, scope=word.Scope(pipeline="builtin:python", now=NOW))
    assert (
        asked is not None
        and asked.source == "python"
        and "of pipeline builtin:python" in asked.checks[-1].detail
    )
    assert chosen(other, mine, scope=word.Scope(pipeline="builtin:sglang", now=NOW)) is None
    assert word.Scope.of("python", None).pipeline == "builtin:python"
    assert word.Scope.of("./p/x.yaml", "0").max_age is None


@pytest.mark.parametrize(
    ("statement", "refuses"),
    [
        (acceptance("PASS"), False),
        (acceptance("CPU_PASS_GPU_CLI_DEFERRED"), False),
        (acceptance("FAIL"), True),
        (acceptance("ERROR"), True),
        (acceptance("MAYBE"), True),
        (vsa("PASSED"), False),
        (vsa("FAILED"), True),
        (
            {**acceptance(), "predicateType": TEST_RESULT_PREDICATE_TYPE, "predicate": {"result": "WARNED"}},
            False,
        ),
        (
            {**acceptance(), "predicateType": TEST_RESULT_PREDICATE_TYPE, "predicate": {"result": "FAILED"}},
            True,
        ),
        (index(at(1), [at(2)], "FAIL"), True),
    ],
)
def test_what_refuses(statement: dict[str, Any], refuses: bool) -> None:
    assert word.refuses(statement) is refuses


def test_freshness_reads_what_the_policies_read() -> None:
    v = vsa("PASSED", at(1))
    v["predicate"]["timeVerified"] = at(300)  # an index's oldest run: what the ClusterPolicy reads
    assert word.fresh_as_of(v) == NOW - dt.timedelta(hours=300)
    i = index(at(1), [at(250), at(2)])
    i["predicate"]["verifiedOn"] = at(250)
    assert word.fresh_as_of(i) == NOW - dt.timedelta(hours=250)
    assert word.fresh_as_of(acceptance("PASS", at(4))) == NOW - dt.timedelta(hours=4)
    assert v["predicateType"] == VSA_PREDICATE_TYPE


@pytest.mark.parametrize(
    ("text", "hours"),
    [("168h", 168), ("7d", 168), ("90m", 1.5), ("3600", 1), ("3600s", 1), ("0", None), ("none", None)],
)
def test_ages(text: str, hours: float | None) -> None:
    got = word.parse_age(text)
    assert (got.total_seconds() / 3600 if got else None) == hours


def test_an_age_that_is_not_one_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="not a duration"):
        word.parse_age("soon")


FOREIGN = "https://z.example/attestation/v1"  # a type sorting after every one of imagegate's


def test_a_report_already_judged_failing_is_not_trusted_again() -> None:
    judged = report(acceptance("PASS", at(1)))
    judged.add("word", "failed", "judged before")
    assert not word.trusted(judged)
    assert word.trusted(report(acceptance("PASS", at(1))))


@pytest.mark.parametrize(
    ("predicate", "refuses"),
    [
        ({"verificationResult": "PASSED", "result": "PASSED"}, True),  # another tool's: accepts nothing
        ({"verificationResult": "WARNED"}, True),
    ],
)
def test_outcomes_no_one_defined_refuse(predicate: dict[str, Any], refuses: bool) -> None:
    statement = {**acceptance(), "predicateType": FOREIGN, "predicate": predicate}
    assert word.refuses(statement) is refuses
    assert word.refuses({**vsa(), "predicate": {"verificationResult": "WARNED"}})
    assert word.refuses(
        {**acceptance(), "predicateType": TEST_RESULT_PREDICATE_TYPE, "predicate": {"result": "ERROR"}}
    )


def test_another_types_time_is_not_read_for_freshness() -> None:
    from imagegate.attest.vsa import TIME_FIELD

    foreign = {
        "predicateType": FOREIGN,
        "predicate": {"timeVerified": at(1), "verifiedOn": at(1), TIME_FIELD: at(1)},
    }
    assert word.fresh_as_of(foreign) is None
    tr = {"predicateType": TEST_RESULT_PREDICATE_TYPE, "predicate": {TIME_FIELD: at(3), "verifiedOn": at(9)}}
    assert word.fresh_as_of(tr) == NOW - dt.timedelta(hours=3)


def test_a_statement_exactly_at_the_bound_is_fresh() -> None:
    got = chosen(report(acceptance("PASS", at(168))))
    assert got is not None and got.ok, got.checks


def test_the_word_names_the_scope_it_read() -> None:
    got = chosen(report(acceptance("PASS", at(1))))
    assert got is not None and "(every pipeline: --pipeline reads one)" in got.checks[-1].detail


def test_a_fail_beside_a_later_pass_of_another_pipeline_is_not_said_to_be_superseded() -> None:
    other = report(acceptance("PASS", at(1), source="builtin:vllm"), name="vllm")
    got = chosen(report(acceptance("FAIL", at(3)), name="fail"), other)
    assert got is not None and got.source == "fail" and "still attached" not in got.checks[-1].detail
    assert "the newest that decides" in got.checks[-1].detail


def test_a_fail_beside_later_passes_names_the_newest_and_where_it_is() -> None:
    got = chosen(
        report(acceptance("FAIL", at(5)), name="fail"),
        report(acceptance("PASS", at(3)), name="pass-3h"),
        report(acceptance("PASS", at(1)), name="pass-1h"),
    )
    assert got is not None and "still attached beside the later PASS" in got.checks[-1].detail
    assert "at pass-1h" in got.checks[-1].detail and "pass-3h" not in got.checks[-1].detail


def test_the_default_bound_is_the_shipped_cluster_policys() -> None:
    """`verify --image` is as strict as the ClusterPolicy it predicts: the same freshness bound."""
    import re

    from imagegate import policies

    policy = policies.text("kyverno-clusterpolicy")
    bounds = set(
        re.findall(
            r"timeVerified \}\}', ''\) \}\}\"\n\s+operator: LessThanOrEquals\n\s+value: (\d+)h", policy
        )
    )
    assert bounds and {word.DEFAULT_MAX_AGE} == {dt.timedelta(hours=int(b)) for b in bounds}
