"""Keyless signing's edges, where no Sigstore is needed: what names the trust and the identity
token, what a certificate says signed, how `verify` reads who must have signed, and that the
probes never hold what signs as the CI's workflow. A whole keyless run against a Sigstore of
the test's own is tests/attest/test_keyless_sigstore.py."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from imagegate.attest import keyless
from imagegate.errors import UsageError
from tests.attest.conftest import HERE_RUN, cli

WORKFLOW = "https://github.com/org/repo/.github/workflows/gate.yml@refs/heads/main"
ACTIONS = "https://token.actions.githubusercontent.com"


def _utf8(text: str) -> bytes:
    raw = text.encode()
    assert len(raw) < 128
    return bytes([0x0C, len(raw)]) + raw


def certificate(
    sans: list[x509.GeneralName],
    issuer_v2: str | None = ACTIONS,
    issuer_v1: str | None = None,
    lifetime: datetime.timedelta = datetime.timedelta(minutes=10),
) -> x509.Certificate:
    """A certificate shaped as Fulcio's: the identity in its SAN, the issuer in Sigstore's OIDs."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sigstore-intermediate")]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + lifetime)
    )
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=True)
    if issuer_v2 is not None:
        oid = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.8")
        b = b.add_extension(x509.UnrecognizedExtension(oid, _utf8(issuer_v2)), critical=False)
    if issuer_v1 is not None:
        oid = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.1")
        b = b.add_extension(x509.UnrecognizedExtension(oid, issuer_v1.encode()), critical=False)
    return b.sign(key, hashes.SHA256())


def test_a_certificate_names_who_signed_as_fulcio_writes_it() -> None:
    uri = certificate([x509.UniformResourceIdentifier(WORKFLOW)])
    assert keyless.identity_of(uri) == keyless.Identity(WORKFLOW, ACTIONS)
    email = certificate([x509.RFC822Name("ci@example.org")], None, "https://accounts.example")
    assert keyless.identity_of(email) == keyless.Identity("ci@example.org", "https://accounts.example")
    other = x509.OtherName(x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.7"), b"\x0c\x05alice")
    assert keyless.identity_of(certificate([other])).identity == "alice"
    for bad in (
        certificate([]),  # no SAN
        certificate([x509.UniformResourceIdentifier(WORKFLOW), x509.RFC822Name("x@example.org")]),  # two
        certificate([x509.UniformResourceIdentifier(WORKFLOW)], None),  # no issuer
    ):
        with pytest.raises(UsageError, match="identity"):
            keyless.identity_of(bad)


def _expected(**kw: str) -> keyless.Expected:
    return keyless.Expected(root=None, **kw)  # type: ignore[arg-type]  # matching needs no root


def test_who_must_have_signed_matches_as_cosign_matches() -> None:
    who = keyless.Identity(WORKFLOW, ACTIONS)
    assert _expected(identity=WORKFLOW, issuer=ACTIONS).matches(who)
    assert not _expected(identity=WORKFLOW + "x", issuer=ACTIONS).matches(who)
    assert not _expected(identity=WORKFLOW, issuer=ACTIONS + "/").matches(who)
    # a regexp matches anywhere, as Go's MatchString does; anchored, the whole
    assert _expected(identity_regexp="org/repo/", issuer=ACTIONS).matches(who)
    assert not _expected(identity_regexp="^org/repo/", issuer=ACTIONS).matches(who)
    assert _expected(identity_regexp=r"^https://github\.com/org/", issuer_regexp="githubusercontent").matches(
        who
    )
    assert not _expected(identity_regexp="other-org", issuer=ACTIONS).matches(who)


def test_a_sigstore_key_needs_a_trust_config_and_an_identity_token(tmp_path: Path) -> None:
    nothing = cli(*HERE_RUN, "-o", "runs", "--key", "sigstore:", cwd=tmp_path)
    assert nothing.returncode == 3 and "names no Sigstore" in nothing.stderr
    garbage = tmp_path / "trust.json"
    garbage.write_text(json.dumps({"mediaType": "not a trust config"}))
    bad = cli(*HERE_RUN, "-o", "runs", "--key", f"sigstore:{garbage}", cwd=tmp_path)
    assert bad.returncode == 3 and "not a client trust config" in bad.stderr and str(garbage) in bad.stderr
    absent = cli(*HERE_RUN, "-o", "runs", "--key", f"sigstore:{tmp_path / 'absent.json'}", cwd=tmp_path)
    assert absent.returncode == 3 and "absent.json" in absent.stderr
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_no_identity_token_is_named_before_the_run() -> None:
    env = {"SIGSTORE_ID_TOKEN": ""}
    with pytest.raises(UsageError, match="needs an identity token") as e:
        keyless.identity_token(env)
    assert "id-token: write" in (e.value.hint or "")
    with pytest.raises(UsageError, match=r"identity token from \$SIGSTORE_ID_TOKEN is refused"):
        keyless.identity_token({"SIGSTORE_ID_TOKEN": "not.a.jwt"})


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--identity", WORKFLOW], "needs one of --identity/--identity-regexp and one of --issuer"),
        (["--identity", WORKFLOW, "--identity-regexp", "x", "--issuer", ACTIONS], "needs one of"),
        (["--identity", WORKFLOW, "--issuer", ACTIONS], "needs --trusted-root FILE"),
        (["--identity-regexp", "(", "--issuer", ACTIONS, "--trusted-root", "r.json"], "not a regexp"),
    ],
)
def test_verify_names_who_must_have_signed_whole(tmp_path: Path, options: list[str], said: str) -> None:
    (tmp_path / "r.json").write_text("{}")
    (tmp_path / "a.sigstore.json").write_text("{}")
    r = cli("verify", "a.sigstore.json", *options, cwd=tmp_path)
    assert r.returncode == 3 and said in r.stderr, r.stderr


def test_a_keyless_signer_has_no_public_key_to_keep(tmp_path: Path) -> None:
    r = cli("public-key", "--key", "sigstore:public-good", cwd=tmp_path)
    assert r.returncode == 3 and "signs keyless" in r.stderr
    made = cli("keygen", "--out", "sigstore:public-good", cwd=tmp_path)
    assert made.returncode == 3 and "has no key to make" in made.stderr
    assert list(tmp_path.iterdir()) == []
    v = cli("verify", "x.dsse.json", env={"IMAGEGATE_SIGNING_KEY": "sigstore:trust.json"}, cwd=tmp_path)
    assert v.returncode == 3 and "--identity ID --issuer URL --trusted-root FILE" in v.stderr


def test_an_issuer_longer_than_a_short_der_length_is_read_whole() -> None:
    """Fulcio's v2 issuer extension is a DER UTF8String: past 127 bytes its length takes bytes of
    its own (0x81 n, 0x82 n n)."""
    for issuer in ("https://issuer.example/" + "a" * 150, "https://issuer.example/" + "b" * 300):
        raw = issuer.encode()
        width = (len(raw).bit_length() + 7) // 8
        der = bytes([0x0C, 0x80 | width]) + len(raw).to_bytes(width, "big") + raw
        assert keyless._utf8_string(der) == issuer
        assert keyless._utf8_string(der + b"trailing") == issuer  # its length, not the rest
    assert keyless._utf8_string(b"\x04\x03abc") == ""  # an OCTET STRING is not one
    assert keyless._utf8_string(b"\x0c") == ""
    assert keyless._utf8_string(b"\x0c\x03abc") == "abc"
    assert keyless._utf8_string(b"\x0c\x03abcdef") == "abc"  # a short length, bytes after it


def test_a_ci_that_cannot_give_a_token_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """GitHub Actions without `id-token: write`: the job is GitHub's, its means to ask is not there."""
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    for name in ("ACTIONS_ID_TOKEN_REQUEST_TOKEN", "ACTIONS_ID_TOKEN_REQUEST_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(UsageError, match="the CI's identity token could not be had"):
        keyless.identity_token({})


def test_the_cis_ambient_token_is_taken_when_none_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """No $SIGSTORE_ID_TOKEN: the token the CI gives (sigstore-python's detection, GitHub's
    ACTIONS_ID_TOKEN_REQUEST_*), read as given."""
    import time

    import jwt
    import sigstore.oidc

    now = int(time.time())
    claims = {
        "iss": "https://ci.example",
        "sub": "repo:org/gate",
        "aud": "sigstore",
        "iat": now,
        "exp": now + 300,
    }
    ambient = jwt.encode(claims, "not checked here: Fulcio checks it", algorithm="HS256")
    monkeypatch.setattr(sigstore.oidc, "detect_credential", lambda: ambient)
    token = keyless.identity_token({})
    assert (token.identity, token.issuer, str(token)) == ("repo:org/gate", "https://ci.example", ambient)


def test_a_certificate_is_read_only_where_fulcio_writes_who_signed() -> None:
    both = certificate([x509.UniformResourceIdentifier(WORKFLOW)], ACTIONS, "https://v1.example")
    assert keyless.identity_of(both).issuer == ACTIONS  # the v2 extension first
    with pytest.raises(UsageError, match="does not name one identity"):
        keyless.identity_of(certificate([x509.DNSName("host.example")]))  # no identity among its SANs
    assert keyless._utf8_string(b"\x13\x03abc") == ""  # a PrintableString is not one either


@pytest.mark.parametrize("command", ["run", "collect"])
def test_a_fleet_signer_that_cannot_sign_keyless_stops_before_the_work(tmp_path: Path, command: str) -> None:
    """`fleet run`/`fleet collect` sign keyless as `run` does (each node's statement with its
    bundle beside it: tests/attest/test_keyless_sigstore.py); a `sigstore:` signer whose trust
    config cannot be read stops the command before any Job is made or read, naming it."""
    from tests.fleet.test_judge import _k8s_node

    (tmp_path / "nodes.json").write_text(json.dumps({"items": [_k8s_node("gpu-1")]}))
    image = "registry.example/torch@sha256:" + "a" * 64
    r = cli("fleet", command, image, "--nodes", "nodes.json", "--key", "sigstore:trust.json", cwd=tmp_path)
    assert r.returncode == 3 and "trust.json" in r.stderr, r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["nodes.json"]  # nothing made


def test_a_certificate_that_ends_during_a_long_run_is_asked_for_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fulcio's certificates live 10 minutes, a run of a real image longer: one within a minute of
    its end is never signed with; a new one is asked for, with a token read again. (Fulcio is
    not asked here: what it would answer is a certificate of the test's own.)"""
    lifetimes = iter([datetime.timedelta(seconds=30), datetime.timedelta(minutes=10)])
    asked: list[x509.Certificate] = []

    def new_signer(self: keyless.KeylessKey) -> tuple[object, x509.Certificate]:
        self.token()  # as the real one does: a token read again for each certificate
        asked.append(certificate([x509.UniformResourceIdentifier(WORKFLOW)], lifetime=next(lifetimes)))
        return object(), asked[-1]

    tokens: list[int] = []
    monkeypatch.setattr(keyless.KeylessKey, "_new_signer", new_signer)
    key = keyless.KeylessKey("sigstore:trust.json", None, lambda: tokens.append(1))  # type: ignore[arg-type]
    assert key.identity == keyless.Identity(WORKFLOW, ACTIONS)
    assert len(asked) == 1
    key.public  # noqa: B018 — 30 s left: under RENEW_BEFORE, a new certificate
    assert len(asked) == 2 and len(tokens) == 2
    key.public  # noqa: B018 — 10 minutes left: the same one
    assert len(asked) == 2 and key.public.fingerprint != keyless.PublicKey(asked[0].public_key()).fingerprint  # type: ignore[arg-type]
