"""`verify` trusts the keys it is given (`--key` repeatable, `--trusted-keys FILE`), never fewer
than one, and a key list that is not one is refused, named."""

from __future__ import annotations

from pathlib import Path

from imagegate.attest import keys, sign
from tests.attest.conftest import cli


def test_verify_without_a_key_is_a_usage_error(signed: sign.Signed) -> None:
    r = cli("verify", str(signed.dsse_path))
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
