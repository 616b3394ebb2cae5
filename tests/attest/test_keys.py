"""Keys: file modes, passphrases, the lookup order, the default key made on first use."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from imagegate.attest import keys
from imagegate.errors import UsageError
from tests.attest.conftest import cli


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_keygen_writes_pkcs8_key_0600_and_spki_public_key(tmp_path: Path) -> None:
    r = cli("keygen", "--out", str(tmp_path / "k" / "gate"), env={keys.PASSWORD_ENV: ""})
    assert r.returncode == 0, r.stderr
    priv, pub = tmp_path / "k" / "gate.key", tmp_path / "k" / "gate.pub"
    assert _mode(priv) == 0o600
    assert priv.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8, unencrypted
    assert pub.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")  # SubjectPublicKeyInfo
    loaded = keys.load_signing_key(priv)
    assert loaded.algorithm == "ecdsa-p256"
    assert keys.load_public_key(pub).fingerprint == loaded.public.fingerprint
    assert loaded.public.fingerprint in r.stdout
    assert "PRIVATE" not in r.stdout + r.stderr  # never the key itself


def test_keygen_refuses_to_overwrite(tmp_path: Path) -> None:
    assert cli("keygen", "--out", str(tmp_path / "gate")).returncode == 0
    before = (tmp_path / "gate.key").read_bytes()
    r = cli("keygen", "--out", str(tmp_path / "gate"))
    assert r.returncode == 3 and "already exists" in r.stderr
    assert (tmp_path / "gate.key").read_bytes() == before


def test_passphrase_protected_key(tmp_path: Path) -> None:
    r = cli(
        "keygen", "--out", str(tmp_path / "gate"), "--algorithm", "ed25519", env={keys.PASSWORD_ENV: "s3cret"}
    )
    assert r.returncode == 0, r.stderr
    priv = tmp_path / "gate.key"
    assert priv.read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
    assert b"s3cret" not in priv.read_bytes()
    assert keys.load_signing_key(priv, b"s3cret").algorithm == "ed25519"
    with pytest.raises(UsageError, match="passphrase-protected") as e:
        keys.load_signing_key(priv)
    assert keys.PASSWORD_ENV in (e.value.hint or "")
    with pytest.raises(UsageError, match="wrong passphrase"):
        keys.load_signing_key(priv, b"wrong")


def test_public_and_private_keys_are_not_confused(keypair: tuple[Path, Path]) -> None:
    priv, pub = keypair
    with pytest.raises(UsageError, match="this is a private key"):
        keys.load_public_key(priv)
    with pytest.raises(UsageError, match="not a PEM private key"):
        keys.load_signing_key(pub)


def test_other_curves_are_refused(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    p = tmp_path / "p384.key"
    p.write_bytes(
        ec.generate_private_key(ec.SECP384R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    with pytest.raises(UsageError, match="unsupported key type"):
        keys.load_signing_key(p)


def test_lookup_order_flag_then_env_then_default(tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    priv, _ = keypair
    other, _ = keys.write_keypair(tmp_path / "other", keys.generate("ed25519"), None)
    env = {keys.KEY_ENV: str(other), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    assert keys.resolve_signing_key(priv, env=env).path == priv
    assert keys.resolve_signing_key(None, env=env).path == other


def test_default_key_is_made_once_and_announced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    said: list[str] = []
    first = keys.resolve_signing_key(None, env={}, notify=said.append)
    path = tmp_path / "cfg" / "imagegate" / "signing.key"
    assert first.path == path and _mode(path) == 0o600
    assert (tmp_path / "cfg" / "imagegate" / "signing.pub").is_file()
    assert len(said) == 1 and str(path) in said[0] and first.public.fingerprint in said[0]
    again = keys.resolve_signing_key(None, env={}, notify=said.append)
    assert again.public.fingerprint == first.public.fingerprint and len(said) == 1
    with pytest.raises(UsageError, match="no signing key"):
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "empty"))
        keys.resolve_signing_key(None, env={}, create_default=False)


def test_repr_never_shows_the_key(key: keys.SigningKey) -> None:
    assert "PRIVATE" not in repr(key) and key.public.fingerprint in repr(key)


def test_the_suite_never_signs_with_the_users_own_key(tmp_path: Path, own_config_folder: Path) -> None:
    """A passphrase-protected key in the user's own config folder must not reach any test: the
    suite's key lives in its own temporary folder, and the CLI it starts signs with that one."""
    home = tmp_path / "home"
    keys.write_keypair(home / ".config" / "imagegate" / "signing", keys.generate(), b"secret")
    assert keys.default_key_path().is_relative_to(own_config_folder)
    r = cli(
        "run",
        "--here",
        "--python",
        sys.executable,
        "-p",
        "python",
        "-m",
        "json",
        "-o",
        str(tmp_path / "o"),
        env={"HOME": str(home)},
    )
    assert r.returncode == 0, r.stderr
    assert next((tmp_path / "o").glob("*/*/attestation.dsse.json")).is_file()
    assert (own_config_folder / "imagegate" / "signing.key").is_file()
