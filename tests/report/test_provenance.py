"""What every report format says about where its statement came from (report.provenance): which
signature state passes, which fails, and the words for each. tests/report/test_signed_source.py
shows the same through `imagegate report` on real attempts; these run in a second and are what
scripts/mutation.py runs against the module."""

from __future__ import annotations

import pytest

from imagegate.report.provenance import CHECK_HINT, Provenance

FP = "sha256:ab12"


@pytest.mark.parametrize(
    ("provenance", "ok"),
    [
        (Provenance("verified", FP), True),
        (Provenance("not checked"), True),  # flagged in words, not failed: no --key was given
        (Provenance("unsigned"), True),  # the same: nothing asked for a check
        (Provenance("unsigned", FP), False),  # --key asked for a check that cannot pass
        (Provenance("failed", FP), False),
        (Provenance("unreadable", problems=("x: cannot read it",)), False),
        (Provenance("unreadable"), False),
        (Provenance("verified", FP, differs=True), False),  # statement.json edited after signing
        (Provenance("verified", FP, problems=("result.json in s: differs",)), False),
    ],
)
def test_a_report_passes_only_when_nothing_contradicts_the_signed_statement(
    provenance: Provenance, ok: bool
) -> None:
    assert provenance.ok is ok


def test_each_state_is_said_in_words_the_first_line_what_vouches() -> None:
    assert Provenance("verified", FP).lines() == [f"signature verified with key {FP}"]
    assert Provenance("failed", FP).lines() == [
        f"SIGNATURE FAILED: no signature of the attestation verifies with key {FP}: "
        "signed with another key, or changed after signing"
    ]
    assert Provenance("not checked").lines() == [f"signed; {CHECK_HINT}"]
    assert CHECK_HINT == "signature not checked — pass --key PUB to check it"
    unsigned = (
        "UNSIGNED: the attempt has no attestation (run without --no-sign): nothing vouches for this statement"
    )
    assert Provenance("unsigned").lines() == [unsigned]
    assert Provenance("unsigned", FP).lines() == [unsigned + f"; --key {FP} cannot be checked"]
    assert Provenance("unreadable", problems=("e: bad",)).lines() == [
        "ATTESTATION UNREADABLE: this report shows statement.json, which nothing vouches for",
        "e: bad",
    ]
    edited = Provenance("verified", FP, differs=True, problems=("run.json in a: differs", "b"))
    assert edited.lines() == [
        f"signature verified with key {FP}",
        "STATEMENT.JSON DIFFERS from the signed statement (edited after signing): this report shows the signed one",
        "run.json in a: differs",
        "b",
    ]
    assert edited.summary() == "; ".join(edited.lines())
