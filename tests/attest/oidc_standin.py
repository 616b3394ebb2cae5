"""A stand-in for the OIDC issuers of GitHub Actions and GitLab CI, for the tests' own Sigstore
(tests/attest/sigstore_local.py): OpenID discovery, a JWKS and RS256 ID tokens whose claims are
shaped as those CIs' tokens are, served on 127.0.0.1 by this process. Not an issuer anyone else
trusts: its key is made when it starts and its URL is local (plain HTTP: Fulcio fetches the
discovery document and the keys with go-oidc, which takes an http:// issuer as it is).

One server holds both issuers, each under its own path: {url}/github and {url}/gitlab.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

Kind = Literal["github", "gitlab"]
KINDS: tuple[Kind, ...] = ("github", "gitlab")
# The audience Fulcio's issuers are configured with and sigstore-python asks for.
AUDIENCE = "sigstore"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _uint(n: int) -> str:
    return _b64(n.to_bytes((n.bit_length() + 7) // 8, "big"))


def github_claims(repository: str, ref: str) -> dict[str, object]:
    """The claims of a GitHub Actions job's token on a push to `ref` (as GitHub documents them:
    "About security hardening with OpenID Connect"), the workflow .github/workflows/release.yml."""
    owner = repository.split("/")[0]
    sha = "a" * 40
    workflow_ref = f"{repository}/.github/workflows/release.yml@{ref}"
    return {
        "sub": f"repo:{repository}:ref:{ref}",
        "ref": ref,
        "ref_type": "branch" if ref.startswith("refs/heads/") else "tag",
        "sha": sha,
        "repository": repository,
        "repository_id": "101",
        "repository_owner": owner,
        "repository_owner_id": "100",
        "repository_visibility": "public",
        "actor": owner,
        "actor_id": "100",
        "workflow": "release",
        "workflow_ref": workflow_ref,
        "workflow_sha": sha,
        "job_workflow_ref": workflow_ref,
        "job_workflow_sha": sha,
        "event_name": "push",
        "run_id": "7",
        "run_number": "7",
        "run_attempt": "1",
        "runner_environment": "github-hosted",
        "head_ref": "",
        "base_ref": "",
    }


def gitlab_claims(project: str, ref: str) -> dict[str, object]:
    """The claims of a GitLab CI job's ID token on a push to branch `ref` (GitLab's "ID token
    authentication" page), the pipeline .gitlab-ci.yml of the project itself."""
    namespace = project.split("/")[0]
    sha = "b" * 40
    return {
        "sub": f"project_path:{project}:ref_type:branch:ref:{ref}",
        "namespace_id": "200",
        "namespace_path": namespace,
        "project_id": "201",
        "project_path": project,
        "project_visibility": "public",
        "user_id": "202",
        "user_login": namespace,
        "pipeline_id": "203",
        "pipeline_source": "push",
        "job_id": "204",
        "ref": ref,
        "ref_type": "branch",
        "ref_path": f"refs/heads/{ref}",
        "ref_protected": "true",
        "sha": sha,
        "ci_config_ref_uri": f"gitlab.com/{project}//.gitlab-ci.yml@refs/heads/{ref}",
        "ci_config_sha": sha,
        "runner_id": 205,
        "runner_environment": "gitlab-hosted",
    }


@dataclass
class Issuers:
    """The stand-in's URL, key and the tokens it mints."""

    url: str  # http://127.0.0.1:PORT; each issuer is {url}/{kind}
    key: rsa.RSAPrivateKey
    kid: str

    def issuer(self, kind: Kind) -> str:
        return f"{self.url}/{kind}"

    def token(
        self,
        sub: str = "imagegate-test/app",
        kind: Kind = "github",
        *,
        ref: str = "refs/heads/main",
        expires_in: float = 600,
        audience: str = AUDIENCE,
        claims: dict[str, object] | None = None,
    ) -> str:
        """An ID token of `kind` for the repository (GitHub) or project (GitLab) `sub` (the
        token's own `sub` claim is shaped as that CI's: repo:ORG/REPO:ref:REF for GitHub), valid
        from now for `expires_in` seconds; a negative `expires_in` mints one that has already
        expired. `claims` are added last, over the shaped ones."""
        now = int(time.time())
        shaped = (
            github_claims(sub, ref)
            if kind == "github"
            else gitlab_claims(sub, ref.removeprefix("refs/heads/"))
        )
        body: dict[str, object] = {
            "iss": self.issuer(kind),
            "aud": audience,
            "jti": secrets.token_hex(8),
            "iat": min(now, now + int(expires_in)) - 1,
            "nbf": min(now, now + int(expires_in)) - 1,
            "exp": now + int(expires_in),
            **shaped,
            **(claims or {}),
        }
        return self.sign({"alg": "RS256", "typ": "JWT", "kid": self.kid}, body)

    def sign(self, header: dict[str, object], body: dict[str, object]) -> str:
        signing_input = _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(body).encode())
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return signing_input + "." + _b64(signature)

    def jwks(self) -> dict[str, object]:
        numbers = self.key.public_key().public_numbers()
        jwk = {
            "kty": "RSA",
            "alg": "RS256",
            "use": "sig",
            "kid": self.kid,
            "n": _uint(numbers.n),
            "e": _uint(numbers.e),
        }
        return {"keys": [jwk]}

    def discovery(self, kind: Kind) -> dict[str, object]:
        issuer = self.issuer(kind)
        return {
            "issuer": issuer,
            "jwks_uri": f"{issuer}/.well-known/jwks",
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public", "pairwise"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "claims_supported": ["sub", "aud", "exp", "iat", "iss", "jti", "nbf", "ref", "repository"],
            "scopes_supported": ["openid"],
        }


def _handler(issuers: Issuers) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            kind, _, rest = self.path.lstrip("/").partition("/")
            body: dict[str, object] | None = None
            if kind in KINDS and rest == ".well-known/openid-configuration":
                body = issuers.discovery(kind)
            elif kind in KINDS and rest == ".well-known/jwks":
                body = issuers.jwks()
            data = json.dumps(body).encode()
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@contextlib.contextmanager
def oidc_standin() -> Iterator[Issuers]:
    """The stand-in, served on a free port of 127.0.0.1 by a thread of this process until the end."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    issuers = Issuers("", key, secrets.token_hex(8))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(issuers))
    server.daemon_threads = True
    issuers.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="oidc-standin", daemon=True)
    thread.start()
    try:
        yield issuers
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
