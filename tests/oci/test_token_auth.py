"""The Bearer token flow end to end: a real `docker-registry` in token-auth mode that trusts a
real token server (tests/oci/token_server.py), an image pushed into it by skopeo, and the CLI
verifying it with credentials from the places Docker and Podman keep them."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from imagegate.oci.auth import Credentials
from imagegate.oci.registry import AuthenticationError, RegistryClient
from tests.helpers import imagegate
from tests.oci.conftest import Pushed
from tests.oci.infra import Registry, skopeo, wait_for
from tests.oci.token_server import SigningKey, TokenServer, registry_log, start_token_registry

pytestmark = pytest.mark.engine

USER, PASSWORD = "bob", "t0ken-s3cret"
REFRESH_TOKEN = "imagegate-test-refresh-token"
REPO = "private/app"
WRONG = "n0t-the-pass"


@pytest.fixture(scope="module")
def tokens() -> Iterator[TokenServer]:
    server = TokenServer({USER: PASSWORD}, refresh_tokens={REFRESH_TOKEN: USER}).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def token_registry(tokens: TokenServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_token_registry(tmp_path_factory.mktemp("token"), tokens)
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def token_ref(pushed: Pushed, token_registry: Registry, tokens: TokenServer) -> str:
    """The engine-pushed test image, copied into the token registry by skopeo."""
    ref = f"{token_registry.host}/{REPO}:1"
    first = len(tokens.requests)
    skopeo(
        "copy",
        "-q",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
        "--dest-creds",
        f"{USER}:{PASSWORD}",
        f"docker://{pushed.ref}",
        f"docker://{ref}",
    )
    push = tokens.requests[first:]
    assert any(f"repository:{REPO}:pull,push" in r.scopes and r.user == USER for r in push), push
    return ref


def _log_dir(reg: Registry) -> Path:
    return reg.root.parent


def _no_creds_env(tmp_path: Path) -> dict[str, str]:
    # An empty Docker config and no auth file: nothing of the host's leaks into the test.
    (tmp_path / "empty").mkdir(exist_ok=True)
    return {
        "DOCKER_CONFIG": str(tmp_path / "empty"),
        "REGISTRY_AUTH_FILE": "",
        "XDG_RUNTIME_DIR": str(tmp_path),
    }


def _auth_file(tmp_path: Path, host: str, entry: dict[str, str]) -> dict[str, str]:
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"auths": {host: entry}}))
    return {**_no_creds_env(tmp_path), "REGISTRY_AUTH_FILE": str(auth)}


def _basic(user: str, password: str) -> dict[str, str]:
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_registry_really_checks_tokens(token_registry: Registry, tokens: TokenServer) -> None:
    """The set-up is not vacuous: the registry refuses a token signed by another key, one for
    another audience and one without the scope, and takes the token server's own."""
    url = f"http://{token_registry.host}/v2/{REPO}/tags/list"
    scope = [f"repository:{REPO}:pull"]

    def status(token: str) -> int:
        return httpx.get(url, headers={"Authorization": f"Bearer {token}"}).status_code

    good = tokens.issue(USER, scope)
    claims = json.loads(base64.urlsafe_b64decode(good["token"].split(".")[1] + "=="))
    assert status(SigningKey.self_signed().sign_jwt(claims)) == 401
    assert status(tokens.signing.sign_jwt({**claims, "aud": "another-service"})) == 401
    assert status(tokens.signing.sign_jwt({**claims, "iss": "another-issuer"})) == 401
    assert status(tokens.issue(USER, [])["token"]) == 401
    assert status(tokens.issue(None, scope)["token"]) == 401  # anonymous: no access
    assert status(good["token"]) in (200, 404)  # 404 until the image is pushed


@pytest.mark.parametrize("where", ["REGISTRY_AUTH_FILE", "DOCKER_CONFIG"])
def test_verified_with_credentials_from_auth_file(
    token_ref: str, pushed: Pushed, token_registry: Registry, tmp_path: Path, where: str
) -> None:
    host = token_registry.host
    if where == "REGISTRY_AUTH_FILE":
        env = _auth_file(tmp_path, host, _basic(USER, PASSWORD))
    else:
        env = _no_creds_env(tmp_path)
        conf = {"auths": {f"http://{host}": {"username": USER, "password": PASSWORD}}}
        Path(env["DOCKER_CONFIG"], "config.json").write_text(json.dumps(conf))
    r = imagegate("layers", f"docker://{token_ref}", "--expect-config", pushed.config_digest, env=env)
    assert r.returncode == 0, r.stderr
    assert "3/3 layers verified" in r.stdout
    assert f"expected: {pushed.config_digest} MATCH" in r.stdout


def test_one_token_for_the_pull_scope_reused_for_every_blob(
    token_ref: str, token_registry: Registry, tokens: TokenServer, tmp_path: Path
) -> None:
    first_token = len(tokens.requests)
    log_dir = _log_dir(token_registry)
    first_log = len(registry_log(log_dir))
    env = _auth_file(tmp_path, token_registry.host, _basic(USER, PASSWORD))
    r = imagegate("layers", f"docker://{token_ref}", "--jobs", "4", env=env)
    assert r.returncode == 0, r.stderr

    asked = tokens.requests[first_token:]
    assert all(t.user_agent.startswith("imagegate/") for t in asked), asked
    assert 1 <= len(asked) <= 2, asked
    for t in asked:
        assert (t.method, t.user, t.service, t.status) == ("GET", USER, tokens.service, 200)
        assert t.scopes == [f"repository:{REPO}:pull"]

    def blob_gets() -> list[dict[str, Any]]:
        return [
            x
            for x in registry_log(log_dir)[first_log:]
            if "http.response.status" in x
            and x["http.request.method"] == "GET"
            and f"/v2/{REPO}/blobs/" in x["http.request.uri"]
        ]

    # The config and 3 layers, each read with a token the registry verified ...
    assert wait_for(lambda: len(blob_gets()) >= 4), registry_log(log_dir)[first_log:]
    lines = registry_log(log_dir)[first_log:]
    authorized = {x["http.request.id"] for x in lines if x["msg"] == "authorized request"}
    blobs = blob_gets()
    assert all(x["http.response.status"] == 200 for x in blobs), blobs
    assert all(x["http.request.id"] in authorized for x in blobs), blobs
    assert len(blobs) > len(asked)
    # ... and none turned away first for want of one: only the first manifest request was.
    refused = [x["http.request.uri"] for x in lines if x["msg"].startswith("error authorizing context")]
    assert refused == [f"/v2/{REPO}/manifests/1"], refused


def test_without_credentials_is_a_clear_auth_error(
    token_ref: str, token_registry: Registry, tokens: TokenServer, tmp_path: Path
) -> None:
    first = len(tokens.requests)
    r = imagegate("layers", f"docker://{token_ref}", env=_no_creds_env(tmp_path))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert token_registry.host in r.stderr and "401" in r.stderr, r.stderr
    assert "docker login" in r.stderr
    # It asked anonymously (a public image would have been served); the token had no access.
    assert [(t.user, t.status) for t in tokens.requests[first:]] == [(None, 200)]


def test_wrong_password_is_a_clear_auth_error(
    token_ref: str, token_registry: Registry, tokens: TokenServer, tmp_path: Path
) -> None:
    first = len(tokens.requests)
    env = _auth_file(tmp_path, token_registry.host, _basic(USER, WRONG))
    r = imagegate("layers", f"docker://{token_ref}", env=env)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert token_registry.host in r.stderr
    assert "the token server refused the credentials (401)" in r.stderr, r.stderr
    assert PASSWORD not in r.stderr and WRONG not in r.stderr
    assert [(t.user, t.status) for t in tokens.requests[first:]] == [(None, 401)]


def test_identity_token_is_posted_as_refresh_token(
    token_ref: str, token_registry: Registry, tokens: TokenServer, tmp_path: Path
) -> None:
    first = len(tokens.requests)
    env = _auth_file(tmp_path, token_registry.host, {"identitytoken": REFRESH_TOKEN})
    r = imagegate("layers", f"docker://{token_ref}", env=env)
    assert r.returncode == 0, r.stderr
    asked = tokens.requests[first:]
    assert [(t.method, t.grant_type, t.user, t.status) for t in asked] == [
        ("POST", "refresh_token", USER, 200)
    ]
    assert asked[0].scopes == [f"repository:{REPO}:pull"]


def _actions_sorted(scope: str) -> str:
    resource, _, actions = scope.rpartition(":")
    return f"{resource}:{','.join(sorted(actions.split(',')))}"


def test_push_primitives_ask_for_push_scope(token_registry: Registry, tokens: TokenServer) -> None:
    first = len(tokens.requests)
    creds = Credentials(USER, PASSWORD)
    with RegistryClient(token_registry.host, credentials=creds, lookup=False) as c:
        digest = c.upload_blob("team/att", b'{"payloadType":"application/vnd.in-toto+json"}')
        assert c.blob_size("team/att", digest) is not None
    # The registry's challenge names the actions in no fixed order ("push,pull" or "pull,push").
    scopes = {_actions_sorted(s) for t in tokens.requests[first:] for s in t.scopes}
    assert scopes == {"repository:team/att:pull", "repository:team/att:pull,push"}
    with (
        RegistryClient(token_registry.host, credentials=Credentials(USER, WRONG), lookup=False) as c,
        pytest.raises(AuthenticationError, match="token server refused the credentials"),
    ):
        c.blob_size("team/att", digest)
