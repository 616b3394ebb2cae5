"""Keys held by a KMS: HashiCorp Vault's transit engine signs, the key never leaves it. The key
is named as cosign names it, `hashivault://NAME`, and the server as cosign (sigstore's hashivault
client) and Vault's own CLI find it: $VAULT_ADDR, $VAULT_TOKEN, the engine's mount
$TRANSIT_SECRET_ENGINE_PATH (default `transit`), and $VAULT_CACERT for a private CA.

Each signature is one `POST /v1/MOUNT/sign/NAME` with the key version pinned to the one whose
public key was read: ECDSA P-256 over a SHA-256 digest made here (prehashed, ASN.1 DER, what
every verifier here and cosign read), ed25519 over the data itself. It is checked against that
public key before it is used, as a token's is (attest/hsm.py). `keygen` makes the key in the
engine not exportable: nobody, imagegate included, can read its private half out.

Spoken to with httpx (no Vault client library: five requests), bounded like the registry
client: every read ends by the command's deadline, every answer is read up to a size cap, TLS is
verified (plain HTTP only to a loopback address: the token would otherwise cross the network in
clear), and redirects are not followed (a token in X-Vault-Token would go wherever they point).
Messages name the key and the server, never the token."""

from __future__ import annotations

import base64
import hashlib
import re
import ssl
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from imagegate._support import deadline
from imagegate._support.jsontypes import integer, obj, path, strings, text
from imagegate._support.names import (
    VAULT_ADDR_ENV,
    VAULT_CACERT_ENV,
    VAULT_SKIP_VERIFY_ENV,
    VAULT_TOKEN_ENV,
    VAULT_TRANSIT_ENV,
)
from imagegate.attest.publickeys import Algorithm, PublicKey
from imagegate.errors import UsageError, describe_exception
from imagegate.oci import deadline_net, untrusted_json
from imagegate.oci.reference import is_loopback_registry
from imagegate.oci.registry import RegistryError, read_capped

SCHEME = "hashivault://"
DEFAULT_MOUNT = "transit"
# The key names sigstore's hashivault client accepts (its referenceRegex): a word character at
# each end, word characters, dots and dashes between; nothing that could leave the key's path.
_SEGMENT = r"\w(?:[\w.-]*\w)?"
_NAME = re.compile(_SEGMENT, re.ASCII)
# a mount's path: such names, one or more, by slashes (never `.` or `..`: no way out of /v1/)
_MOUNT = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*", re.ASCII)
# Vault's key types for the two algorithms imagegate signs with
_TYPES: dict[str, Algorithm] = {"ecdsa-p256": "ecdsa-p256", "ed25519": "ed25519"}
TIMEOUT_S = 30.0  # one request; each read also ends by the command's deadline
CONNECT_S = 10.0
MAX_ANSWER_BYTES = 1 << 20  # a key's versions and their public keys: a few KiB


def is_uri(value: str | None) -> bool:
    return value is not None and value.startswith(SCHEME)


def key_name(uri: str) -> str:
    name = uri.removeprefix(SCHEME)
    if not uri.startswith(SCHEME) or not _NAME.fullmatch(name):
        raise UsageError(
            f"{uri}: not a transit key's name",
            hint="hashivault://NAME, NAME of letters, digits, _, . and - (as cosign reads it)",
        )
    return name


@dataclass(frozen=True)
class Server:
    """Where the transit engine is and how to reach it, from the environment."""

    address: str  # scheme://host[:port], no trailing slash
    mount: str
    token: str = field(repr=False)
    cacert: Path | None = None

    def names(self, name: str) -> str:
        """The key as messages name it: its URI, the server and the engine's mount."""
        return f"{SCHEME}{name} (Vault at {self.address}, transit engine {self.mount}/)"


def server(env: Mapping[str, str]) -> Server:
    address = env.get(VAULT_ADDR_ENV, "").strip().rstrip("/")
    if not address:
        raise UsageError(
            f"a {SCHEME} key needs the Vault server's address",
            hint=f"set {VAULT_ADDR_ENV}, e.g. https://vault.example:8200",
        )
    url = httpx.URL(address) if "://" in address else None
    if url is None or url.scheme not in ("http", "https") or not url.host or url.path not in ("", "/"):
        raise UsageError(
            f"{VAULT_ADDR_ENV}={address}: not a Vault address",
            hint="scheme://host[:port], e.g. https://vault:8200",
        )
    if url.scheme == "http" and not is_loopback_registry(url.host):
        raise UsageError(
            f"{VAULT_ADDR_ENV}={address}: plain HTTP to another machine would send the token in clear",
            hint="use https:// (a private CA: set VAULT_CACERT); plain http:// is for 127.0.0.1 or localhost",
        )
    if env.get(VAULT_SKIP_VERIFY_ENV, "").strip().lower() in ("1", "true", "t", "yes"):
        raise UsageError(
            f"{VAULT_SKIP_VERIFY_ENV} is set: imagegate does not sign through a server it has not verified",
            hint=f"unset it and set {VAULT_CACERT_ENV} to the CA file that signed the server's certificate",
        )
    mount = env.get(VAULT_TRANSIT_ENV, "").strip().strip("/") or DEFAULT_MOUNT
    if not _MOUNT.fullmatch(mount):
        raise UsageError(f"{VAULT_TRANSIT_ENV}={mount}: not a secrets engine's mount path")
    token = env.get(VAULT_TOKEN_ENV, "").strip()
    if not token:
        raise UsageError(
            f"a {SCHEME} key needs a Vault token (Vault at {address})",
            hint=f"set {VAULT_TOKEN_ENV} to a token whose policy allows signing with the key",
        )
    cacert = env.get(VAULT_CACERT_ENV, "").strip()
    return Server(address, mount, token, Path(cacert) if cacert else None)


def _verify(s: Server) -> ssl.SSLContext | bool:
    if s.cacert is None:
        return True
    if not s.cacert.is_file():
        raise UsageError(f"{VAULT_CACERT_ENV}={s.cacert}: no such file")
    try:
        return ssl.create_default_context(cafile=str(s.cacert))
    except (ssl.SSLError, OSError) as e:
        raise UsageError(f"{VAULT_CACERT_ENV}={s.cacert}: not a CA file ({describe_exception(e)})") from None


class _Vault:
    """One connection's requests, each answer's JSON object or a message naming the key."""

    def __init__(self, s: Server, name: str) -> None:
        self.server, self.name, self.where = s, name, s.names(name)
        self._http = httpx.Client(
            base_url=f"{s.address}/v1/",
            timeout=httpx.Timeout(deadline.cap(TIMEOUT_S), connect=deadline.cap(CONNECT_S)),
            follow_redirects=False,
            verify=_verify(s),
            headers={"X-Vault-Token": s.token, "Accept-Encoding": "identity"},
        )
        deadline_net.install(self._http)  # every socket wait ends by the command's deadline

    def call(
        self, method: str, route: str, body: dict[str, object] | None = None, absent: str = ""
    ) -> dict[str, object]:
        """`route` under /v1/; 404, or a 400 whose errors say `absent` (the transit engine's
        answer to a sign with no such key): an empty object (the caller says what is missing)."""
        what = f"{method} /v1/{route}"
        try:
            with self._http.stream(method, route, json=body) as resp:
                raw = read_capped(resp, MAX_ANSWER_BYTES, f"{self.where}: the answer to {what}")
        except httpx.HTTPError as e:
            raise deadline.expired_error(f"{self.where}: {what}") or UsageError(
                f"{self.where}: Vault cannot be reached ({describe_exception(e)})",
                hint=f"check {VAULT_ADDR_ENV} and that the server runs",
            ) from None
        except RegistryError as e:  # too large, or cut while read: the message names the answer
            raise UsageError(str(e)) from None
        status = resp.status_code
        try:
            answer = obj(untrusted_json.loads(raw)) if raw.strip() else {}
        except untrusted_json.UntrustedJSONError as e:
            if status < 300:
                raise UsageError(f"{self.where}: {what}: Vault's answer is {e}") from None
            answer = {}  # an error page of a proxy in front of it: its status says enough
        if status < 300:
            return answer
        said = _said(strings(answer.get("errors")))[:300] or resp.reason_phrase
        if status == 404 or (status == 400 and absent and absent in said):
            return {}
        if status == 403:
            raise UsageError(
                f"{self.where}: Vault refused {what} ({said})",
                hint=f"the token ({VAULT_TOKEN_ENV}) is unknown or expired, or its policy does not allow it",
            )
        if status == 503 and "sealed" in said.lower():
            raise UsageError(f"{self.where}: Vault is sealed", hint="it must be unsealed before it signs")
        if 300 <= status < 400:
            raise UsageError(
                f"{self.where}: Vault redirected {what} to {resp.headers.get('Location', '?')}",
                hint=f"set {VAULT_ADDR_ENV} to the server that answers (the active node)",
            )
        raise UsageError(f"{self.where}: Vault answered {status} to {what} ({said})")

    def close(self) -> None:
        self._http.close()


# Vault joins a request's errors with go-multierror: "2 errors occurred:\n\t* permission
# denied\n\t* invalid token\n\n" (an unknown token), one line each item here.
_MULTIERROR = re.compile(r"\A\d+ errors? occurred:\s*")


def _said(errors: list[str]) -> str:
    items = [
        line.strip().removeprefix("* ").strip()
        for e in errors
        for line in _MULTIERROR.sub("", e).splitlines()
        if line.strip()
    ]
    return "".join(c if c.isprintable() else " " for c in "; ".join(items))  # the server's words


@contextmanager
def _vault(s: Server, name: str) -> Iterator[_Vault]:
    v = _Vault(s, name)
    try:
        yield v
    finally:
        v.close()


@dataclass(frozen=True)
class KeyVersion:
    public: PublicKey
    version: int


def _read_key(v: _Vault) -> KeyVersion:
    """The key's newest version and its public key, checked to be one imagegate signs with."""
    answer = obj(v.call("GET", f"{v.server.mount}/keys/{v.name}").get("data"))
    if not answer:
        raise UsageError(
            f"{v.where}: no such key (or no transit engine at {v.server.mount}/)",
            hint=f"make one with `imagegate keygen --out {SCHEME}{v.name}`; "
            f"a transit engine mounted elsewhere: set {VAULT_TRANSIT_ENV}",
        )
    kind = text(answer.get("type")) or "?"
    if kind not in _TYPES or answer.get("supports_signing") is False:
        raise UsageError(
            f"{v.where}: a {kind} key: imagegate signs with ecdsa-p256 or ed25519 keys",
            hint=f"make one with `imagegate keygen --out {SCHEME}NAME`",
        )
    version = integer(answer.get("latest_version"))
    published = text(path(answer, "keys", str(version), "public_key"))
    if version is None or published is None:
        raise UsageError(f"{v.where}: Vault's answer names no public key of the key's newest version")
    return KeyVersion(_public(published, _TYPES[kind], v.where), version)


def _public(published: str, algorithm: Algorithm, where: str) -> PublicKey:
    """ECDSA: a PEM SubjectPublicKeyInfo; ed25519: base64 of the 32 raw bytes (Vault's forms)."""
    try:
        if algorithm == "ed25519":
            return PublicKey(ed25519.Ed25519PublicKey.from_public_bytes(base64.b64decode(published)))
        key = serialization.load_pem_public_key(published.encode())
    except ValueError:
        raise UsageError(f"{where}: Vault's public key is not a {algorithm} key") from None
    if not (isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1)):
        raise UsageError(f"{where}: Vault's public key is not a {algorithm} key")
    return PublicKey(key)


def _may_sign(v: _Vault) -> None:
    """A token that may read the key but not sign with it is refused now, before the work:
    sys/capabilities-self answers any token for its own paths (Vault's default policy)."""
    route = f"{v.server.mount}/sign/{v.name}"
    try:
        answer = v.call("POST", "sys/capabilities-self", {"paths": [route]})
    except UsageError:
        return  # a policy without the default one: the signature itself will say
    caps = strings(answer.get(route)) or strings(path(answer, "data", route))
    if caps and not {"update", "root", "sudo"} & set(caps):
        raise UsageError(
            f"{v.where}: the token may not sign with the key (its capabilities on {route}: {', '.join(caps)})",
            hint=f"give {VAULT_TOKEN_ENV} a token whose policy allows `update` on {route}",
        )


@dataclass(frozen=True)
class TransitKey:
    """A SigningKey whose private half stays in Vault: each signature is the transit engine's,
    by the key version whose public key was read."""

    server: Server
    name: str
    public: PublicKey
    version: int
    path: Path | None = None
    secret_file: Path | None = None  # the token comes from the environment, not a file

    @property
    def algorithm(self) -> Algorithm:
        return self.public.algorithm

    @property
    def where(self) -> str:
        return f"{SCHEME}{self.name}"

    def sign(self, data: bytes) -> bytes:
        body: dict[str, object] = {"key_version": self.version}
        if self.algorithm == "ed25519":  # ed25519 signs the message itself
            body["input"] = base64.b64encode(data).decode()
        else:
            body |= {
                "input": base64.b64encode(hashlib.sha256(data).digest()).decode(),
                "prehashed": True,
                "hash_algorithm": "sha2-256",
                "marshaling_algorithm": "asn1",
            }
        with _vault(self.server, self.name) as v:
            answer = v.call(
                "POST", f"{self.server.mount}/sign/{self.name}", body, absent="signing key not found"
            )
            if not answer:
                raise UsageError(
                    f"{v.where}: no such key any more", hint="was it deleted since the run began?"
                )
        signed = text(path(answer, "data", "signature")) or ""
        prefix = f"vault:v{self.version}:"
        if not signed.startswith(prefix):
            raise UsageError(
                f"{self.server.names(self.name)}: Vault's signature is not one of key version {self.version}"
            )
        try:
            signature = base64.b64decode(signed.removeprefix(prefix), validate=True)
        except ValueError:
            raise UsageError(f"{self.server.names(self.name)}: Vault's signature is not base64") from None
        # the public half was read in another request: a signature it does not verify names a key
        # nobody can check, so it is refused here rather than by every verifier later
        if not self.public.verify(signature, data):
            raise UsageError(
                f"{self.server.names(self.name)}: Vault's signature does not verify with the key's public key"
            )
        return signature

    def __repr__(self) -> str:
        return f"TransitKey({self.public.fingerprint}, {self.server.names(self.name)}, v{self.version})"


def open_key(uri: str, env: Mapping[str, str]) -> TransitKey:
    """The key a hashivault: URI names, checked now (the server, the token, the key and its type,
    that the token may sign with it): a bad URI or token fails before the work."""
    name, s = key_name(uri), server(env)
    with _vault(s, name) as v:
        found = _read_key(v)
        _may_sign(v)
    return TransitKey(s, name, found.public, found.version)


def public_key(uri: str, env: Mapping[str, str]) -> PublicKey:
    name, s = key_name(uri), server(env)
    with _vault(s, name) as v:
        return _read_key(v).public


def generate(uri: str, env: Mapping[str, str], algorithm: Algorithm = "ecdsa-p256") -> TransitKey:
    """`keygen --out hashivault://NAME`: a key made in the transit engine, not exportable (its
    private half never leaves Vault); never over an existing key of that name."""
    name, s = key_name(uri), server(env)
    with _vault(s, name) as v:
        if v.call("GET", f"{s.mount}/keys/{name}"):
            raise UsageError(
                f"{v.where}: the transit engine already holds a key of that name",
                hint="choose another name, or sign with the existing key: --key " + SCHEME + name,
            )
        # Vault answers a create of an existing key as done: the check above, made just before,
        # is what keeps an existing key from being taken for a new one.
        v.call("POST", f"{s.mount}/keys/{name}", {"type": algorithm, "exportable": False})
        found = _read_key(v)
    if found.public.algorithm != algorithm:
        raise UsageError(f"{v.where}: Vault made a {found.public.algorithm} key, not {algorithm}")
    return TransitKey(s, name, found.public, found.version)
