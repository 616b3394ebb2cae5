"""`verify` trusts the keys it is given (`--key` repeatable, `--trusted-keys FILE`), never fewer
than one, and a key list that is not one is refused, named."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from imagegate.attest import keys, sign
from imagegate.errors import UsageError
from tests.attest.conftest import cli


def test_verify_without_a_key_is_a_usage_error(signed: sign.Signed, tmp_path: Path) -> None:
    # no key given, and none where run keeps its key (tests/attest/test_next_step.py: one there)
    r = cli("verify", str(signed.dsse_path), env={"XDG_CONFIG_HOME": str(tmp_path / "no-config")})
    assert r.returncode == 3, r.stdout + r.stderr
    assert "no public key to verify with" in r.stderr and "--trusted-keys FILE" in r.stderr


def test_a_trusted_keys_file_is_public_keys_only(
    signed: sign.Signed, keypair: tuple[Path, Path], tmp_path: Path
) -> None:
    priv, pub = keypair
    listed = tmp_path / "trusted.pem"
    other = keys.generate().public.pem
    listed.write_bytes(b"other machine\n" + other + b"\nthis one\n" + pub.read_bytes())
    ok = cli("verify", str(signed.dsse_path), "--trusted-keys", str(listed))
    assert ok.returncode == 0, ok.stdout
    assert f"verified with key {keys.load_public_key(pub).fingerprint}" in ok.stdout

    listed.write_bytes(pub.read_bytes() + priv.read_bytes())
    r = cli("verify", str(signed.dsse_path), "--trusted-keys", str(listed))
    assert r.returncode == 3 and f"trusted keys {listed}: holds a private key" in r.stderr
    listed.write_text("not a key\n")
    r = cli("verify", str(signed.dsse_path), "--trusted-keys", str(listed))
    assert r.returncode == 3 and f"trusted keys {listed}: no PEM public key in it" in r.stderr
    r = cli("verify", str(signed.dsse_path), "--trusted-keys", str(tmp_path / "absent.pem"))
    assert r.returncode == 3 and "cannot read it" in r.stderr


def _sm2_public_pem() -> bytes:
    """A public key on the SM2 curve (the Chinese national standard), which the cryptography
    library does not load: a P-256 key's SubjectPublicKeyInfo with SM2's curve OID in its place."""
    der = keys.generate().public.der
    p256, sm2 = bytes.fromhex("2a8648ce3d030107"), bytes.fromhex("2a811ccf5501822d")
    assert der.count(p256) == 1
    body = base64.encodebytes(der.replace(p256, sm2))
    return b"-----BEGIN PUBLIC KEY-----\n" + body + b"-----END PUBLIC KEY-----\n"


def test_each_key_is_trusted_once_in_the_order_given(signed: sign.Signed, tmp_path: Path) -> None:
    """`--key` in the order given, then each `--trusted-keys` file's keys; a key named twice is
    one key: verify names each key it tried once, in that order."""
    a, b = keys.generate().public, keys.generate().public  # neither signed the attestation
    pa, pb, listed = tmp_path / "a.pub", tmp_path / "b.pub", tmp_path / "trusted.pem"
    pa.write_bytes(a.pem)
    pb.write_bytes(b.pem)
    listed.write_bytes(b"# a\n" + a.pem + b"# b, again\n" + b.pem)
    r = cli(
        "verify", str(signed.dsse_path), "--key", str(pb), "--trusted-keys", str(listed), "--key", str(pa)
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"no signature verifies with key {b.fingerprint} or key {a.fingerprint}: signed with" in r.stdout
    assert [k.fingerprint for k in keys.trusted_keys([pa, pa], [listed])] == [a.fingerprint, b.fingerprint]


def test_a_key_that_is_not_one_is_refused_naming_which(tmp_path: Path) -> None:
    """In a key list, the key is named by its place; a key of an algorithm the library does not
    load (SM2) is refused as a malformed one is, never a traceback."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    good = keys.generate().public.pem
    listed = tmp_path / "trusted.pem"
    for bad in (b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", _sm2_public_pem()):
        listed.write_bytes(good + bad)
        with pytest.raises(
            UsageError, match=rf"^trusted keys {re.escape(str(listed))}: key 2 is not a PEM public key$"
        ):
            keys.load_trusted_keys(listed)
    one = tmp_path / "one.pub"
    for bad in (b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", _sm2_public_pem()):
        one.write_bytes(bad)
        with pytest.raises(
            UsageError,
            match=rf"^public key {re.escape(str(one))}: not a PEM public key \(SubjectPublicKeyInfo\)$",
        ):
            keys.load_public_key(one)
    p384 = ec.generate_private_key(ec.SECP384R1()).public_key()
    listed.write_bytes(
        good + p384.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(UsageError, match=rf"^{re.escape(str(listed))}: unsupported key type"):
        keys.load_trusted_keys(listed)
