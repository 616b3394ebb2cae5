"""What a Vault may answer that its transit engine never would: a server in front of it that is
broken, or one that is not Vault at all (DNS, a proxy, a compromised host). A STAND-IN, on
purpose: a small HTTP server of the test's own answering crafted JSON, for the answers the real
engine (tests/attest/test_transit.py) cannot be made to give. Each must stop the command with a
message naming the key and the server, and never hand on a signature nobody can check."""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed

from imagegate.attest import kms
from imagegate.errors import UsageError
from tests.helpers import serving
from tests.oci.token_server import SigningKey

# what the server answers a route under /v1/: (status, body, headers), or a function of the request's JSON
Answer = tuple[int, bytes, dict[str, str]]
Routes = dict[str, Answer | Callable[[object], Answer]]
TOKEN = "t-never-printed"


def _json(status: int, value: object) -> Answer:
    return status, json.dumps(value).encode(), {"Content-Type": "application/json"}


@contextlib.contextmanager
def fake_vault(routes: Routes) -> Iterator[dict[str, str]]:
    """A server on 127.0.0.1 answering `routes` ("METHOD route", 404 elsewhere); yields the
    environment that names it."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            answer = routes.get(
                f"{self.command} {self.path.removeprefix('/v1/')}", _json(404, {"errors": []})
            )
            status, data, headers = answer(body) if callable(answer) else answer
            self.send_response(status)
            for k, v in {"Content-Length": str(len(data)), **headers}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        yield {"VAULT_ADDR": url, "VAULT_TOKEN": TOKEN}


def _pem(key: ec.EllipticCurvePrivateKey) -> str:
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    return key.public_key().public_bytes(serialization.Encoding.PEM, spki).decode()


def _key(kind: str, public: str, version: int = 1) -> Answer:
    data = {"type": kind, "supports_signing": True, "latest_version": version}
    return _json(200, {"data": {**data, "keys": {str(version): {"public_key": public}}}})


def _ed25519() -> Answer:
    raw = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    return _key("ed25519", base64.b64encode(raw).decode())


CAN_SIGN = _json(200, {"transit/sign/k": ["update"], "data": {"transit/sign/k": ["update"]}})


def _signing(signature: Callable[[bytes], str]) -> Callable[[object], Answer]:
    """The sign route, answering `signature(digest)` for the digest it is handed."""

    def answer(body: object) -> Answer:
        assert isinstance(body, dict) and body["prehashed"] is True
        return _json(200, {"data": {"signature": signature(base64.b64decode(body["input"]))}})

    return answer


def _der(key: ec.EllipticCurvePrivateKey, digest: bytes) -> str:
    return base64.b64encode(key.sign(digest, ec.ECDSA(Prehashed(hashes.SHA256())))).decode()


def test_a_signature_that_is_not_the_keys_is_never_handed_on() -> None:
    mine, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    routes: Routes = {
        "GET transit/keys/k": _key("ecdsa-p256", _pem(mine)),
        "POST sys/capabilities-self": CAN_SIGN,
    }
    cases: list[tuple[str, Callable[[bytes], str]]] = [
        ("", lambda d: "vault:v1:" + _der(mine, d)),  # the honest answer
        ("not base64", lambda d: "vault:v1:!!not base64!!"),
        ("not base64", lambda d: "vault:v1:!" + _der(mine, d)),  # the key's, with a character that is none
        ("not one of key version 1", lambda d: "vault:v2:" + _der(mine, d)),
        ("not one of key version 1", lambda d: _der(mine, d)),
        ("does not verify with the key's public key", lambda d: "vault:v1:" + _der(other, d)),
    ]
    for said, signature in cases:
        with fake_vault({**routes, "POST transit/sign/k": _signing(signature)}) as env:
            key = kms.open_key("hashivault://k", env)
            if not said:
                assert key.public.verify(key.sign(b"statement"), b"statement")
                continue
            with pytest.raises(UsageError, match=said) as e:
                key.sign(b"statement")
            assert "hashivault://k (Vault at http://127.0.0.1:" in str(e.value) and TOKEN not in str(e.value)


@pytest.mark.parametrize(
    ("asked", "made", "said"),
    [("ecdsa-p256", "ed25519", "Vault made a ed25519 key, not ecdsa-p256"),
     ("ed25519", "ecdsa-p256", "Vault made a ecdsa-p256 key, not ed25519")],
)  # fmt: skip
def test_keygen_refuses_a_key_of_another_kind_than_it_asked_for(asked: str, made: str, said: str) -> None:
    created: list[object] = []

    def create(body: object) -> Answer:
        created.append(body)
        return 204, b"", {}

    given = (
        _ed25519() if made == "ed25519" else _key("ecdsa-p256", _pem(ec.generate_private_key(ec.SECP256R1())))
    )
    answers = iter([_json(404, {"errors": []}), given])  # none yet, then what it "made"
    routes: Routes = {"GET transit/keys/k": lambda _: next(answers), "POST transit/keys/k": create}
    with fake_vault(routes) as env, pytest.raises(UsageError, match=said):
        kms.generate("hashivault://k", env, asked)  # type: ignore[arg-type]
    assert created == [{"type": asked, "exportable": False}]


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (_key("rsa-2048", "x"), "a rsa-2048 key: imagegate signs with ecdsa-p256 or ed25519"),
        (_key("ecdsa-p256", "not a PEM"), "Vault's public key is not a ecdsa-p256 key"),
        (_key("ecdsa-p256", _pem(ec.generate_private_key(ec.SECP384R1()))), "is not a ecdsa-p256 key"),
        (_key("ed25519", base64.b64encode(b"short").decode()), "is not a ed25519 key"),
        (_key("ed25519", "%%%"), "is not a ed25519 key"),
        (
            _json(200, {"data": {"type": "ecdsa-p256", "latest_version": 2, "keys": {}}}),
            "names no public key",
        ),
        ((200, b"<html>a login page</html>", {}), "GET /v1/transit/keys/k: Vault's answer is"),
        ((200, b"{" + b" " * kms.MAX_ANSWER_BYTES + b"}", {}), "the answer to GET /v1/transit/keys/k"),
        (_json(503, {"errors": ["Vault is sealed"]}), "Vault is sealed"),
        (
            (307, b"", {"Location": "http://elsewhere.example/v1/x"}),
            "redirected .* to http://elsewhere.example",
        ),
        (
            _json(500, {"errors": ["internal error\n\tat line 3"]}),
            r"answered 500 .*\(internal error; at line 3\)",
        ),
    ],
)
def test_a_key_vault_describes_badly_stops_before_the_run(answer: Answer, said: str) -> None:
    with fake_vault({"GET transit/keys/k": answer}) as env, pytest.raises(UsageError, match=said) as e:
        kms.open_key("hashivault://k", env)
    assert "hashivault://k" in str(e.value) and TOKEN not in str(e.value)


@pytest.mark.parametrize(
    ("caps", "refused"),
    [
        ({"transit/sign/k": ["read"]}, True),
        ({"data": {"transit/sign/k": ["deny"]}}, True),
        ({"transit/sign/k": ["update"]}, False),
        ({"data": {"transit/sign/k": ["root"]}}, False),
        ({"data": {"transit/sign/k": ["read", "sudo"]}}, False),
        ({}, False),  # an answer that says nothing: the signature itself will say
    ],
)
def test_a_token_is_refused_for_what_its_capabilities_leave_out(
    caps: dict[str, object], refused: bool
) -> None:
    """sys/capabilities-self answers a path's capabilities at the top and again under data."""
    with fake_vault(
        {"GET transit/keys/k": _ed25519(), "POST sys/capabilities-self": _json(200, caps)}
    ) as env:
        if refused:
            with pytest.raises(UsageError, match="the token may not sign with the key"):
                kms.open_key("hashivault://k", env)
        else:
            assert kms.open_key("hashivault://k", env).algorithm == "ed25519"


def test_a_token_not_allowed_to_ask_its_capabilities_is_not_refused_for_that() -> None:
    """A policy without Vault's default one: sys/capabilities-self is refused, the key opens, and
    the signature itself will say whether the token may sign."""
    denied = _json(403, {"errors": ["permission denied"]})
    with fake_vault({"GET transit/keys/k": _ed25519(), "POST sys/capabilities-self": denied}) as env:
        assert kms.open_key("hashivault://k", env).version == 1


def _ca_file(folder: Path) -> Path:
    ca = SigningKey.self_signed("a test CA").cert
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return folder / "ca.pem"


def test_an_https_vault_elsewhere_is_accepted_and_a_bad_ca_file_named(tmp_path: Path) -> None:
    env = {"VAULT_ADDR": "https://vault.example:8200", "VAULT_TOKEN": "t"}
    assert kms.server(env).address == "https://vault.example:8200"
    assert kms._verify(kms.server(env)) is True  # the system's CAs
    for bad in ("ftp://vault.example:8200", "https://vault.example/v1", "https://:8200"):
        with pytest.raises(UsageError, match="not a Vault address"):
            kms.server({**env, "VAULT_ADDR": bad})
    assert isinstance(
        kms._verify(kms.server({**env, "VAULT_CACERT": str(_ca_file(tmp_path))})), ssl.SSLContext
    )
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(UsageError, match=r"VAULT_CACERT=.*garbage.pem: not a CA file"):
        kms._verify(kms.server({**env, "VAULT_CACERT": str(garbage)}))
    with pytest.raises(UsageError, match=r"absent.pem: no such file"):
        kms._verify(kms.server({**env, "VAULT_CACERT": str(tmp_path / "absent.pem")}))
