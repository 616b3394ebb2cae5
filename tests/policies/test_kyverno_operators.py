"""Kyverno's condition operators as tests/policies/engines.py writes them, held to Kyverno's own
code (kyverno/kyverno v1.19.0, pkg/engine/variables/operator: equal.go, anyin.go, numeric.go,
operator.go; the cases marked "kyverno" are rows of its equal_test.go and numeric_test.go), for
the types the ClusterPolicy compares: a JMESPath count against 0, strings against strings, a
list or a missing field against a wildcard list, a Go duration against "168h". A looser engine
than Kyverno's would admit a VSA Kyverno refuses."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import yaml

from tests.policies import admission, engines

# (key, value, Kyverno's Equals): in Kyverno every JSON or JMESPath number is a float64.
EQUALS = [
    (0.0, 0.0, True),  # the ClusterPolicy's GPU-route count against `value: 0`
    (0, 0.0, True),
    (3.0, 0.0, False),
    (0.0, "0", True),  # a number against a numeric string: strconv.ParseFloat (kyverno)
    ("0", 0.0, False),  # a string against a number: no string pattern in a number
    ("0", 0, False),
    ("PASSED", "PASSED", True),
    ("FAILED", "PASSED", False),
    ("hello-world", "hello-*", True),  # kyverno: the value is a wildcard pattern
    ("hello", 123, False),  # kyverno
    (True, "true", False),  # kyverno
    (True, "True", False),
    (1.0, True, False),
    (None, None, False),  # a missing field: "Unsupported type"
    (None, "None", False),
    ("1h", "60m", True),  # kyverno: durations
    ("1h", "30m", False),  # kyverno
    ("1Gi", "1024Mi", True),  # kyverno: quantities
    ("1", "1*", False),  # a quantity key against a string that is none: not equal
    (10.5, 10, False),  # kyverno
    (3.14, "3.14", True),  # kyverno
    (3.14, "abc", False),  # kyverno
    (["a", "b"], ["a", "b"], True),
    ([1.0], [True], False),
    ({"a": 1.0}, {"a": 1}, True),
]


@pytest.mark.parametrize(("key", "value", "expected"), EQUALS)
def test_equals_is_kyvernos(key: Any, value: Any, expected: bool) -> None:
    assert engines.operator_holds("Equals", key, value) is expected


ANY_IN = [
    (["IMAGEGATE_CPU", "IMAGEGATE_GPU"], ["IMAGEGATE_GPU"], True),
    (["IMAGEGATE_CPU"], ["IMAGEGATE_GPU"], False),
    ([], ["IMAGEGATE_CPU"], False),
    ("python", ["*"], True),
    ("pipelines/vllm.yaml", ["pipelines/*"], True),
    ("python", ["pyth?n"], True),
    ("python", ["vllm", "sglang"], False),
    (None, ["*"], False),  # a VSA without the field: "Unsupported type", never "*"
    ({"uri": "x"}, ["*"], False),
    (1.0, ["1"], True),  # fmt.Sprint(float64(1)) is "1"
    (1.5, ["1.5"], True),
    (True, ["true"], True),  # fmt.Sprint(true) is "true"
    (True, ["True"], False),
    ("a", '["a", "b"]', True),  # a value written as a JSON array
    ("a", "123", False),  # JSON, but not an array of strings: an invalid type
]


@pytest.mark.parametrize(("key", "value", "expected"), ANY_IN)
def test_any_in_is_kyvernos(key: Any, value: Any, expected: bool) -> None:
    assert engines.operator_holds("AnyIn", key, value) is expected


NUMERIC = [
    ("GreaterThan", 1.0, 0.0, True),  # the ClusterPolicy's count against `value: 0`
    ("GreaterThan", 0.0, 0.0, False),
    ("LessThanOrEquals", "167h59m59s", "168h", True),  # time_since against the freshness bound
    ("LessThanOrEquals", "168h0m0.001s", "168h", False),
    ("LessThanOrEquals", 3600.0, "1h", True),  # a number of seconds against a duration
    ("GreaterThan", "100", 50, True),  # kyverno
    ("GreaterThan", "1.2.3", "1.2.2", True),  # kyverno: semver
    ("GreaterThan", "1.0.0", "1.0.0-rc.1", True),
    ("GreaterThan", "200Mi", "100Mi", True),  # kyverno: quantities
    ("GreaterThanOrEquals", "500m", "0.5", True),  # kyverno
    ("GreaterThan", True, 5, False),  # kyverno: unsupported type key
    ("GreaterThan", "not-a-number", 5, False),  # kyverno
    ("GreaterThan", None, 5, False),  # kyverno: nil key
    ("LessThanOrEquals", None, "168h", False),  # no time: never fresh
]


@pytest.mark.parametrize(("op", "key", "value", "expected"), NUMERIC)
def test_numeric_operators_are_kyvernos(op: str, key: Any, value: Any, expected: bool) -> None:
    assert engines.operator_holds(op, key, value) is expected


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("168h", 604800.0), ("1h2m3.5s", 3723.5), ("-1.5h", -5400.0), ("1.5us", 1.5e-6), ("0", 0.0)],
)
def test_durations_parse_as_go_parses_them(text: str, seconds: float) -> None:
    assert engines.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["1", "", "h", "1d", "1h ", "1.h2"])
def test_what_go_does_not_parse_is_no_duration(text: str) -> None:
    assert engines.parse_duration(text) is None


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(72 * 3600 + 180.5, "72h3m0.5s"), (300.0, "5m0s"), (1.5, "1.5s"), (0.0015, "1.5ms"), (0.0, "0s")],
)
def test_time_since_prints_as_gos_duration_string(seconds: float, text: str) -> None:
    """Kyverno's time_since returns time.Duration.String(): what a condition compares."""
    assert engines.go_duration(seconds) == text


def _shipped_conditions() -> list[dict[str, Any]]:
    policy = yaml.safe_load(admission.KYVERNO.read_text())
    (att,) = policy["spec"]["rules"][0]["verifyImages"][0]["attestations"]
    conditions: list[dict[str, Any]] = att["conditions"]
    return conditions


def test_a_vsa_missing_a_field_the_conditions_read_is_refused() -> None:
    """The ClusterPolicy as shipped ("*" pipelines) on a passing VSA: admitted; without
    `policy.uri`, or with `verificationResult` null, refused, as Kyverno's AnyIn and Equals
    refuse a nil key ("*" is no match for a missing field)."""
    now = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
    predicate = {
        "verifier": {"id": "https://imagegate.dev/verifier"},
        "verificationResult": "PASSED",
        "verifiedLevels": ["IMAGEGATE_CPU"],
        "policy": {"uri": "python", "digest": {"sha256": "ab" * 32}},
        "timeVerified": "2026-11-30T00:00:00Z",
    }
    conditions = _shipped_conditions()
    assert engines.conditions_hold(conditions, predicate, now)
    no_uri = {**predicate, "policy": {"digest": {"sha256": "ab" * 32}}}
    assert not engines.conditions_hold(conditions, no_uri, now)
    assert not engines.conditions_hold(conditions, {**predicate, "verificationResult": None}, now)
