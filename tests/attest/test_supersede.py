"""Who may replace what (attest/replace.py), statement against statement, with real keys and
real signatures, no registry: a write supersedes only what its writer can prove it superseded —
the same signer, verified, imagegate's, the same subject, predicate type and pipeline, older.
The registry side (the same rules through `attach`, on `.att` and among the referrers, and
`verify --image`) is tests/attest/test_signers.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from imagegate.attest import dsse, keys, replace, sign
from imagegate.attest import statement as st
from imagegate.attest.platforms import INDEX_PREDICATE_TYPE
from imagegate.attest.vsa import TEST_RESULT_PREDICATE_TYPE, TIME_FIELD, VERIFIER_ID, VSA_PREDICATE_TYPE
from imagegate.errors import NotVerified

SUBJECT = "sha256:" + "ab" * 32
A, B = keys.generate(), keys.generate()


def acceptance(
    verdict: str = "PASS",
    finished: str | None = "2026-12-01T10:00:00.000Z",
    source: str = "builtin:python",
    subject: str = SUBJECT,
) -> dict[str, Any]:
    return {
        "_type": st.STATEMENT_TYPE,
        "subject": [{"name": "r/app", "digest": {"sha256": subject.partition(":")[2]}}],
        "predicateType": st.PREDICATE_TYPE,
        "predicate": {
            "verdict": verdict,
            "pipeline": {"name": "python", "source": source, "sha256": "a" * 64},
            "finishedOn": finished,
        },
    }


def vsa(
    result: str = "PASSED", said: str | None = "2026-12-01T10:00:00.000Z", verifier: str = VERIFIER_ID
) -> dict[str, Any]:
    pred: dict[str, Any] = {
        "verifier": {"id": verifier},
        "timeVerified": "2026-11-01T00:00:00Z",
        "policy": {"uri": "builtin:python"},
        "verificationResult": result,
    }
    if said is not None:
        pred[TIME_FIELD] = said
    return {**acceptance(), "predicateType": VSA_PREDICATE_TYPE, "predicate": pred}


def envelope(statement: dict[str, Any], key: keys.SigningKey = A) -> dsse.Envelope:
    return dsse.sign(sign.serialize(statement), key)


def new(statement: dict[str, Any], key: keys.SigningKey = A) -> replace.Signed:
    return replace.verified(envelope(statement, key), [key.public], "new")


def decided(new_statement: dict[str, Any], old: dsse.Envelope | None) -> replace.Decision | None:
    return replace.decide(new(new_statement), old, SUBJECT, "layer sha256:1")


LATER = "2026-12-01T11:00:00.000Z"


def test_the_same_signers_older_word_of_the_pipeline_is_replaced() -> None:
    d = decided(acceptance("PASS", LATER), envelope(acceptance("FAIL")))
    assert d is not None and d.action == "replace" and d.entry.outcome == "FAIL"
    assert d.entry.describe() == "layer sha256:1 (acceptance FAIL)"


def test_a_newer_word_of_the_same_signer_is_never_replaced() -> None:
    d = decided(acceptance("PASS"), envelope(acceptance("FAIL", LATER)))
    assert d is not None and d.action == "newer" and "2026-12-01T11:00:00+00:00" in d.why
    with pytest.raises(replace.NewerThere, match=r"is not newer than .*\(acceptance FAIL\)") as e:
        replace.refuse_if_newer(new(acceptance("PASS")), [d], "the attestation")
    assert e.value.exit_code == 1


def test_the_same_instant_replaces_only_the_same_word() -> None:
    old = envelope(acceptance("PASS"))
    resigned = acceptance("PASS")
    resigned["predicate"]["attempt"] = "made again"  # another statement, the same word, one instant
    again = decided(resigned, old)
    assert again is not None and again.action == "replace"
    other = decided(acceptance("FAIL"), old)  # which of two words at one instant is later: unknown
    assert other is not None and other.action == "newer"


@pytest.mark.parametrize(
    ("old", "why"),
    [
        (envelope(acceptance("FAIL"), B), "not signed by key"),  # another signer's word
        (envelope(acceptance("FAIL", source="builtin:vllm")), "another pipeline's (builtin:vllm)"),
        (envelope(acceptance("FAIL", subject="sha256:" + "cd" * 32)), "about another image"),
        (envelope({**acceptance("FAIL"), "predicate": {"verdict": "FAIL"}}), "another tool's statement"),
    ],
)
def test_what_is_not_the_writers_to_supersede_is_kept_and_says_why(old: dsse.Envelope, why: str) -> None:
    d = decided(acceptance("PASS", LATER), old)
    assert d is not None and d.action == "keep" and why in d.why, d


def test_an_envelope_changed_after_signing_is_kept() -> None:
    good = envelope(acceptance("FAIL"))
    forged = dataclasses.replace(good, signatures=(dsse.Signature(good.signatures[0].sig[::-1]),))
    d = decided(acceptance("PASS", LATER), forged)
    assert d is not None and d.action == "keep" and "changed after signing" in d.why


def test_the_same_statement_is_there_already() -> None:
    same = new(acceptance("PASS"))
    d = replace.decide(same, same.envelope, SUBJECT, "layer sha256:1")
    assert d is not None and d.action == "same"


def test_another_predicate_type_or_no_statement_is_not_judged() -> None:
    assert decided(acceptance("PASS", LATER), envelope(vsa("FAILED"))) is None
    assert decided(acceptance("PASS", LATER), None) is None
    junk = dsse.Envelope(b"[1, 2]", dsse.INTOTO_PAYLOAD_TYPE, (dsse.Signature(b"x"),))
    assert decided(acceptance("PASS", LATER), junk) is None


def test_a_vsa_is_ordered_by_the_acceptance_it_sits_beside_and_another_verifiers_is_kept() -> None:
    d = decided(vsa("PASSED", LATER), envelope(vsa("FAILED")))
    assert d is not None and d.action == "replace"
    assert decided(vsa("PASSED"), envelope(vsa("FAILED", LATER))).action == "newer"  # type: ignore[union-attr]
    other = decided(vsa("PASSED", LATER), envelope(vsa("FAILED", verifier="https://other.example/v")))
    assert other is not None and other.action == "keep" and "another tool's" in other.why
    # an earlier imagegate's VSA, without the field: its timeVerified orders it
    older = decided(vsa("PASSED", LATER), envelope(vsa("FAILED", said=None)))
    assert older is not None and older.action == "replace"


def test_a_test_result_without_a_time_is_older_and_a_new_one_without_is_never_newer() -> None:
    timed = {**acceptance(), "predicateType": TEST_RESULT_PREDICATE_TYPE}
    timed["predicate"] = {
        "result": "PASSED",
        "configuration": [{"name": "builtin:python"}],
        TIME_FIELD: LATER,
    }
    untimed = {**timed, "predicate": {k: v for k, v in timed["predicate"].items() if k != TIME_FIELD}}
    assert (
        decided(
            timed, envelope({**untimed, "predicate": {**untimed["predicate"], "result": "FAILED"}})
        ).action
        == "replace"
    )  # type: ignore[union-attr]
    assert (
        decided(untimed, envelope({**timed, "predicate": {**timed["predicate"], "result": "FAILED"}})).action
        == "newer"
    )  # type: ignore[union-attr]


def index(made: str, runs: list[str], verdict: str = "PASS") -> dict[str, Any]:
    statement = acceptance(verdict, made)
    statement["predicateType"] = INDEX_PREDICATE_TYPE
    statement["predicate"]["platforms"] = [{"finishedOn": r} for r in runs]
    return statement


def test_an_index_made_later_from_older_runs_does_not_supersede() -> None:
    old = envelope(index("2026-12-01T12:00:00.000Z", ["2026-12-01T11:00:00.000Z"], "FAIL"))
    later_runs = index("2026-12-01T13:00:00.000Z", ["2026-12-01T11:30:00.000Z"])
    assert decided(later_runs, old).action == "replace"  # type: ignore[union-attr]
    older_runs = index("2026-12-01T13:00:00.000Z", ["2026-12-01T09:00:00.000Z", "2026-12-01T10:00:00.000Z"])
    assert decided(older_runs, old).action == "newer"  # type: ignore[union-attr]
    assert replace.newest_run(older_runs) is not None and replace.newest_run(older_runs).hour == 10  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("spelled", "canonical"),
    [
        ("builtin:vllm", "builtin:vllm"),
        ("vllm", "builtin:vllm"),
        ("./pipelines/x.yaml", "pipelines/x.yaml"),
        ("pipelines//x.yaml", "pipelines/x.yaml"),
        ("pipelines/../pipelines/x.yaml", "pipelines/x.yaml"),
        ("x.yaml", "x.yaml"),
        ("/abs/p/x.yml", "/abs/p/x.yml"),
    ],
)
def test_two_spellings_of_one_pipeline_are_one(spelled: str, canonical: str) -> None:
    assert replace.canonical_pipeline(spelled) == canonical
    assert replace.pipeline_of(acceptance(source=spelled)) == canonical


def test_two_spellings_of_one_pipeline_file_supersede_each_other() -> None:
    d = decided(
        acceptance("FAIL", LATER, source="./pipelines/x.yaml"),
        envelope(acceptance(source="pipelines/x.yaml")),
    )
    assert d is not None and d.action == "replace"


def test_a_new_statement_must_verify_with_a_key_given() -> None:
    signed = envelope(acceptance())
    assert replace.verified(signed, [B.public, A.public], "f").signer == A.public
    with pytest.raises(NotVerified, match="does not verify with key"):
        replace.verified(signed, [B.public], "f")
    with pytest.raises(NotVerified, match="with no key"):
        replace.verified(signed, [], "f")
    forged = dataclasses.replace(signed, payload=sign.serialize(acceptance("FAIL")))
    with pytest.raises(NotVerified):
        replace.verified(forged, [A.public], "f")
    other_type = dataclasses.replace(dsse.sign(b"{}", A, "text/plain"))
    with pytest.raises(NotVerified, match="not an in-toto statement"):
        replace.verified(other_type, [A.public], "f")


FOREIGN = "https://z.example/attestation/v1"  # a type sorting after every one of imagegate's


@pytest.mark.parametrize(
    "statement",
    [
        {**vsa(), "predicateType": FOREIGN},  # a verifier and policy as imagegate's, another type
        {**vsa(), "predicate": {**vsa()["predicate"], "verifier": {"id": "https://other.example/v"}}},
        {"predicateType": TEST_RESULT_PREDICATE_TYPE, "predicate": {"configuration": []}},
        {"predicateType": TEST_RESULT_PREDICATE_TYPE, "predicate": {"configuration": [{"name": "a"}] * 3}},
        {
            "predicateType": TEST_RESULT_PREDICATE_TYPE,
            "predicate": {"configuration": [{"name": "a"}, {"name": "b"}]},
        },
        {"predicateType": TEST_RESULT_PREDICATE_TYPE, "predicate": {"configuration": ["builtin:python"]}},
        {"predicateType": TEST_RESULT_PREDICATE_TYPE, "predicate": {"configuration": [{"name": 7}]}},
        {"predicateType": TEST_RESULT_PREDICATE_TYPE, "predicate": {"configuration": [{"name": ""}]}},
        {"predicateType": st.PREDICATE_TYPE, "predicate": {"pipeline": {"source": ["x"]}}},
    ],
)
def test_what_is_not_recognisably_imagegates_names_no_pipeline(statement: dict[str, Any]) -> None:
    assert replace.pipeline_of(statement) is None


def test_a_test_result_names_its_pipeline_first_and_at_most_the_probes_bundle() -> None:
    one = {
        "predicateType": TEST_RESULT_PREDICATE_TYPE,
        "predicate": {"configuration": [{"name": "builtin:vllm"}]},
    }
    assert replace.pipeline_of(one) == "builtin:vllm"
    two = {**one, "predicate": {"configuration": [{"name": "p/x.yaml"}, {"name": replace.PROBES_BUNDLE}]}}
    assert replace.pipeline_of(two) == "p/x.yaml"
    assert replace.pipeline_of(vsa()) == "builtin:python"


@pytest.mark.parametrize("text", ["", 7, None, "yesterday", "2026-13-01T00:00:00Z"])
def test_a_time_that_is_not_one_is_none(text: Any) -> None:
    assert replace.instant(text) is None


def test_a_time_without_a_zone_is_utc() -> None:
    got = replace.instant("2026-12-01T10:00:00")
    assert got is not None and got.utcoffset() is not None and got.hour == 10


def test_an_envelope_of_another_payload_type_is_not_written() -> None:
    other = dsse.sign(sign.serialize(acceptance()), A, "application/json")  # sorts before in-toto's
    with pytest.raises(NotVerified, match="not an in-toto statement"):
        replace.verified(other, [A.public], "f")


def test_another_predicate_type_sorting_before_is_not_judged_either() -> None:
    earlier = {**acceptance("FAIL"), "predicateType": "https://a.example/attestation/v1"}
    assert decided(acceptance("PASS", LATER), envelope(earlier)) is None


def test_the_same_word_said_later_there_is_still_newer() -> None:
    d = decided(acceptance("PASS"), envelope(acceptance("PASS", LATER)))
    assert d is not None and d.action == "newer"


def test_runs_listed_on_another_statement_than_an_index_do_not_order_it() -> None:
    """Only an index statement is ordered by its runs: platforms listed on an acceptance or a VSA
    (anyone's field) change nothing."""
    old = acceptance("FAIL")
    old["predicate"]["platforms"] = [{"finishedOn": "2026-12-02T00:00:00.000Z"}]
    assert decided(acceptance("PASS", LATER), envelope(old)).action == "replace"  # type: ignore[union-attr]
    old_vsa = vsa("FAILED")
    old_vsa["predicate"]["platforms"] = [{"finishedOn": "2026-12-02T00:00:00.000Z"}]
    assert decided(vsa("PASSED", LATER), envelope(old_vsa)).action == "replace"  # type: ignore[union-attr]


def test_an_index_made_again_from_the_same_runs_supersedes() -> None:
    runs = ["2026-12-01T11:00:00.000Z"]
    d = decided(
        index("2026-12-01T13:00:00.000Z", runs), envelope(index("2026-12-01T12:00:00.000Z", runs, "FAIL"))
    )
    assert d is not None and d.action == "replace"


def test_a_pipeline_sorting_before_is_another_pipeline_too() -> None:
    d = decided(acceptance("PASS", LATER), envelope(acceptance("FAIL", source="builtin:aaa")))
    assert d is not None and d.action == "keep" and "another pipeline's (builtin:aaa)" in d.why


def test_only_a_newer_word_refuses() -> None:
    entry = replace.Replaced("layer sha256:1", st.PREDICATE_TYPE, "FAIL")
    for action in ("keep", "replace", "same"):
        replace.refuse_if_newer(new(acceptance()), [replace.Decision(action, entry)], "f")  # type: ignore[arg-type]
