"""The write path of `attach` (attest/attach.py `attach`, attest/referrers.py `refer` and
`attach_and_refer`) under the rules of docs/attestations.md "Who may replace what", through the
Python API against the real registry (Debian's docker-registry on 127.0.0.1; no engine: each image
is one config and one layer pushed by the registry client), with two real keys: fast enough to be
the test command of the write path's mutants (mutation/attest_attach.toml). Behind the referrers
front (a stand-in registry that indexes referrers itself, named so) a superseded referrer must be
deleted, and a kept one must not be."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from typing import Any

import httpx
import pytest

from imagegate.attest import attach, bundle, dsse, keys, referrers, replace, sign
from imagegate.attest.vsa import TIME_FIELD, VERIFIER_ID, VSA_PREDICATE_TYPE
from imagegate.domain.digest import digest_of
from imagegate.errors import NotVerified, UsageError
from imagegate.oci.manifest import OCI_MANIFEST
from imagegate.oci.reference import Reference
from tests.attest.conftest import push_one_file_image
from tests.attest.referrers_front import referrers_front
from tests.attest.test_supersede import acceptance

A, B = keys.generate(), keys.generate()
_N = itertools.count()


def _image(host: str) -> Reference:
    """A fresh repository holding one small image of its own (no engine needed)."""
    ref = f"{host}/rules/app{next(_N)}:1"
    return attach.parse_image(push_one_file_image(ref, ref.encode()))


def _digest(ref: Reference) -> str:
    with attach.client_for(ref) as client:
        return attach.resolve(client, ref).digests[0]


def _said(ref: Reference, verdict: str, hour: int, key: keys.SigningKey = A, **kw: Any) -> dsse.Envelope:
    return dsse.sign(
        sign.serialize(acceptance(verdict, f"2026-12-01T{hour:02d}:00:00.000Z", subject=_digest(ref), **kw)),
        key,
    )


def _vsa(ref: Reference, result: str, hour: int, key: keys.SigningKey = A) -> dsse.Envelope:
    statement = acceptance(subject=_digest(ref))
    statement["predicateType"] = VSA_PREDICATE_TYPE
    statement["predicate"] = {
        "verifier": {"id": VERIFIER_ID},
        "policy": {"uri": "builtin:python"},
        "verificationResult": result,
        TIME_FIELD: f"2026-12-01T{hour:02d}:00:00.000Z",
    }
    return dsse.sign(sign.serialize(statement), key)


def _attach(
    ref: Reference, *envelopes: dsse.Envelope, trusted: tuple[keys.PublicKey, ...] = (A.public,)
) -> list[tuple[attach.Attached, referrers.Referred]]:
    todo = [(env, bundle.verification_material(_signer(env).public)) for env in envelopes]
    with attach.client_for(ref) as client:
        return referrers.attach_and_refer(client, ref, todo, trusted)


def _signer(env: dsse.Envelope) -> keys.SigningKey:
    return A if env.verified_by(A.public) else B


def _there(ref: Reference) -> dict[str, list[str]]:
    """Each place's statements as `SIGNER:OUTCOME`, in listing order."""
    with attach.client_for(ref) as client:
        image = attach.resolve(client, ref)
        places = {"att": attach.fetch(client, image), "referrers": referrers.fetch(client, image)}
    return {
        where: [
            f"{'A' if f.envelope.verified_by(A.public) else 'B'}:{replace.outcome(attach.statement_of(f.envelope))}"
            for f in found
        ]
        for where, found in places.items()
    }


def _written(ref: Reference) -> tuple[bytes, bytes]:
    """The `.att` manifest and the fallback index as the registry holds them: what a write changes."""
    digest = _digest(ref)
    with attach.client_for(ref) as client:
        got = []
        for tag in (attach.attestation_tag(digest), referrers.fallback_tag(digest)):
            with contextlib.suppress(Exception):
                got.append(
                    client.get_manifest(
                        ref.repository, tag, accept=(OCI_MANIFEST, "application/vnd.oci.image.index.v1+json")
                    ).raw
                )
                continue
            got.append(b"")
    return got[0], got[1]


def test_the_same_signers_newer_word_supersedes_in_both_places_and_another_signers_stays(
    registry: str,
) -> None:
    ref = _image(registry)
    _attach(ref, _said(ref, "ERROR", 10))  # A's own earlier word: not what B said, to tell them apart
    _attach(ref, _said(ref, "FAIL", 11, key=B), trusted=(B.public,))
    ((done, referred),) = _attach(ref, _said(ref, "PASS", 12))
    assert [r.outcome for r in done.replaced] == ["ERROR"] and [r.outcome for r in referred.replaced] == [
        "ERROR"
    ]
    assert [k.entry.outcome for k in done.kept] == ["FAIL"] and "not signed by key" in done.kept[0].why
    assert [k.entry.outcome for k in referred.kept] == ["FAIL"]
    got = _there(ref)
    assert got["att"] == ["B:FAIL", "A:PASS"] and sorted(got["referrers"]) == ["A:PASS", "B:FAIL"]


def test_an_older_word_is_refused_before_anything_is_written(registry: str) -> None:
    ref = _image(registry)
    _attach(ref, _said(ref, "FAIL", 11))
    before = _written(ref)
    with pytest.raises(replace.NewerThere, match=r"acceptance FAIL\), said 2026-12-01T11:00:00\+00:00"):
        _attach(ref, _said(ref, "PASS", 10))
    assert _written(ref) == before and _there(ref) == {"att": ["A:FAIL"], "referrers": ["A:FAIL"]}


def test_one_older_statement_of_a_group_stops_the_whole_group(registry: str) -> None:
    """An acceptance and a VSA attached together: the VSA older than the one there refuses both."""
    ref = _image(registry)
    _attach(ref, _vsa(ref, "FAILED", 11))
    before = _written(ref)
    with pytest.raises(replace.NewerThere):
        _attach(ref, _said(ref, "PASS", 12), _vsa(ref, "PASSED", 10))
    assert _written(ref) == before


def test_a_statement_that_does_not_verify_is_never_written(registry: str) -> None:
    ref = _image(registry)
    _attach(ref, _said(ref, "PASS", 10))
    before = _written(ref)
    env = _said(ref, "FAIL", 11)
    forged = dataclasses.replace(env, signatures=(dsse.Signature(env.signatures[0].sig[::-1]),))
    for wrong, trusted in ((forged, (A.public,)), (_said(ref, "FAIL", 12, key=B), (A.public,)), (env, ())):
        with pytest.raises(NotVerified, match="nothing attached"):
            _attach(ref, wrong, trusted=trusted)
    assert _written(ref) == before


def test_the_same_statement_again_writes_nothing_and_a_resigned_one_replaces_it(registry: str) -> None:
    ref = _image(registry)
    first = _said(ref, "PASS", 10)
    _attach(ref, first)
    before = _written(ref)
    ((done, referred),) = _attach(ref, first)
    assert done.already and referred.already and _written(ref) == before
    assert referred.via == f"tag {referrers.fallback_tag(_digest(ref))}"  # this registry has no API
    # the same statement signed again (ECDSA: other signature bytes): there already, not added
    ((done, referred),) = _attach(ref, dsse.sign(first.payload, A))
    assert not done.replaced and _there(ref) == {"att": ["A:PASS"], "referrers": ["A:PASS"]}


def test_a_statement_about_another_image_is_refused(registry: str) -> None:
    ref, other = _image(registry), _image(registry)
    with pytest.raises(UsageError, match="attestation subject"):
        _attach(ref, _said(other, "PASS", 10))


def test_another_pipelines_and_another_tools_statements_stay(registry: str) -> None:
    ref = _image(registry)
    _attach(ref, _said(ref, "FAIL", 10, source="builtin:vllm"))
    foreign = acceptance("FAIL", "2026-12-01T10:00:00.000Z", subject=_digest(ref))
    foreign["predicate"] = {"verdict": "FAIL"}  # no pipeline: not imagegate's
    with attach.client_for(ref) as client:
        attach.append(client, attach.resolve(client, ref), dsse.sign(sign.serialize(foreign), A))
    ((done, _),) = _attach(ref, _said(ref, "PASS", 12))
    assert not done.replaced and sorted(k.why for k in done.kept) == [
        "another pipeline's (builtin:vllm)",
        "another tool's statement",
    ]
    assert _there(ref)["att"] == ["A:FAIL", "A:FAIL", "A:PASS"]


def test_where_the_registry_indexes_referrers_a_superseded_one_is_deleted_and_a_kept_one_is_not(
    registry: str,
) -> None:
    ref = _image(registry)
    with referrers_front(registry) as front:
        fronted = attach.parse_image(str(ref).replace(registry, front))
        _attach(fronted, _said(fronted, "FAIL", 10))
        _attach(fronted, _said(fronted, "FAIL", 11, key=B), trusted=(B.public,))
        passed = _said(fronted, "PASS", 12)
        ((_, referred),) = _attach(fronted, passed)
        assert referred.via == referrers.API and [r.outcome for r in referred.replaced] == ["FAIL"]
        assert sorted(_there(fronted)["referrers"]) == ["A:PASS", "B:FAIL"]
        # the same statement again: already listed by the API, and no fallback tag is written
        ((_, again),) = _attach(fronted, passed)
        assert again.already and again.via == referrers.API
        fallback = referrers.fallback_tag(_digest(fronted))
        assert (
            httpx.get(f"http://{registry}/v2/{ref.repository}/manifests/{fallback}", timeout=10).status_code
            == 404
        )


def test_a_superseded_referrer_is_unlisted_and_its_manifest_deleted_where_the_registry_allows(
    registry: str,
) -> None:
    ref = _image(registry)
    ((_, first),) = _attach(ref, _said(ref, "FAIL", 10))
    ((_, referred),) = _attach(ref, _said(ref, "PASS", 12))
    assert [r.where for r in referred.replaced] == [f"referrer {first.manifest_digest}"]

    def status(digest: str) -> int:
        url = f"http://{registry}/v2/{ref.repository}/manifests/{digest}"
        return httpx.get(url, headers={"Accept": OCI_MANIFEST}, timeout=10).status_code

    assert status(referred.manifest_digest) == 200 and status(first.manifest_digest) == 404


def test_what_an_attach_says_names_the_manifest_digest_and_what_was_pushed(registry: str) -> None:
    ref, other = _image(registry), _image(registry)
    ((done, _),) = _attach(ref, _said(ref, "PASS", 10))
    assert (
        done.reference == f"{registry}/{ref.repository}@{_digest(ref)}"
        and not done.already
        and done.manifest_digest
    )
    with pytest.raises(UsageError) as e:
        _attach(ref, _said(other, "PASS", 10))
    assert f"attestation subject {_digest(other)} is not" in str(e.value) and f"({_digest(ref)})" in str(
        e.value
    )


def test_the_same_statement_stays_once_while_an_older_one_is_superseded(registry: str) -> None:
    """An older FAIL and the PASS, both appended by hand; the PASS signed again is attached: the
    FAIL goes, the PASS stays, once."""
    ref = _image(registry)
    passed = _said(ref, "PASS", 12)
    with attach.client_for(ref) as client:
        for env in (_said(ref, "FAIL", 10), passed):
            attach.append(client, attach.resolve(client, ref), env)
    ((done, _),) = _attach(ref, dsse.sign(passed.payload, A))
    assert [r.outcome for r in done.replaced] == ["FAIL"] and _there(ref)["att"] == ["A:PASS"]


def test_a_layer_whose_blob_is_gone_is_dropped_and_named_and_stops_nothing(registry: str) -> None:
    """No reader can read it, and the registry refuses a manifest that names it (MANIFEST_BLOB_UNKNOWN)."""
    ref = _image(registry)
    lost = _said(ref, "FAIL", 10)
    with attach.client_for(ref) as client:
        attach.append(client, attach.resolve(client, ref), lost)
    layer = digest_of(lost.to_json(indent=None).rstrip(b"\n"))
    assert httpx.delete(f"http://{registry}/v2/{ref.repository}/blobs/{layer}", timeout=10).status_code == 202
    ((done, _),) = _attach(ref, _said(ref, "PASS", 12))
    assert not done.replaced and not done.kept and done.layers == 1
    assert done.dropped == (f"layer {layer}: {attach.GONE}",)
    assert _there(ref)["att"] == ["A:PASS"]
