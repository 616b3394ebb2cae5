"""One signer's word never erases another's, and every reader takes the same word: `attach` and
`verify --image` against the real registry the tests start (Debian's docker-registry: the `.att`
tag and the referrers fallback tag), with two real keys, a forged envelope, attaches out of order,
two spellings of one pipeline, and statements appended by hand as an append-only registry or
anyone with push rights leaves them."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from imagegate.attest import attach, bundle, dsse, keys, sign
from imagegate.attest.envelopes import read_envelopes
from tests.attest.conftest import Result, cli, pub_of
from tests.attest.test_registry import _signed
from tests.attest.test_replace import _pipeline, _push, _read, _said

pytestmark = pytest.mark.engine

A, B = keys.generate(), keys.generate()


def _state(ref: str) -> tuple[str, str]:
    """The digests of the `.att` manifest and of the referrers fallback index: what a write changes."""
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        digest = attach.resolve(client, parsed).digests[0]
    host, repo = parsed.registry, parsed.repository
    out = []
    for tag in (attach.attestation_tag(digest), digest.replace(":", "-")):
        r = httpx.head(
            f"http://{host}/v2/{repo}/manifests/{tag}",
            headers={
                "Accept": "application/vnd.oci.image.manifest.v1+json,application/vnd.oci.image.index.v1+json"
            },
            timeout=10,
        )
        out.append(r.headers.get("Docker-Content-Digest", str(r.status_code)))
    return out[0], out[1]


def _attach(path: Path, ref: str, *pubs: Path) -> Result:
    return cli("attach", str(path), ref, *(a for p in pubs for a in ("--key", str(p))))


def _verify(ref: str, *pubs: Path, extra: tuple[str, ...] = ()) -> Result:
    return cli("verify", "--image", ref, *(a for p in pubs for a in ("--key", str(p))), *extra)


def _words(ref: str) -> dict[str, list[str]]:
    """Each place's acceptance verdicts, by signer: A, B or another."""
    got = _read(ref)
    out: dict[str, list[str]] = {}
    for place, found in got.items():
        out[place] = sorted(
            f"{_signer(s)}:{_said(s)}" for s in found if s["predicateType"].endswith("acceptance/v1")
        )
    return out


def _signer(statement: dict[str, Any]) -> str:
    return str(statement["predicate"].get("attempt", {}).get("id", "?"))[:1].upper()


def test_two_signers_of_one_pipeline_each_keep_their_word(registry: str, image: str, tmp_path: Path) -> None:
    ref = _push(image, registry, "two-signers")
    pub_a, pub_b = pub_of(A, tmp_path), pub_of(B, tmp_path)
    passed = _attach(_signed(tmp_path, ref, A, "PASS", "a-pass"), ref, pub_a)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    failed = _attach(_signed(tmp_path, ref, B, "FAIL", "b-fail"), ref, pub_b)
    assert failed.returncode == 0, failed.stdout + failed.stderr
    assert "replaced" not in failed.stdout
    assert failed.stdout.count("kept layer") == 3 and failed.stdout.count("kept referrer") == 3, failed.stdout
    assert "(acceptance PASS): not signed by key" in failed.stdout
    assert _words(ref) == {"att": ["A:PASS", "B:FAIL"], "referrers": ["A:PASS", "B:FAIL"]}
    # each verifies with its own key; trusting both, the newer FAIL decides
    mine = _verify(ref, pub_a)
    assert mine.returncode == 0 and "verdict PASS, accepted" in mine.stdout, mine.stdout + mine.stderr
    theirs = _verify(ref, pub_b)
    assert theirs.returncode == 1 and "verdict FAIL is not accepted" in theirs.stdout, theirs.stdout
    both = _verify(ref, pub_a, pub_b)
    assert both.returncode == 1 and "FAIL of pipeline builtin:python" in both.stdout, both.stdout
    # A's next word supersedes A's own, and B's stays
    again = _attach(_signed(tmp_path, ref, A, "FAIL", "a-fail"), ref, pub_a)
    assert again.returncode == 0 and again.stdout.count("replaced layer") == 3, again.stdout
    assert _words(ref) == {"att": ["A:FAIL", "B:FAIL"], "referrers": ["A:FAIL", "B:FAIL"]}


def test_a_forged_or_unverifiable_envelope_is_refused_and_deletes_nothing(
    registry: str, image: str, tmp_path: Path
) -> None:
    ref = _push(image, registry, "forged")
    pub_a = pub_of(A, tmp_path)
    assert _attach(_signed(tmp_path, ref, A, "PASS", "a-pass"), ref, pub_a).returncode == 0
    before = _state(ref)
    fail = _signed(tmp_path, ref, A, "FAIL", "a-fail")
    (env,) = read_envelopes(fail)
    forged = dataclasses.replace(env, signatures=(dsse.Signature(env.signatures[0].sig[::-1]),))
    # its signature bytes altered, in the Sigstore bundle that carries it to the referrer
    (fail.parent / sign.BUNDLE_FILE).write_text(json.dumps(bundle.to_bundle(forged, A.public)))
    r = _attach(fail.parent / sign.BUNDLE_FILE, ref, pub_a)
    assert r.returncode == 1 and "does not verify with key" in r.stderr and "nothing attached" in r.stderr, r
    # another signer's statement attached with the wrong key given: refused the same way
    other = _attach(_signed(tmp_path, ref, B, "FAIL", "b-fail"), ref, pub_a)
    assert other.returncode == 1 and "does not verify" in other.stderr, other
    # no key at all: refused before anything is read or written
    none = _attach(_signed(tmp_path, ref, A, "FAIL", "a-fail2"), ref)
    assert none.returncode == 1 and "no public key to verify it with" in none.stderr, none
    assert _state(ref) == before
    assert _words(ref) == {"att": ["A:PASS"], "referrers": ["A:PASS"]}


def test_an_older_attempt_attached_after_a_newer_one_changes_nothing(
    registry: str, image: str, tmp_path: Path
) -> None:
    ref = _push(image, registry, "out-of-order")
    pub = pub_of(A, tmp_path)
    older_pass = _signed(tmp_path, ref, A, "PASS", "a-1404")
    newer_fail = _signed(tmp_path, ref, A, "FAIL", "a-1405")
    assert _attach(newer_fail, ref, pub).returncode == 0
    before = _state(ref)
    r = _attach(older_pass, ref, pub)
    assert (
        r.returncode == 1 and "is not newer than what key" in r.stderr and "(acceptance FAIL)" in r.stderr
    ), r
    assert _state(ref) == before
    v = _verify(ref, pub)
    assert v.returncode == 1 and "verdict FAIL is not accepted" in v.stdout, v.stdout


def test_verify_refuses_whenever_a_trusted_fail_is_there_whatever_put_it_there(
    registry: str, image: str, tmp_path: Path
) -> None:
    """Two spellings of one pipeline file are one pipeline: the later FAIL supersedes the PASS.
    Appended by hand (an append-only registry, or an older imagegate), a PASS beside a newer FAIL,
    and a FAIL beside a newer PASS, both refuse, as the shipped ClusterPolicy refuses."""
    pub = pub_of(A, tmp_path)
    ref = _push(image, registry, "spellings")
    spelled = _signed(tmp_path, ref, A, "PASS", "a-pass", source="pipelines/x.yaml")
    assert _attach(spelled, ref, pub).returncode == 0
    respelled = _attach(_signed(tmp_path, ref, A, "FAIL", "a-fail", source="./pipelines/x.yaml"), ref, pub)
    assert respelled.returncode == 0 and respelled.stdout.count("replaced layer") == 3, respelled.stdout
    v = _verify(ref, pub)
    assert v.returncode == 1 and "verdict FAIL is not accepted" in v.stdout, v.stdout
    for order, name in ((("PASS", "FAIL"), "appended-pass-fail"), (("FAIL", "PASS"), "appended-fail-pass")):
        appended = _push(image, registry, name)
        parsed = attach.parse_image(appended)
        (tmp_path / name).mkdir()
        made = [_signed(tmp_path / name, appended, A, verdict, f"a-{verdict.lower()}") for verdict in order]
        with attach.client_for(parsed) as client:
            for path in made:
                attach.append(client, attach.resolve(client, parsed), read_envelopes(path)[0])
        v = _verify(appended, pub)
        assert v.returncode == 1, (order, v.stdout)
        assert "verdict FAIL is not accepted" in v.stdout, v.stdout
        if order == ("FAIL", "PASS"):
            assert "still attached beside the later PASS" in v.stdout, v.stdout
        # one pipeline asked for, or another's: the same FAIL, or nothing of it
        elsewhere = _verify(appended, pub, extra=("--pipeline", "vllm"))
        assert elsewhere.returncode == 1 and "is pipeline builtin:vllm's" in elsewhere.stdout, (
            elsewhere.stdout
        )


def test_a_trusted_statement_past_the_freshness_bound_refuses_unless_the_bound_is_lifted(
    registry: str, image: str, tmp_path: Path
) -> None:
    pub = pub_of(A, tmp_path)
    ref = _push(image, registry, "stale")
    eight_days = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=8)
    said = (
        (eight_days - dt.timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
        eight_days.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
    )
    assert _attach(_signed(tmp_path, ref, A, "PASS", "a-old", said=said), ref, pub).returncode == 0
    stale = _verify(ref, pub)
    assert stale.returncode == 1 and "older than 168h" in stale.stdout, stale.stdout
    assert _verify(ref, pub, extra=("--max-age", "0")).returncode == 0
    assert _verify(ref, pub, extra=("--max-age", "9d")).returncode == 0
    assert _verify(ref, pub, extra=("--max-age", "7d")).returncode == 1
    bad = _verify(ref, pub, extra=("--max-age", "soon"))
    assert bad.returncode == 3 and "not a duration" in bad.stderr


def test_a_pipeline_is_read_alone_when_asked_and_an_unverifiable_statement_never_counts(
    registry: str, image: str, tmp_path: Path
) -> None:
    pub_a, pub_b = pub_of(A, tmp_path), pub_of(B, tmp_path)
    ref = _push(image, registry, "narrow")
    assert _attach(_signed(tmp_path, ref, A, "PASS", "a-pass"), ref, pub_a).returncode == 0
    assert _attach(_signed(tmp_path, ref, A, "FAIL", "a-vllm", pipeline="vllm"), ref, pub_a).returncode == 0
    assert _attach(_signed(tmp_path, ref, B, "FAIL", "b-fail"), ref, pub_b).returncode == 0
    assert _verify(ref, pub_a).returncode == 1  # vllm's FAIL: every pipeline read
    python = _verify(ref, pub_a, extra=("--pipeline", "python"))
    assert python.returncode == 0 and "of pipeline builtin:python" in python.stdout, python.stdout
    assert json.dumps(sorted(_pipeline(s) for s in _read(ref)["att"])).count("builtin:python") == 6
