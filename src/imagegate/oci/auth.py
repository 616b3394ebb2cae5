"""Registry credentials, found where Docker, Podman and skopeo keep them:
`REGISTRY_AUTH_FILE`, then `$XDG_RUNTIME_DIR/containers/auth.json`, then
`$DOCKER_CONFIG/config.json` (default `~/.docker/config.json`). In each file, a
`credHelpers` entry for the registry wins, then `auths` (inline `auth`, `username`/`password`,
`identitytoken`), then `credsStore`. Helpers run as `docker-credential-NAME get`."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from imagegate.errors import ImagegateError
from imagegate.oci.reference import DOCKER_HUB

# Docker Hub's credentials are stored under its old index URL.
_DOCKER_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io", "registry-1.docker.io")
_HELPER_TIMEOUT_S = 30


class CredentialsError(ImagegateError):
    """A credential store or helper failed (not: found no credentials)."""


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = ""
    identity_token: str | None = None  # an OAuth2 refresh token (docker login with SSO)

    def __repr__(self) -> str:  # keep secrets out of logs and tracebacks
        return f"Credentials(username={self.username!r}, password=***)"


def _auth_files(env: Mapping[str, str]) -> list[Path]:
    files = []
    if env.get("REGISTRY_AUTH_FILE"):
        files.append(Path(env["REGISTRY_AUTH_FILE"]))
    if env.get("XDG_RUNTIME_DIR"):
        files.append(Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json")
    docker_dir = Path(env["DOCKER_CONFIG"]) if env.get("DOCKER_CONFIG") else Path.home() / ".docker"
    files.append(docker_dir / "config.json")
    return files


def _strip_scheme(key: str) -> str:
    return re.sub(r"^https?://", "", key).rstrip("/")


def _key_matches(key: str, registry: str, repository: str | None) -> int:
    """How well an `auths` key matches: 0 no; more = more specific (a namespace beats the host)."""
    if registry == DOCKER_HUB and key in _DOCKER_HUB_KEYS:
        return 1
    k = _strip_scheme(key)
    if k.endswith("/v1") or k.endswith("/v2"):
        k = k[:-3]
    if k == registry:
        return 1
    host, _, namespace = k.partition("/")
    if (
        host == registry
        and repository
        and (repository == namespace or repository.startswith(namespace + "/"))
    ):
        return 1 + namespace.count("/") + 1
    return 0


def _from_entry(entry: object) -> Credentials | None:
    if not isinstance(entry, dict):
        return None
    token = entry.get("identitytoken") or None
    if entry.get("auth"):
        try:
            user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
        except (ValueError, UnicodeDecodeError) as e:
            raise CredentialsError(
                "an `auth` entry in the credentials file is not base64 user:password"
            ) from e
        return Credentials(user, password, token)
    if entry.get("username"):
        return Credentials(str(entry["username"]), str(entry.get("password") or ""), token)
    if token:
        return Credentials("<token>", "", token)
    return None


def run_helper(helper: str, server: str) -> Credentials | None:
    """`docker-credential-HELPER get`: None when the helper has nothing for `server`."""
    program = f"docker-credential-{helper}"
    try:
        proc = subprocess.run(
            [program, "get"],
            input=server.encode(),
            capture_output=True,
            timeout=_HELPER_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError as e:
        raise CredentialsError(
            f"the credential helper {program} named in your Docker config is not installed",
            hint=f"install {program}, or remove it from credsStore/credHelpers",
        ) from e
    except subprocess.TimeoutExpired as e:
        raise CredentialsError(
            f"the credential helper {program} did not answer in {_HELPER_TIMEOUT_S}s"
        ) from e
    out = proc.stdout.decode(errors="replace").strip()
    if proc.returncode != 0:
        if "not found" in out.lower() or "not found" in proc.stderr.decode(errors="replace").lower():
            return None
        raise CredentialsError(
            f"the credential helper {program} failed: {out or proc.stderr.decode()[-300:]}"
        )
    try:
        doc = json.loads(out)
        user, secret = str(doc.get("Username", "")), str(doc.get("Secret", ""))
    except (ValueError, AttributeError) as e:
        raise CredentialsError(f"the credential helper {program} printed something that is not JSON") from e
    if user == "<token>":
        return Credentials(user, "", secret)
    return Credentials(user, secret)


def _helper_servers(registry: str) -> list[str]:
    if registry == DOCKER_HUB:
        return ["https://index.docker.io/v1/"]
    return [registry, f"https://{registry}"]


def lookup_credentials(
    registry: str, repository: str | None = None, env: Mapping[str, str] | None = None
) -> Credentials | None:
    env = os.environ if env is None else env
    for path in _auth_files(env):
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            raise CredentialsError(f"cannot read the credentials file {path}: {e}") from e
        if not isinstance(doc, dict):
            continue
        helpers = doc.get("credHelpers") or {}
        for key, helper in helpers.items() if isinstance(helpers, dict) else ():
            if _key_matches(key, registry, repository):
                for server in _helper_servers(registry):
                    creds = run_helper(str(helper), server)
                    if creds:
                        return creds
        auths = doc.get("auths") or {}
        best: tuple[int, Credentials] | None = None
        for key, entry in auths.items() if isinstance(auths, dict) else ():
            score = _key_matches(key, registry, repository)
            creds = _from_entry(entry) if score else None
            if creds and (best is None or score > best[0]):
                best = (score, creds)
        if best:
            return best[1]
        if doc.get("credsStore"):
            for server in _helper_servers(registry):
                creds = run_helper(str(doc["credsStore"]), server)
                if creds:
                    return creds
    return None


@dataclass(frozen=True)
class Challenge:
    scheme: str  # "bearer" or "basic"
    params: Mapping[str, str]


_PARAM_RE = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))')


def parse_challenge(header: str) -> Challenge | None:
    """`WWW-Authenticate: Bearer realm="...",service="...",scope="..."` (RFC 6750 / 7235)."""
    scheme, _, rest = header.strip().partition(" ")
    if not scheme:
        return None
    params = {
        m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3))
        for m in _PARAM_RE.finditer(rest)
    }
    return Challenge(scheme.lower(), params)
