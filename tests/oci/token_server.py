"""A real token server for `docker-registry` (distribution 2.8) in token-auth mode.

The registry answers 401 with `WWW-Authenticate: Bearer realm=...,service=...,scope=...`; the
client asks the realm for a token (Basic credentials, or an identity token POSTed as an OAuth2
refresh token) and sends it back as `Authorization: Bearer`. Distribution 2.8 accepts a JWS
compact token whose header carries an `x5c` chain ending in a certificate of `rootcertbundle`,
and whose claims carry `iss` (= issuer), `aud` (= service, one string), `exp`/`nbf` (60 s of
leeway), `iat`, `jti`, `sub` and `access: [{type, name, actions}]`. Signing is ES256 (raw
r||s, as JWS wants, not DER) with a self-signed P-256 certificate made here."""

from __future__ import annotations

import base64
import datetime
import http.server
import json
import secrets
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from tests.oci.infra import Registry, free_port

TOKEN_TTL_S = 300


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class SigningKey:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def self_signed(cls, common_name: str = "imagegate test token issuer") -> SigningKey:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def sign_jwt(self, claims: dict[str, Any]) -> str:
        """A JWS compact serialisation, ES256, with the certificate as a one-element `x5c`."""
        x5c = base64.b64encode(self.cert.public_bytes(serialization.Encoding.DER)).decode()
        header = {"typ": "JWT", "alg": "ES256", "x5c": [x5c]}
        signing_input = (
            b64url(json.dumps(header, separators=(",", ":")).encode())
            + "."
            + b64url(json.dumps(claims, separators=(",", ":")).encode())
        )
        der = self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
        r, s = decode_dss_signature(der)
        return signing_input + "." + b64url(r.to_bytes(32, "big") + s.to_bytes(32, "big"))


@dataclass
class TokenRequest:
    """One request the token server answered, as it saw it."""

    method: str
    user: str | None  # the authenticated account; None for anonymous
    scopes: list[str]
    service: str | None
    status: int
    user_agent: str
    grant_type: str | None = None


@dataclass
class TokenServer:
    """Checks Basic credentials (or a refresh token) and issues a JWT granting the pull/push
    actions asked for on `repository:` scopes. Anonymous requests get a token with no access,
    as Docker Hub and Harbor give for private repositories; wrong credentials get a 401."""

    users: dict[str, str]
    service: str = "imagegate-test-registry"
    issuer: str = "imagegate-test-token-issuer"
    refresh_tokens: dict[str, str] = field(default_factory=dict)  # refresh token -> user
    signing: SigningKey = field(default_factory=SigningKey.self_signed)
    requests: list[TokenRequest] = field(default_factory=list)
    host: str = ""
    _server: http.server.ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def realm(self) -> str:
        return f"http://{self.host}/token"

    def seen(self, user_agent_prefix: str) -> list[TokenRequest]:
        with self._lock:
            return [r for r in self.requests if r.user_agent.startswith(user_agent_prefix)]

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    @staticmethod
    def granted(scopes: list[str]) -> list[dict[str, Any]]:
        access = []
        for scope in scopes:
            parts = scope.split(":")
            if len(parts) < 3 or parts[0] != "repository":
                continue
            name, actions = ":".join(parts[1:-1]), parts[-1].split(",")
            allowed = [a for a in actions if a in ("pull", "push")]
            if allowed:
                access.append({"type": "repository", "name": name, "actions": allowed})
        return access

    def issue(self, user: str | None, scopes: list[str]) -> dict[str, Any]:
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "sub": user or "",
            "aud": self.service,
            "exp": now + TOKEN_TTL_S,
            "nbf": now - 1,
            "iat": now,
            "jti": secrets.token_hex(16),
            "access": self.granted(scopes) if user else [],
        }
        token = self.signing.sign_jwt(claims)
        issued_at = datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat()
        return {"token": token, "access_token": token, "expires_in": TOKEN_TTL_S, "issued_at": issued_at}

    def _basic_user(self, header: str | None) -> tuple[bool, str | None]:
        """(credentials acceptable, user): no header is anonymous, a wrong one is refused."""
        if not header:
            return True, None
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            return False, None
        try:
            user, _, password = base64.b64decode(value).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False, None
        if user in self.users and secrets.compare_digest(self.users[user], password):
            return True, user
        return False, None

    def start(self) -> TokenServer:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _answer(self, status: int, body: dict[str, Any], extra: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _record(self, status: int, user: str | None, q: dict[str, list[str]]) -> None:
                scopes = [s for value in q.get("scope", []) for s in value.split(" ") if s]
                with server._lock:
                    server.requests.append(
                        TokenRequest(
                            self.command,
                            user,
                            scopes,
                            (q.get("service") or [None])[0],
                            status,
                            self.headers.get("User-Agent", ""),
                            (q.get("grant_type") or [None])[0],
                        )
                    )

            def _handle(self, q: dict[str, list[str]], ok: bool, user: str | None) -> None:
                scopes = [s for value in q.get("scope", []) for s in value.split(" ") if s]
                if not ok:
                    self._record(401, None, q)
                    err = {"errors": [{"code": "UNAUTHORIZED", "message": "invalid username or password"}]}
                    self._answer(401, err, {"WWW-Authenticate": 'Basic realm="imagegate-test-token"'})
                    return
                if (q.get("service") or [None])[0] not in (None, server.service):
                    self._record(400, user, q)
                    self._answer(400, {"errors": [{"code": "DENIED", "message": "unknown service"}]})
                    return
                self._record(200, user, q)
                self._answer(200, server.issue(user, scopes))

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path != "/token":
                    self._answer(404, {"errors": [{"code": "NOT_FOUND", "message": url.path}]})
                    return
                ok, user = server._basic_user(self.headers.get("Authorization"))
                self._handle(parse_qs(url.query), ok, user)

            def do_POST(self) -> None:
                """OAuth2 (docker login with an identity token): grant_type=refresh_token."""
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                q = parse_qs(self.rfile.read(length).decode()) if length else {}
                if url.path != "/token":
                    self._answer(404, {"errors": [{"code": "NOT_FOUND", "message": url.path}]})
                    return
                grant = (q.get("grant_type") or [""])[0]
                if grant == "refresh_token":
                    user = server.refresh_tokens.get((q.get("refresh_token") or [""])[0])
                    self._handle(q, user is not None, user)
                elif grant == "password":
                    name, password = (q.get("username") or [""])[0], (q.get("password") or [""])[0]
                    good = name in server.users and secrets.compare_digest(server.users[name], password)
                    self._handle(q, good, name if good else None)
                else:
                    self._record(400, None, q)
                    self._answer(400, {"error": "unsupported_grant_type"})

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def start_token_registry(workdir: Path, tokens: TokenServer) -> Registry:
    """`docker-registry serve` on a free loopback port that trusts `tokens`' certificate.
    Logs as JSON at info level: one line per request, with the account its token named."""
    port = free_port()
    root = workdir / "storage"
    root.mkdir(parents=True, exist_ok=True)
    bundle = workdir / "token-root.pem"
    bundle.write_bytes(tokens.signing.cert_pem())
    config = (
        "version: 0.1\nlog:\n  level: info\n  formatter: json\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
        "auth:\n  token:\n"
        f"    realm: {tokens.realm}\n    service: {tokens.service}\n"
        f"    issuer: {tokens.issuer}\n    rootcertbundle: {bundle}\n"
    )
    cfg = workdir / "config.yml"
    cfg.write_text(config)
    log = open(workdir / "registry.log", "wb")  # noqa: SIM115  (the registry writes it until stopped)
    proc = subprocess.Popen(["docker-registry", "serve", str(cfg)], stdout=log, stderr=log)
    reg = Registry(f"127.0.0.1:{port}", root, proc)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            if httpx.get(f"http://{reg.host}/v2/", timeout=2).status_code == 401:
                return reg
        except httpx.TransportError:
            time.sleep(0.1)
    reg.stop()
    raise AssertionError(f"docker-registry did not start: {(workdir / 'registry.log').read_text()[-2000:]}")


def registry_log(workdir: Path) -> list[dict[str, Any]]:
    """The registry's JSON log lines about requests, oldest first: per request an "authorized
    request" (a valid token came with it) or an "error authorizing context" (401), then a
    "response completed" with `http.response.status`, all keyed by `http.request.id`."""
    out = []
    for line in (workdir / "registry.log").read_text().splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue  # the combined access log lines
        if isinstance(doc, dict) and "http.request.id" in doc:
            out.append(doc)
    return out
