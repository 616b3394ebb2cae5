"""Keyless signing through the tests' own Sigstore (tests/attest/sigstore_local.py): sigstore-python
4.5.1 signs an in-toto statement as DSSE with a certificate Fulcio issues for a CI's token (the
OIDC stand-in's), logged in Rekor v2 and timestamped by the TSA, its SCT from the CT log; the
bundle verifies against the local trusted root for that identity and issuer only. cosign v3
(the consumers' build) verifies the same bundle, as an admission controller would."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sigstore.dsse import Statement
from sigstore.errors import VerificationError
from sigstore.models import Bundle, ClientTrustConfig
from sigstore.oidc import IdentityError, IdentityToken
from sigstore.sign import SigningContext
from sigstore.verify import Verifier
from sigstore.verify.policy import (
    AllOf,
    GitHubWorkflowRef,
    GitHubWorkflowRepository,
    Identity,
    OIDCBuildSignerURI,
    OIDCRunnerEnvironment,
    OIDCSourceRepositoryURI,
)

from tests.attest.sigstore_local import LocalSigstore, bundle_stamped_before_its_certificate, local_sigstore
from tests.helpers import go_tools

PREDICATE_TYPE = "https://imagegate.dev/test/smoke/v1"
SCT_LIST = x509.ObjectIdentifier("1.3.6.1.4.1.11129.2.4.2")
FULCIO_ISSUER_V2 = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.8")


@pytest.fixture(scope="module")
def local() -> Iterator[LocalSigstore]:
    with local_sigstore(go_tools("sigstore", "tesseract")) as s:
        print(f"local Sigstore started: {s.started_seconds}")
        yield s


def _statement(name: str = "registry.example/app") -> Statement:
    digest = hashlib.sha256(name.encode()).hexdigest()
    return Statement(
        json.dumps(
            {
                "_type": "https://in-toto.io/Statement/v1",
                "subject": [{"name": name, "digest": {"sha256": digest}}],
                "predicateType": PREDICATE_TYPE,
                "predicate": {"verdict": "PASS"},
            },
            separators=(",", ":"),
        ).encode()
    )


def _sign(local: LocalSigstore, token: str, statement: Statement) -> Bundle:
    trust = ClientTrustConfig.from_json(local.client_trust_config.read_text())
    context = SigningContext.from_trust_config(trust)
    # cache=True (the default): with cache=False, 4.5.1's Signer makes a new key at each use of
    # `_private_key` (sign.py), so the CSR's key is not the one that signs and Rekor refuses the entry.
    with context.signer(IdentityToken(token), cache=True) as signer:
        return signer.sign_dsse(statement)


def _verifier(local: LocalSigstore) -> Verifier:
    return Verifier(
        trusted_root=ClientTrustConfig.from_json(local.client_trust_config.read_text()).trusted_root
    )


def test_a_github_token_signs_a_statement_that_verifies_for_its_identity_only(local: LocalSigstore) -> None:
    start = time.monotonic()
    b = _sign(local, local.token("imagegate-test/app"), _statement())
    signed = time.monotonic() - start
    identity, issuer = local.identity("imagegate-test/app"), local.issuer("github")
    cert = b.signing_certificate
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [identity]
    assert cert.extensions.get_extension_for_oid(SCT_LIST) is not None  # Fulcio's SCT, from the CT log
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).total_seconds() == 600
    raw = json.loads(b.to_json())
    (entry,) = raw["verificationMaterial"]["tlogEntries"]
    # Rekor v2 logs only hashedrekord: a DSSE envelope as the digest of its PAE and its signature
    assert entry["kindVersion"] == {"kind": "hashedrekord", "version": "0.0.2"}
    assert "integratedTime" not in entry or entry["integratedTime"] in ("0", 0)
    assert len(raw["verificationMaterial"]["timestampVerificationData"]["rfc3161Timestamps"]) == 1

    start = time.monotonic()
    payload_type, payload = _verifier(local).verify_dsse(b, Identity(identity=identity, issuer=issuer))
    verified = time.monotonic() - start
    assert payload_type == "application/vnd.in-toto+json"
    assert json.loads(payload)["predicateType"] == PREDICATE_TYPE
    print(f"signed in {signed:.2f} s, verified in {verified:.2f} s")
    # The CI's claims, in the extensions Fulcio's templates fill (as a policy would pin them)
    claims = AllOf(
        [
            Identity(identity=identity, issuer=issuer),
            GitHubWorkflowRepository("imagegate-test/app"),
            GitHubWorkflowRef("refs/heads/main"),
            OIDCSourceRepositoryURI("https://github.com/imagegate-test/app"),
            OIDCBuildSignerURI(identity),
            OIDCRunnerEnvironment("github-hosted"),
        ]
    )
    _verifier(local).verify_dsse(b, claims)

    for wrong in (
        Identity(identity=local.identity("imagegate-test/other"), issuer=issuer),
        Identity(identity=identity, issuer=local.issuer("gitlab")),
        Identity(identity=identity, issuer="https://token.actions.githubusercontent.com"),
    ):
        with pytest.raises(VerificationError):
            _verifier(local).verify_dsse(b, wrong)


def test_a_gitlab_token_signs_too(local: LocalSigstore) -> None:
    b = _sign(local, local.token("imagegate-test/app", "gitlab"), _statement())
    identity = local.identity("imagegate-test/app", "gitlab")
    claims = AllOf(
        [
            Identity(identity=identity, issuer=local.issuer("gitlab")),
            OIDCSourceRepositoryURI("https://gitlab.com/imagegate-test/app"),
            OIDCRunnerEnvironment("gitlab-hosted"),
        ]
    )
    _verifier(local).verify_dsse(b, claims)
    issuer = b.signing_certificate.extensions.get_extension_for_oid(FULCIO_ISSUER_V2).value
    assert isinstance(issuer, x509.UnrecognizedExtension)
    assert local.issuer("gitlab").encode() in issuer.value


def test_an_expired_token_gets_no_certificate(local: LocalSigstore) -> None:
    token = local.token("imagegate-test/app", expires_in=-60)
    with pytest.raises(IdentityError) as refused:
        IdentityToken(token)  # sigstore-python refuses it before asking, PyJWT's check of exp
    assert type(refused.value.__cause__).__name__ == "ExpiredSignatureError"
    # Fulcio refuses it too, asked directly (its REST API v2, as sigstore-python asks it).
    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())
    body = {
        "credentials": {"oidcIdentityToken": token},
        "certificateSigningRequest": base64.b64encode(csr.public_bytes(serialization.Encoding.PEM)).decode(),
    }
    r = httpx.post(f"{local.fulcio}/api/v2/signingCert", json=body, timeout=30)
    assert r.status_code == 400 and "error processing the identity token" in r.text, r.text
    fresh = httpx.post(
        f"{local.fulcio}/api/v2/signingCert",
        json={**body, "credentials": {"oidcIdentityToken": local.token("imagegate-test/app")}},
        timeout=30,
    )
    assert fresh.status_code == 200, fresh.text  # the same request with a token still valid


def test_a_signature_timestamped_before_its_certificate_is_refused(local: LocalSigstore) -> None:
    b = bundle_stamped_before_its_certificate(local, local.token("imagegate-test/app"), _statement())
    (stamp,) = b.verification_material.timestamp_verification_data.rfc3161_timestamps  # type: ignore[union-attr]
    assert stamp.tst_info.gen_time < b.signing_certificate.not_valid_before_utc
    policy = Identity(identity=local.identity("imagegate-test/app"), issuer=local.issuer("github"))
    with pytest.raises(VerificationError, match="cert is not valid at validation time"):
        _verifier(local).verify_dsse(b, policy)


def test_cosign_verifies_the_bundle(local: LocalSigstore, tmp_path: Path) -> None:
    script = go_tools("cosign")
    cosign = script.exe(script.named("cosign"))
    name = "registry.example/app"
    b = _sign(local, local.token("imagegate-test/app"), _statement(name))
    (tmp_path / "bundle.json").write_text(b.to_json())
    (tmp_path / "blob").write_text(name)  # the statement's subject is this blob's sha256

    def verify(identity: str, issuer: str) -> subprocess.CompletedProcess[str]:
        # The bundle format is v3's only one: --new-bundle-format is deprecated in v3.1.3 (it says so).
        return subprocess.run(
            [
                cosign, "verify-blob-attestation", "--bundle", str(tmp_path / "bundle.json"),
                "--trusted-root", str(local.trusted_root), "--certificate-identity", identity,
                "--certificate-oidc-issuer", issuer, "--type", PREDICATE_TYPE, str(tmp_path / "blob"),
            ],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )  # fmt: skip

    identity, issuer = local.identity("imagegate-test/app"), local.issuer("github")
    ok = verify(identity, issuer)
    assert ok.returncode == 0 and "Verified OK" in ok.stderr, ok.stderr
    other = verify(local.identity("imagegate-test/other"), issuer)
    assert other.returncode != 0 and "no matching CertificateIdentity found" in other.stderr, other.stderr
    gitlab = verify(identity, local.issuer("gitlab"))
    assert gitlab.returncode != 0 and "no matching CertificateIdentity found" in gitlab.stderr, gitlab.stderr
