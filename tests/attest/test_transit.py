"""Keys kept by a KMS: Vault's real transit engine (github.com/hashicorp/vault/builtin/logical/transit
of Vault 1.21.4, built from the Go module proxy by scripts/consumers.py into the harness of
tests/consumers/vault) holds the key `keygen --out hashivault://NAME` makes, not exportable;
`run --key hashivault://NAME` signs through it, and the statement verifies with the public half
alone. The token is never printed, and a wrong token, an absent key or a token that may not sign
fails before the run, naming the key and the server.

What answers is the engine itself, behind an HTTP front that maps requests and answers as
Vault's does. A STAND-IN, not Vault: the core around it (Vault's core does not build from the
served modules, tests/consumers/vault/go.mod says why): the tokens (a root token and one that
may only read transit/keys/*), their ACL, sys/capabilities-self and sys/health."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from imagegate.attest import kms
from imagegate.errors import UsageError
from tests.attest.conftest import HERE_RUN, Result, cli, free_port
from tests.helpers import go_tools
from tests.run.test_here_key import plant_thief, thief_lines

ROOT_TOKEN = "root-7f3c-never-printed"
# the harness's stand-in for a token whose policy is `path "transit/keys/*" { capabilities = ["read"] }`
READ_TOKEN = "reader-51d0-never-printed"


@dataclass(frozen=True)
class Vault:
    address: str
    folder: Path
    ca: Path | None = None  # HTTPS: the CA of the server's certificate

    def env(self, token: str = ROOT_TOKEN) -> dict[str, str]:
        return {"VAULT_ADDR": self.address, "VAULT_TOKEN": token}

    def call(self, method: str, route: str, body: object = None, token: str = ROOT_TOKEN) -> httpx.Response:
        return httpx.request(
            method,
            f"{self.address}/v1/{route}",
            json=body,
            headers={"X-Vault-Token": token},
            timeout=30,
            verify=ssl.create_default_context(cafile=str(self.ca)) if self.ca else True,
        )


def _write_tls(folder: Path) -> tuple[Path, Path, Path]:
    """A CA of the test's own and a certificate it signs for 127.0.0.1: (CA, cert, key) files."""
    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(
        subject: str,
        key: ec.EllipticCurvePrivateKey,
        issuer: str,
        signer: ec.EllipticCurvePrivateKey,
        ca: bool,
    ) -> x509.Certificate:
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
            b = b.add_extension(san, critical=False)
        return b.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = cert("imagegate test Vault CA", ca_key, "imagegate test Vault CA", ca_key, True)
    server = cert("127.0.0.1", key, "imagegate test Vault CA", ca_key, False)
    paths = (folder / "vault-ca.pem", folder / "vault-cert.pem", folder / "vault-key.pem")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


@contextlib.contextmanager
def vault_server(*, tls: bool = False) -> Iterator[Vault]:
    """Vault's transit engine (in memory, mounted at transit/, a root token and a read-only one of
    ours) on a free port of 127.0.0.1; its process group killed and its folder removed at the end.
    `tls`: HTTPS, its certificate signed by a CA of the test's own (written to the folder)."""
    script = go_tools("vault")
    exe = script.exe(script.named("vault"))
    folder = Path(tempfile.mkdtemp(prefix="imagegate-vault-"))
    port = free_port()
    log = (folder / "vault.log").open("wb")
    https: list[str] = []
    ca = None
    if tls:
        ca, cert, key = _write_tls(folder)
        https = ["-tls-cert", str(cert), "-tls-key", str(key)]
    argv = [exe, "-listen", f"127.0.0.1:{port}", "-root-token", ROOT_TOKEN, "-read-token", READ_TOKEN, *https]
    proc = subprocess.Popen(
        argv, env={"PATH": os.environ.get("PATH", ""), "HOME": str(folder)},
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        v = Vault(f"{'https' if tls else 'http'}://127.0.0.1:{port}", folder, ca)
        end = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError, OSError):
                if v.call("GET", "sys/health").status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > end:
                pytest.fail("vault-transit did not start: " + (folder / "vault.log").read_text()[-2000:])
            time.sleep(0.2)
        yield v
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def vault() -> Iterator[Vault]:
    with vault_server() as v:
        yield v


def _keygen(tmp_path: Path, vault: Vault, name: str, *extra: str) -> Result:
    return cli("keygen", "--out", f"hashivault://{name}", *extra, env=vault.env(), cwd=tmp_path)


def _printed(r: Result) -> str:
    return r.stdout + r.stderr


def test_keygen_makes_the_key_in_vault_and_vault_never_exports_it(tmp_path: Path, vault: Vault) -> None:
    before = set(tmp_path.rglob("*"))
    r = _keygen(tmp_path, vault, "made")
    assert r.returncode == 0, r.stderr
    assert "in Vault's transit engine" in r.stdout and "not extractable" in r.stdout
    assert ROOT_TOKEN not in _printed(r)
    assert set(tmp_path.rglob("*")) - before == {tmp_path / "made.pub"}  # the public half only
    assert (tmp_path / "made.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    key = vault.call("GET", "transit/keys/made").json()["data"]
    assert (key["type"], key["exportable"], key["latest_version"]) == ("ecdsa-p256", False, 1)
    # the private half cannot be read out, by the root token itself
    export = vault.call("GET", "transit/export/signing-key/made")
    assert export.status_code == 400 and "not exportable" in export.text, export.text
    again = _keygen(tmp_path, vault, "made", "--pub", str(tmp_path / "again.pub"))
    assert again.returncode == 3 and "already holds a key of that name" in again.stderr
    assert not (tmp_path / "again.pub").exists()


@pytest.mark.parametrize("algorithm", ["ecdsa-p256", "ed25519"])
def test_a_run_signed_in_vault_verifies_with_its_public_half(
    tmp_path: Path, vault: Vault, algorithm: str
) -> None:
    name = f"run-{algorithm}"
    assert _keygen(tmp_path, vault, name, "--algorithm", algorithm).returncode == 0
    assert vault.call("GET", f"transit/keys/{name}").json()["data"]["type"] == algorithm
    env = {**vault.env(), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    r = cli(*HERE_RUN, "-o", "runs", "--key", f"hashivault://{name}", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert ROOT_TOKEN not in _printed(r)
    assert not (tmp_path / "cfg" / "imagegate" / "signing.key").exists()  # no default key made
    assert "in Vault (fingerprint" in r.stdout and f"public-key --key 'hashivault://{name}'" in r.stdout
    (dsse,) = (tmp_path / "runs").glob("*/*/attestation.dsse.json")
    pub = tmp_path / f"{name}.pub"
    v = cli("verify", str(dsse), "--key", str(pub), cwd=tmp_path)
    assert v.returncode == 0 and "verified: verdict PASS" in v.stdout, _printed(v)
    assert f"({algorithm})" in v.stdout
    # `public-key` reads the same public half from Vault
    p = cli("public-key", "--key", f"hashivault://{name}", env=vault.env())
    assert p.returncode == 0 and p.stdout == pub.read_text(), p.stderr
    # another key's public half refuses the statement
    assert _keygen(tmp_path, vault, f"{name}-other").returncode == 0
    w = cli("verify", str(dsse), "--key", str(tmp_path / f"{name}-other.pub"), cwd=tmp_path)
    assert w.returncode != 0
    assert len(json.loads(dsse.read_text())["signatures"]) == 1


def test_the_probes_see_neither_the_token_nor_vaults_token_file(tmp_path: Path, vault: Vault) -> None:
    """The token signs with the key in Vault: the hostile environment of tests/run/test_here_key.py
    looks for it in its own environment, its ancestors', every process's and ~/.vault-token."""
    assert _keygen(tmp_path, vault, "watched").returncode == 0
    venv, home, out, drop = (tmp_path / n for n in ("env", "home", "out", "drop"))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    for d in (home, out, drop):
        d.mkdir()
    (home / ".vault-token").write_text(ROOT_TOKEN)  # where `vault login` leaves it
    plant_thief(
        venv,
        {
            "keys": {"Vault's token file": str(home / ".vault-token")},
            "default_folder": str(tmp_path / "cfg" / "imagegate"),
            "secrets": [ROOT_TOKEN, "VAULT_TOKEN"],
            "engine_socket": "/var/run/docker.sock",
            "evidence": str(out),
            "drop": str(drop),
        },
    )
    env = {**vault.env(), "HOME": str(home), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    argv = ("run", "--here", "--python", str(venv / "bin" / "python"), "-p", "python", "-m", "json")
    r = cli(*argv, "-o", str(out), "--key", "hashivault://watched", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (attempt,) = out.glob("*/*/")
    lines = thief_lines(attempt)
    assert lines and not [x for x in lines if "FOUND" in x], lines
    assert any(x.startswith("thief: read Vault's token file: ") for x in lines), lines
    isolation = json.loads((attempt / "statement.json").read_text())["predicate"]["environment"]
    assert "Vault's token file" in isolation["key_isolation"]["hidden"]
    assert "thief: own environment: nothing" in "\n".join(lines)
    assert not [f for f in drop.iterdir() if "FOUND" in f.read_text()]
    v = cli("verify", str(attempt / "attestation.dsse.json"), "--key", str(tmp_path / "watched.pub"))
    assert v.returncode == 0, _printed(v)


def test_a_wrong_token_or_an_absent_key_stops_before_the_run(tmp_path: Path, vault: Vault) -> None:
    assert _keygen(tmp_path, vault, "gate").returncode == 0
    argv = (*HERE_RUN, "-o", "runs")
    wrong = cli(*argv, "--key", "hashivault://gate", env=vault.env("hvs.not-a-token-4711"), cwd=tmp_path)
    assert wrong.returncode == 3, _printed(wrong)
    assert "hashivault://gate" in wrong.stderr and vault.address in wrong.stderr
    # Vault's two errors for an unknown token, one line (it answers them as one multierror text)
    assert "(permission denied; invalid token)" in wrong.stderr and "VAULT_TOKEN" in wrong.stderr
    assert "\t" not in wrong.stderr and "errors occurred" not in wrong.stderr
    assert "not-a-token-4711" not in _printed(wrong) and ROOT_TOKEN not in _printed(wrong)
    absent = cli(*argv, "--key", "hashivault://absent", env=vault.env(), cwd=tmp_path)
    assert (
        absent.returncode == 3 and "hashivault://absent" in absent.stderr and "no such key" in absent.stderr
    )
    none = cli(*argv, "--key", "hashivault://gate", env=vault.env(""), cwd=tmp_path)
    assert none.returncode == 3 and "VAULT_TOKEN" in none.stderr
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_a_key_deleted_after_it_was_opened_is_named(tmp_path: Path, vault: Vault) -> None:
    """The engine answers a sign with no such key 400 "signing key not found", not 404."""
    assert _keygen(tmp_path, vault, "deleted").returncode == 0
    key = kms.open_key("hashivault://deleted", vault.env())
    assert len(key.sign(b"before")) > 0
    allowed = vault.call("POST", "transit/keys/deleted/config", {"deletion_allowed": True})
    assert allowed.status_code == 200, allowed.text
    assert vault.call("DELETE", "transit/keys/deleted").status_code == 204
    with pytest.raises(UsageError, match=r"hashivault://deleted .*: no such key any more"):
        key.sign(b"after")


def test_a_token_that_may_only_read_the_key_cannot_sign(tmp_path: Path, vault: Vault) -> None:
    assert _keygen(tmp_path, vault, "guarded").returncode == 0
    reader = READ_TOKEN
    # the engine is refused the signature for it
    refused = vault.call("POST", "transit/sign/guarded", {"input": "aGk="}, token=reader)
    assert refused.status_code == 403 and "permission denied" in refused.text, refused.text
    # it may read the public half
    p = cli("public-key", "--key", "hashivault://guarded", env=vault.env(reader))
    assert p.returncode == 0 and p.stdout == (tmp_path / "guarded.pub").read_text(), p.stderr
    r = cli(*HERE_RUN, "-o", "runs", "--key", "hashivault://guarded", env=vault.env(reader), cwd=tmp_path)
    assert r.returncode == 3, _printed(r)
    # Vault's ACL answers "deny" for a path no policy grants
    assert "the token may not sign with the key" in r.stderr and "transit/sign/guarded: deny" in r.stderr
    assert "hashivault://guarded" in r.stderr and vault.address in r.stderr and reader not in _printed(r)
    assert not (tmp_path / "runs").exists()


def test_a_vault_that_has_stopped_is_named(tmp_path: Path) -> None:
    with vault_server() as v:
        assert _keygen(tmp_path, v, "gate").returncode == 0
    gone = cli("public-key", "--key", "hashivault://gate", env=v.env())  # the server has stopped
    assert gone.returncode == 3 and "Vault cannot be reached" in gone.stderr and v.address in gone.stderr


def test_the_server_is_spoken_to_only_as_safely_as_the_token_deserves() -> None:
    env = {"VAULT_ADDR": "http://127.0.0.1:8200", "VAULT_TOKEN": "t"}
    assert kms.server(env).mount == "transit"
    assert kms.server({**env, "TRANSIT_SECRET_ENGINE_PATH": "/ci/transit/"}).mount == "ci/transit"
    assert "token=" not in repr(kms.server(env))
    for bad, said in [
        ({"VAULT_ADDR": "http://vault.example:8200"}, "send the token in clear"),
        ({"VAULT_SKIP_VERIFY": "true"}, "not sign through a server it has not verified"),
        ({"VAULT_ADDR": ""}, "needs the Vault server's address"),
        ({"VAULT_ADDR": "vault:8200"}, "not a Vault address"),
        ({"VAULT_TOKEN": ""}, "needs a Vault token"),
        ({"TRANSIT_SECRET_ENGINE_PATH": "a/../b"}, "not a secrets engine's mount path"),
        ({"TRANSIT_SECRET_ENGINE_PATH": "transit?x=1"}, "not a secrets engine's mount path"),
    ]:
        with pytest.raises(UsageError, match=said):
            kms.server({**env, **bad})
    assert kms.key_name("hashivault://ci.gate-1") == "ci.gate-1"
    for bad_name in ("hashivault://", "hashivault://a/../b", "hashivault://-a", "hashivault://a?b"):
        with pytest.raises(UsageError, match="not a transit key's name"):
            kms.key_name(bad_name)


def test_over_https_the_server_is_verified_with_vault_cacert(tmp_path: Path) -> None:
    with vault_server(tls=True) as v:
        assert v.ca is not None
        unverified = cli("keygen", "--out", "hashivault://tls", env=v.env(), cwd=tmp_path)
        assert unverified.returncode == 3 and "cannot be reached (TLS: " in unverified.stderr
        assert v.address in unverified.stderr and ROOT_TOKEN not in _printed(unverified)
        env = {**v.env(), "VAULT_CACERT": str(v.ca)}
        made = cli("keygen", "--out", "hashivault://tls", env=env, cwd=tmp_path)
        assert made.returncode == 0, made.stderr
        p = cli("public-key", "--key", "hashivault://tls", env=env)
        assert p.stdout == (tmp_path / "tls.pub").read_text(), p.stderr
        skip = cli("public-key", "--key", "hashivault://tls", env={**env, "VAULT_SKIP_VERIFY": "1"})
        assert skip.returncode == 3 and "VAULT_SKIP_VERIFY" in skip.stderr


def test_a_vault_that_is_not_there_stops_the_run_before_it_begins(tmp_path: Path) -> None:
    address = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = {"VAULT_ADDR": address, "VAULT_TOKEN": ROOT_TOKEN}
    r = cli(*HERE_RUN, "-o", "runs", "--key", "hashivault://gate", env=env, cwd=tmp_path)
    assert r.returncode == 3, _printed(r)
    assert "hashivault://gate (Vault at " + address in r.stderr and "cannot be reached" in r.stderr
    assert ROOT_TOKEN not in _printed(r)
    assert not (tmp_path / "runs").exists()
