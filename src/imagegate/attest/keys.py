"""Signing keys: ECDSA P-256 (the default, what cosign generates) and ed25519, stored as PEM
(PKCS#8 private keys, optionally passphrase-protected; SubjectPublicKeyInfo public keys, the form
`cosign verify-* --key` reads), or kept in a token and named by a `pkcs11:` URI (attest/hsm.py:
the key never leaves it), or kept by Vault's transit engine and named `hashivault://NAME`
(attest/kms.py). Keys stay in the runner: nothing here logs key material, and errors name the
file or the URI (its PIN or token left out), never key contents."""

from __future__ import annotations

import errno
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from imagegate._support.files import read_named
from imagegate._support.names import KEY_ENV as KEY_ENV
from imagegate._support.names import PASSWORD_ENV as PASSWORD_ENV
from imagegate.attest.publickeys import ALGORITHMS as ALGORITHMS
from imagegate.attest.publickeys import Algorithm as Algorithm
from imagegate.attest.publickeys import PublicKey as PublicKey
from imagegate.errors import UsageError

if TYPE_CHECKING:
    from imagegate.attest.keyless import KeylessKey

DEFAULT_KEY_NAME = "signing.key"

PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


class SigningKey(Protocol):
    """What signs: a PEM key file (FileKey), a key that stays in its store (hsm.TokenKey,
    kms.TransitKey), or a key made for one run and certified by Fulcio (keyless.KeylessKey)."""

    @property
    def public(self) -> PublicKey: ...

    @property
    def algorithm(self) -> Algorithm: ...

    @property
    def path(self) -> Path | None:
        """The key's file; None for a key in a store or in memory."""
        ...

    @property
    def where(self) -> str:
        """The key as messages name it: its file or URI (never a PIN or passphrase)."""
        ...

    @property
    def secret_file(self) -> Path | None:
        """The file that must stay hidden from the code under test: the key file, or the file
        holding a token's PIN."""
        ...

    def sign(self, data: bytes) -> bytes:
        """ECDSA: ASN.1 DER (r, s) over SHA-256 of `data`; ed25519: over `data` itself."""
        ...


@dataclass(frozen=True)
class FileKey:
    key: PrivateKey
    path: Path | None = None

    @property
    def where(self) -> str:
        return str(self.path) if self.path else "a key in memory"

    @property
    def secret_file(self) -> Path | None:
        return self.path

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
        return f"FileKey({self.algorithm}, {self.public.fingerprint}, path={self.path})"


def generate(algorithm: Algorithm = "ecdsa-p256") -> FileKey:
    if algorithm == "ed25519":
        return FileKey(ed25519.Ed25519PrivateKey.generate())
    return FileKey(ec.generate_private_key(ec.SECP256R1()))


def private_pem(key: FileKey, password: bytes | None) -> bytes:
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


def _write_pair(prefix: Path, key: FileKey, password: bytes | None) -> tuple[Path, Path]:
    priv, pub = key_paths(prefix)
    for p in (priv, pub):
        if p.exists():
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(p))
    priv.parent.mkdir(parents=True, exist_ok=True)
    _create(priv, private_pem(key, password), 0o600)
    _create(pub, key.public.pem, 0o644)
    return priv, pub


def write_keypair(prefix: Path, key: FileKey, password: bytes | None) -> tuple[Path, Path]:
    """`keygen`: write `PREFIX.key` and `PREFIX.pub`, never over an existing file."""
    try:
        return _write_pair(prefix, key, password)
    except FileExistsError as e:
        raise UsageError(
            f"{e.filename}: already exists", hint="choose another --out prefix or remove it"
        ) from e
    except OSError as e:
        raise UsageError(f"{e.filename or prefix}: cannot create it ({e.strerror})") from e


def write_public(path: Path, public: PublicKey) -> None:
    """A .pub file alone (a token's key, `public-key --out`), never over an existing file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _create(path, public.pem, 0o644)
    except FileExistsError as e:
        raise UsageError(f"{path}: already exists", hint="choose another path or remove it") from e
    except OSError as e:
        raise UsageError(f"{path}: cannot create it ({e.strerror})") from e


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


def load_signing_key(path: Path, password: bytes | None = None) -> FileKey:
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
    return FileKey(key, path)


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


def named_signer(key: str | Path | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The signer a command was given: `key` (--key), else $IMAGEGATE_SIGNING_KEY; None when
    neither names one (the user's default key then)."""
    env = os.environ if env is None else env
    return str(key) if key else env.get(KEY_ENV)


def keyless_key(key: object) -> KeylessKey | None:
    """`key` as a keyless signer, else None. attest/keyless.py is loaded only where a key is keyless
    (resolve_signing_key): asking here, not importing it, keeps a keyed run from loading it."""
    keyless = sys.modules.get("imagegate.attest.keyless")
    return key if keyless is not None and isinstance(key, keyless.KeylessKey) else None


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
    named = named_signer(key, env)
    if named and named.startswith("pkcs11:"):
        from imagegate.attest import hsm  # python-pkcs11 loads only for a key in a token

        return hsm.open_key(named, env)
    if named and named.startswith("hashivault://"):
        from imagegate.attest import kms  # its HTTP client loads only for a key in Vault

        return kms.open_key(named, env)
    if named and named.startswith("sigstore:"):
        from imagegate.attest import keyless  # sigstore-python loads only to sign keyless

        return keyless.open_key(named, env)
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
    return FileKey(new.key, path)


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
    where: str  # the .pub file beside the key, else the key file itself, or the key's URI
    origin: str  # "run's default key", or the variable that named it


def runs_public_key(env: Mapping[str, str] | None = None) -> RunsKey | Path:
    """The key `run` would sign with (as resolve_signing_key finds it, never creating one): its
    .pub file beside it, else its own public half (read with the passphrase, if any). Without
    one, the path where it was looked for."""
    env = os.environ if env is None else env
    named = env.get(KEY_ENV)
    origin = f"${KEY_ENV}" if named else "run's default key"
    if named and named.startswith("pkcs11:"):
        from imagegate.attest import hsm

        ref = hsm.parse(named, env)
        return RunsKey(hsm.public_key(named, env), ref.uri, origin)
    if named and named.startswith("hashivault://"):
        from imagegate.attest import kms

        return RunsKey(kms.public_key(named, env), kms.SCHEME + kms.key_name(named), origin)
    if named and named.startswith("sigstore:"):
        raise UsageError(
            f"{origin} signs keyless ({named}): its statements are verified by who signed, not by a key",
            hint="imagegate verify BUNDLE --identity ID --issuer URL --trusted-root FILE",
        )
    path = Path(named).expanduser() if named else default_key_path()
    pub = path.with_suffix(".pub")
    if pub.is_file():
        return RunsKey(load_public_key(pub), str(pub), origin)
    if path.is_file():
        return RunsKey(load_signing_key(path, password_from_env(env)).public, str(path), origin)
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
