"""Signing keys: ECDSA P-256 (the default, what cosign generates) and ed25519, stored as PEM
(PKCS#8 private keys, optionally passphrase-protected; SubjectPublicKeyInfo public keys, the form
`cosign verify-* --key` reads). Keys stay in the runner: nothing here logs key material, and
errors name the file, never its contents."""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from imagegate._support.files import read_named
from imagegate._support.names import KEY_ENV as KEY_ENV
from imagegate._support.names import PASSWORD_ENV as PASSWORD_ENV
from imagegate.errors import UsageError

Algorithm = Literal["ecdsa-p256", "ed25519"]
ALGORITHMS: tuple[Algorithm, ...] = ("ecdsa-p256", "ed25519")

DEFAULT_KEY_NAME = "signing.key"

PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
PublicKeyObj = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey


@dataclass(frozen=True)
class PublicKey:
    key: PublicKeyObj

    @property
    def algorithm(self) -> Algorithm:
        return "ed25519" if isinstance(self.key, ed25519.Ed25519PublicKey) else "ecdsa-p256"

    @property
    def der(self) -> bytes:
        return self.key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    @property
    def pem(self) -> bytes:
        return self.key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    @property
    def fingerprint(self) -> str:
        """`sha256:<hex>` of the DER SubjectPublicKeyInfo: stable across PEM re-encodings."""
        return "sha256:" + hashlib.sha256(self.der).hexdigest()

    @property
    def hint(self) -> str:
        """The Sigstore bundle's publicKey hint: base64 of the SPKI's sha256, as sigstore-go
        derives it for its own keys (verifiers with a key ignore it; it only names the key)."""
        return base64.standard_b64encode(hashlib.sha256(self.der).digest()).decode()

    def verify(self, signature: bytes, data: bytes) -> bool:
        try:
            if isinstance(self.key, ed25519.Ed25519PublicKey):
                self.key.verify(signature, data)  # ed25519 signs the message itself
            else:
                self.key.verify(signature, data, ec.ECDSA(hashes.SHA256()))  # ASN.1 DER (r, s)
        except InvalidSignature:
            return False
        return True


@dataclass(frozen=True)
class SigningKey:
    key: PrivateKey
    path: Path | None = None

    @property
    def public(self) -> PublicKey:
        return PublicKey(self.key.public_key())

    @property
    def algorithm(self) -> Algorithm:
        return self.public.algorithm

    def sign(self, data: bytes) -> bytes:
        if isinstance(self.key, ed25519.Ed25519PrivateKey):
            return self.key.sign(data)
        return self.key.sign(data, ec.ECDSA(hashes.SHA256()))

    def __repr__(self) -> str:  # never the key itself, e.g. in a traceback or a log
        return f"SigningKey({self.algorithm}, {self.public.fingerprint}, path={self.path})"


def generate(algorithm: Algorithm = "ecdsa-p256") -> SigningKey:
    if algorithm == "ed25519":
        return SigningKey(ed25519.Ed25519PrivateKey.generate())
    return SigningKey(ec.generate_private_key(ec.SECP256R1()))


def private_pem(key: SigningKey, password: bytes | None) -> bytes:
    enc: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    )
    return key.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)


def key_paths(prefix: Path) -> tuple[Path, Path]:
    """`PREFIX.key` and `PREFIX.pub`, like cosign's `cosign.key` / `cosign.pub`."""
    return prefix.with_name(prefix.name + ".key"), prefix.with_name(prefix.name + ".pub")


def _create(path: Path, data: bytes, mode: int) -> None:
    """Raises OSError (FileExistsError for an existing file): the caller says what it means."""
    # O_EXCL: an existing key is never overwritten; the mode is set at creation, so the private
    # key is never readable by others, not even for an instant.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have removed bits we asked for; never adds any
        os.write(fd, data)
    finally:
        os.close(fd)


def _write_pair(prefix: Path, key: SigningKey, password: bytes | None) -> tuple[Path, Path]:
    priv, pub = key_paths(prefix)
    for p in (priv, pub):
        if p.exists():
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(p))
    priv.parent.mkdir(parents=True, exist_ok=True)
    _create(priv, private_pem(key, password), 0o600)
    _create(pub, key.public.pem, 0o644)
    return priv, pub


def write_keypair(prefix: Path, key: SigningKey, password: bytes | None) -> tuple[Path, Path]:
    """`keygen`: write `PREFIX.key` and `PREFIX.pub`, never over an existing file."""
    try:
        return _write_pair(prefix, key, password)
    except FileExistsError as e:
        raise UsageError(
            f"{e.filename}: already exists", hint="choose another --out prefix or remove it"
        ) from e
    except OSError as e:
        raise UsageError(f"{e.filename or prefix}: cannot create it ({e.strerror})") from e


def _check_type(key: object, path: Path) -> None:
    if isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey):
        return
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) and isinstance(
        key.curve, ec.SECP256R1
    ):
        return
    raise UsageError(
        f"{path}: unsupported key type ({type(key).__name__})",
        hint="imagegate signs with ECDSA P-256 or ed25519 keys; make one with `imagegate keygen`",
    )


def load_signing_key(path: Path, password: bytes | None = None) -> SigningKey:
    data = read_named(path, what="signing key", max_bytes=MAX_KEY_FILE_BYTES)
    if b"PRIVATE KEY" not in data:
        raise UsageError(
            f"signing key {path}: not a PEM private key",
            hint="pass the .key file of `imagegate keygen` (the .pub file is for verify)",
        )
    encrypted = b"ENCRYPTED" in data
    if encrypted and not password:
        raise UsageError(
            f"signing key {path}: it is passphrase-protected",
            hint=f"set {PASSWORD_ENV} to its passphrase",
        )
    try:
        key = serialization.load_pem_private_key(data, password if encrypted else None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        if encrypted:
            raise UsageError(
                f"signing key {path}: cannot decrypt it (wrong passphrase?)",
                hint=f"check {PASSWORD_ENV}",
            ) from None  # the library's message may quote key bytes: keep it out of logs
        raise UsageError(f"signing key {path}: not a readable PEM private key") from None
    _check_type(key, path)
    assert isinstance(key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey)
    return SigningKey(key, path)


def load_public_key(path: Path) -> PublicKey:
    data = read_named(path, what="public key", max_bytes=MAX_KEY_FILE_BYTES)
    if b"PRIVATE KEY" in data:
        raise UsageError(
            f"public key {path}: this is a private key",
            hint="verify with the public key (the .pub file beside it)",
        )
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as e:
        raise UsageError(
            f"public key {path}: not a PEM public key (SubjectPublicKeyInfo)",
            hint="pass the .pub file written by `imagegate keygen` or `cosign generate-key-pair`",
        ) from e
    _check_type(key, path)
    assert isinstance(key, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey)
    return PublicKey(key)


class DefaultKeyUnavailable(UsageError):
    """No key was named and the user's default key cannot be created."""


def default_key_path() -> Path:
    import platformdirs

    return platformdirs.user_config_path("imagegate") / DEFAULT_KEY_NAME


def password_from_env(env: Mapping[str, str]) -> bytes | None:
    value = env.get(PASSWORD_ENV)
    return value.encode() if value else None


def resolve_signing_key(
    key: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    create_default: bool = True,
    notify: Callable[[str], None] = lambda _m: None,
) -> SigningKey:
    """The key `run` signs with: `key` (--key), else $IMAGEGATE_SIGNING_KEY, else the user's
    default key, created on first use so that a first run works out of the box (CI passes its
    own). Call it before the run, so that a bad key or passphrase fails before the work."""
    env = os.environ if env is None else env
    password = password_from_env(env)
    named = key or env.get(KEY_ENV)
    if named:
        return load_signing_key(Path(named).expanduser(), password)
    path = default_key_path()
    if path.exists():
        return load_signing_key(path, password)
    if not create_default:
        raise UsageError(
            "no signing key",
            hint=f"pass --key PATH, set {KEY_ENV}, or make one with `imagegate keygen`",
        )
    new = generate()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _write_pair(path.with_suffix(""), new, password)
    except OSError as e:  # a read-only home in a container, a folder made by another user
        raise DefaultKeyUnavailable(
            f"no signing key, and none can be created at {path} ({e.strerror})",
            hint=f"pass --key PATH or set {KEY_ENV}; --no-sign skips signing",
        ) from e
    notify(
        f"created a signing key {path} (public key {path.with_suffix('.pub')}, "
        f"fingerprint {new.public.fingerprint}); pass --key or set {KEY_ENV} to use another"
    )
    return SigningKey(new.key, path)


def public_key_file(key: SigningKey) -> Path | None:
    """The .pub file beside `key`'s file (keygen's PREFIX.pub, the default signing.pub) when it
    holds `key`'s public half: the file a verifier is told to use. None when there is none."""
    if key.path is None:
        return None
    pub = key.path.with_suffix(".pub")
    try:
        same = load_public_key(pub).fingerprint == key.public.fingerprint
    except UsageError:  # absent or not a public key: nothing to point at
        return None
    return pub if same else None


@dataclass(frozen=True)
class RunsKey:
    """The public half of the key `run` signs with when given none, for `verify` given none."""

    public: PublicKey
    path: Path  # the .pub file beside the key, else the key file itself
    origin: str  # "run's default key", or the variable that named it


def runs_public_key(env: Mapping[str, str] | None = None) -> RunsKey | Path:
    """The key `run` would sign with (as resolve_signing_key finds it, never creating one): its
    .pub file beside it, else its own public half (read with the passphrase, if any). Without
    one, the path where it was looked for."""
    env = os.environ if env is None else env
    named = env.get(KEY_ENV)
    path = Path(named).expanduser() if named else default_key_path()
    origin = f"${KEY_ENV}" if named else "run's default key"
    pub = path.with_suffix(".pub")
    if pub.is_file():
        return RunsKey(load_public_key(pub), pub, origin)
    if path.is_file():
        return RunsKey(load_signing_key(path, password_from_env(env)).public, path, origin)
    return path


MAX_KEYS_FILE_BYTES = 1 << 20
MAX_KEY_FILE_BYTES = (
    1 << 20
)  # one PEM key: a few hundred bytes  # a list of public keys: a few KiB; more is not a key list
_PEM_PUBLIC = re.compile(rb"-----BEGIN PUBLIC KEY-----.+?-----END PUBLIC KEY-----", re.DOTALL)


def load_trusted_keys(path: Path) -> list[PublicKey]:
    """`--trusted-keys FILE`: PEM public keys one after another (`cat ci.pub gpu.pub`), the
    form of a .pub file repeated; text between the blocks (a comment naming each key) is ignored,
    as PEM readers do."""
    data = read_named(path, what="trusted keys", max_bytes=MAX_KEYS_FILE_BYTES)
    if b"PRIVATE KEY" in data:
        raise UsageError(
            f"trusted keys {path}: holds a private key",
            hint="list public keys only (the .pub files): a private key does not belong in a trust list",
        )
    blocks = _PEM_PUBLIC.findall(data)
    if not blocks:
        raise UsageError(
            f"trusted keys {path}: no PEM public key in it",
            hint="put the .pub files one after another: cat ci.pub gpu.pub > trusted.pem",
        )
    out = []
    for n, block in enumerate(blocks, 1):
        try:
            key = serialization.load_pem_public_key(block)
        except (ValueError, UnsupportedAlgorithm) as e:
            raise UsageError(f"trusted keys {path}: key {n} is not a PEM public key") from e
        _check_type(key, path)
        assert isinstance(key, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey)
        out.append(PublicKey(key))
    return out


def trusted_keys(pubs: Sequence[Path] = (), lists: Sequence[Path] = ()) -> tuple[PublicKey, ...]:
    """The keys a chain of attestations may be signed with: each `--key PUB` (or `--trust PUB`)
    and every key of each `--trusted-keys FILE`, once each (by fingerprint), in the order given."""
    found = [load_public_key(p) for p in pubs] + [k for f in lists for k in load_trusted_keys(f)]
    once: dict[str, PublicKey] = {}
    for k in found:
        once.setdefault(k.fingerprint, k)
    return tuple(once.values())
