"""Keys that never leave their token: signing through PKCS#11 (an HSM, a smart card, a cloud HSM's
PKCS#11 library, SoftHSM), the key named by an RFC 7512 URI as cosign names it:

    pkcs11:token=ci;object=imagegate?module-path=/usr/lib/softhsm/libsofthsm2.so

Path attributes: `token` (the token's label), `slot-id`, `serial`, `object` (the key's label),
`id` (its CKA_ID, percent-encoded bytes); query attributes: `module-path` (else
$IMAGEGATE_PKCS11_MODULE), `pin-value` or `pin-source` (a file holding the PIN; else
$IMAGEGATE_PKCS11_PIN). The token signs with CKM_ECDSA over a SHA-256 digest made here (what
every PKCS#11 token with EC keys offers, SoftHSM and cloud HSMs included), on ECDSA P-256 keys;
`keygen` creates them sensitive and not extractable, so that nobody, imagegate included, can
read the private key out. The PIN never appears in a message, a repr or a log.

python-pkcs11 (the `hsm` extra) talks to the module: a maintained, typed binding of the whole
PKCS#11 API, where a ctypes binding would be a few hundred lines of C structures of our own."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote_to_bytes

from imagegate._support.files import read_named
from imagegate._support.names import PKCS11_MODULE_ENV, PKCS11_PIN_ENV
from imagegate.attest.publickeys import Algorithm, PublicKey
from imagegate.errors import UsageError

if TYPE_CHECKING:
    import pkcs11
    from pkcs11._pkcs11 import lib as Library

SCHEME = "pkcs11:"
EXTRA = "imagegate[hsm]"
_PATH_ATTRS = frozenset({"token", "slot-id", "serial", "object", "id", "type"})
_QUERY_ATTRS = frozenset({"module-path", "pin-value", "pin-source"})
MAX_PIN_FILE_BYTES = 4096
# DER of the named curve secp256r1 (prime256v1), as CKA_EC_PARAMS holds it
_P256 = bytes.fromhex("06082a8648ce3d030107")


def is_uri(value: str | os.PathLike[str] | None) -> bool:
    return value is not None and str(value).startswith(SCHEME)


@dataclass(frozen=True)
class KeyRef:
    """A parsed pkcs11: URI, with the module and PIN it resolves to."""

    module: Path
    token: str | None = None
    slot_id: int | None = None
    serial: str | None = None
    label: str | None = None
    key_id: bytes | None = None
    pin: str | None = field(default=None, repr=False)
    pin_file: Path | None = None  # pin-source: hidden from the probes of --here

    @property
    def uri(self) -> str:
        """The URI without its PIN: how messages name the key."""
        path = [
            f"{name}={quote(value, safe='')}"
            for name, value in (("token", self.token), ("serial", self.serial), ("object", self.label))
            if value is not None
        ]
        if self.slot_id is not None:
            path.insert(0, f"slot-id={self.slot_id}")
        if self.key_id is not None:
            path.append("id=" + "".join(f"%{b:02x}" for b in self.key_id))
        return f"{SCHEME}{';'.join(path)}?module-path={quote(str(self.module), safe='/')}"


def _attrs(part: str, allowed: frozenset[str], sep: str, uri_shown: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for item in filter(None, part.split(sep)):
        name, eq, value = item.partition("=")
        if not eq or name not in allowed:
            raise UsageError(
                f"{uri_shown}: {name!r} is not a PKCS#11 URI attribute imagegate reads",
                hint=f"use {', '.join(sorted(allowed))} (RFC 7512, as cosign names them)",
            )
        if name in out:
            raise UsageError(f"{uri_shown}: {name} is given twice")
        out[name] = unquote_to_bytes(value)
    return out


def _shown(uri: str) -> str:
    """The URI as given, its PIN value masked: what an error may quote."""
    return re.sub(r"(pin-value=)[^&]*", r"\1***", uri)


def parse(uri: str, env: Mapping[str, str] | None = None) -> KeyRef:
    env = os.environ if env is None else env
    shown = _shown(uri)
    if not uri.startswith(SCHEME):
        raise UsageError(f"{shown}: not a pkcs11: URI")
    body = uri[len(SCHEME) :]
    path_part, _, query_part = body.partition("?")
    path = _attrs(path_part, _PATH_ATTRS, ";", shown)
    query = _attrs(query_part, _QUERY_ATTRS, "&", shown)
    if path.get("type", b"private") != b"private":
        raise UsageError(
            f"{shown}: type={path['type'].decode(errors='replace')}: a signing key is type=private"
        )
    if "object" not in path and "id" not in path:
        raise UsageError(
            f"{shown}: names no key", hint="add object=LABEL or id=%XX..., the key's label or CKA_ID"
        )
    module = query.get("module-path", b"").decode() or env.get(PKCS11_MODULE_ENV, "")
    if not module:
        raise UsageError(
            f"{shown}: no PKCS#11 module",
            hint=f"add ?module-path=/path/to/the/module.so to the URI or set {PKCS11_MODULE_ENV}",
        )
    if "pin-value" in query and "pin-source" in query:
        raise UsageError(f"{shown}: pin-value and pin-source are both given", hint="give one")
    pin: str | None = None
    pin_file: Path | None = None
    if "pin-value" in query:
        pin = query["pin-value"].decode()
    elif "pin-source" in query:
        pin_file = Path(query["pin-source"].decode().removeprefix("file://").removeprefix("file:"))
        pin = read_named(pin_file, what="PKCS#11 PIN file", max_bytes=MAX_PIN_FILE_BYTES).decode().strip()
    else:
        pin = env.get(PKCS11_PIN_ENV) or None
    slot = path.get("slot-id")
    if slot is not None and not slot.isdigit():
        raise UsageError(f"{shown}: slot-id={slot.decode(errors='replace')}: not a number")
    return KeyRef(
        module=Path(module),
        token=path["token"].decode() if "token" in path else None,
        slot_id=int(slot) if slot is not None else None,
        serial=path["serial"].decode() if "serial" in path else None,
        label=path["object"].decode() if "object" in path else None,
        key_id=path.get("id"),
        pin=pin,
        pin_file=pin_file,
    )


def _pkcs11() -> ModuleType:
    try:
        return importlib.import_module("pkcs11")
    except ImportError as e:
        raise UsageError(
            f"a pkcs11: key needs the hsm extra ({e.name} is not installed)",
            hint=f"pip install '{EXTRA}' (pipx: pipx inject imagegate python-pkcs11)",
        ) from None


_LIBS: dict[Path, Library] = {}


def _lib(ref: KeyRef) -> Library:
    # a module is loaded once per process: C_Initialize twice is an error for most of them
    if ref.module not in _LIBS:
        mod = _pkcs11()
        if not ref.module.is_file():
            raise UsageError(f"PKCS#11 module {ref.module}: no such file", hint="check module-path")
        try:
            _LIBS[ref.module] = mod.lib(str(ref.module))
        except (RuntimeError, OSError, mod.PKCS11Error) as e:
            raise UsageError(
                f"PKCS#11 module {ref.module}: cannot load it ({type(e).__name__}: {e})"
            ) from None
    return _LIBS[ref.module]


def _token(ref: KeyRef) -> pkcs11.Token:
    mod = _pkcs11()
    tokens = [
        (slot.slot_id, t)
        for slot in _lib(ref).get_slots(token_present=True)
        for t in [slot.get_token()]
        if t.flags & mod.TokenFlag.TOKEN_INITIALIZED  # not the free slot a module offers for a new one
    ]
    found = [
        t
        for slot_id, t in tokens
        if (ref.slot_id is None or slot_id == ref.slot_id)
        and (ref.token is None or t.label == ref.token)
        and (ref.serial is None or _serial(t) == ref.serial)
    ]
    # never a PIN tried on each token in turn: a wrong try counts towards locking a token
    if len(found) != 1:
        labels = ", ".join(sorted(str(t.label) for _, t in tokens))
        raise UsageError(
            f"{ref.uri}: {f'{len(found)} tokens' if found else 'no token'} match it",
            hint=f"the module's tokens: {labels or 'none'}; name one with token= (or slot-id=)",
        )
    token: pkcs11.Token = found[0]
    return token


def _serial(token: pkcs11.Token) -> str:
    raw = token.serial
    return (raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)).strip()


@contextmanager
def _session(ref: KeyRef, *, rw: bool = False) -> Iterator[pkcs11.Session]:
    mod = _pkcs11()
    token = _token(ref)
    if ref.pin is None:
        raise UsageError(
            f"{ref.uri}: the token's user PIN is needed",
            hint=f"set {PKCS11_PIN_ENV}, or add pin-source=FILE to the URI",
        )
    try:
        session = token.open(user_pin=ref.pin, rw=rw)
    except (mod.PinIncorrect, mod.PinInvalid, mod.PinLenRange):
        raise UsageError(f"{ref.uri}: the token refused the PIN", hint=f"check {PKCS11_PIN_ENV}") from None
    except mod.PinLocked:
        raise UsageError(
            f"{ref.uri}: the token's PIN is locked", hint="its security officer must unlock it"
        ) from None
    except mod.PKCS11Error as e:
        raise UsageError(f"{ref.uri}: cannot open a session ({type(e).__name__})") from None
    try:
        yield session
    finally:
        session.close()


@contextmanager
def _refused(ref: KeyRef, doing: str) -> Iterator[None]:
    """What the token refuses (a key not allowed to sign, a full token), said as the key's error."""
    mod = _pkcs11()
    try:
        yield
    except mod.PKCS11Error as e:
        raise UsageError(f"{ref.uri}: the token did not {doing} ({type(e).__name__})") from None


def _template(ref: KeyRef, cls: pkcs11.ObjectClass) -> dict[pkcs11.Attribute, object]:
    mod = _pkcs11()
    found: dict[pkcs11.Attribute, object] = {mod.Attribute.CLASS: cls}
    if ref.label is not None:
        found[mod.Attribute.LABEL] = ref.label
    if ref.key_id is not None:
        found[mod.Attribute.ID] = ref.key_id
    return found


def _one(session: pkcs11.Session, ref: KeyRef, cls: pkcs11.ObjectClass, what: str) -> pkcs11.Object:
    objects = list(session.get_objects(_template(ref, cls)))
    if len(objects) != 1:
        raise UsageError(
            f"{ref.uri}: {len(objects)} {what}s match it"
            if objects
            else f"{ref.uri}: no {what} on the token",
            hint="name one key: object=LABEL and id=%XX...; `imagegate keygen --out pkcs11:...` creates one",
        )
    return objects[0]


def _public(session: pkcs11.Session, ref: KeyRef) -> PublicKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    mod = _pkcs11()
    from pkcs11.util.ec import encode_ec_public_key

    pub = _one(session, ref, mod.ObjectClass.PUBLIC_KEY, "public key")
    other = UsageError(
        f"{ref.uri}: not an ECDSA P-256 key",
        hint="imagegate signs with ECDSA P-256 in a token; `imagegate keygen --out pkcs11:...` creates one",
    )
    if pub[mod.Attribute.KEY_TYPE] != mod.KeyType.EC:  # RSA, DSA, EdDSA...: no EC_PARAMS to read
        raise other
    if pub[mod.Attribute.EC_PARAMS] != _P256:
        raise other
    assert isinstance(pub, mod.PublicKey)
    key = serialization.load_der_public_key(encode_ec_public_key(pub))
    assert isinstance(key, ec.EllipticCurvePublicKey)
    return PublicKey(key)


@dataclass(frozen=True)
class TokenKey:
    """A SigningKey whose private half stays in the token: each signature is the token's."""

    ref: KeyRef
    public: PublicKey
    algorithm: Algorithm = "ecdsa-p256"
    path: Path | None = None

    @property
    def where(self) -> str:
        return self.ref.uri

    @property
    def secret_file(self) -> Path | None:
        return self.ref.pin_file

    def sign(self, data: bytes) -> bytes:
        from pkcs11.types import SignMixin
        from pkcs11.util.ec import encode_ecdsa_signature

        mod = _pkcs11()
        digest = hashlib.sha256(data).digest()
        with _session(self.ref) as session:
            private = _one(session, self.ref, mod.ObjectClass.PRIVATE_KEY, "private key")
            if not isinstance(private, SignMixin):  # python-pkcs11 gives sign() to CKA_SIGN keys only
                raise UsageError(
                    f"{self.ref.uri}: the token did not sign (the key's CKA_SIGN is false)",
                    hint="sign with a key made for signing: `imagegate keygen --out pkcs11:...` makes one",
                )
            with _refused(self.ref, "sign"):
                raw = private.sign(digest, mechanism=mod.Mechanism.ECDSA)
        signature: bytes = encode_ecdsa_signature(raw)
        # the public half was read from another object: a signature it does not verify names
        # a key nobody holds, so it is refused here rather than by every verifier later
        if not self.public.verify(signature, data):
            raise UsageError(
                f"{self.ref.uri}: the token's signature does not verify with its public key object",
                hint="the private and public objects of that label/id are not one pair: name the key by id=",
            )
        return signature

    def __repr__(self) -> str:
        return f"TokenKey({self.public.fingerprint}, {self.ref.uri})"


def open_key(uri: str, env: Mapping[str, str] | None = None) -> TokenKey:
    """The key a pkcs11: URI names, checked now (module, token, PIN, one key pair, its curve):
    a bad URI or PIN fails before the work."""
    ref = parse(uri, env)
    mod = _pkcs11()
    with _session(ref) as session:
        _one(session, ref, mod.ObjectClass.PRIVATE_KEY, "private key")
        key = TokenKey(ref, _public(session, ref))
    key.sign(b"imagegate: does the token's key pair sign and verify?")  # a mismatched pair fails now
    return key


def public_key(uri: str, env: Mapping[str, str] | None = None) -> PublicKey:
    ref = parse(uri, env)
    with _session(ref) as session:
        return _public(session, ref)


def generate(uri: str, env: Mapping[str, str] | None = None) -> TokenKey:
    """`keygen --out pkcs11:...`: an ECDSA P-256 key pair made inside the token, its private half
    sensitive and not extractable; never over an existing key of that label or id."""
    ref = parse(uri, env)
    if ref.label is None:
        raise UsageError(f"{ref.uri}: a new key needs a label", hint="add object=LABEL to the URI")
    mod = _pkcs11()
    from pkcs11.util.ec import encode_named_curve_parameters

    key_id = ref.key_id if ref.key_id is not None else hashlib.sha256(os.urandom(32)).digest()[:8]
    with _session(ref, rw=True) as session:
        for cls in (mod.ObjectClass.PRIVATE_KEY, mod.ObjectClass.PUBLIC_KEY):
            for probe in (
                {mod.Attribute.CLASS: cls, mod.Attribute.LABEL: ref.label},
                {mod.Attribute.CLASS: cls, mod.Attribute.ID: key_id},
            ):
                if list(session.get_objects(probe)):
                    raise UsageError(
                        f"{ref.uri}: the token already holds a key of that label or id",
                        hint="choose another object= label, or use the existing key with --key",
                    )
        params = session.create_domain_parameters(
            mod.KeyType.EC, {mod.Attribute.EC_PARAMS: encode_named_curve_parameters("secp256r1")}, local=True
        )
        with _refused(ref, "create the key"):
            params.generate_keypair(
                store=True,
                label=ref.label,
                id=key_id,
                private_template={
                    mod.Attribute.SIGN: True,
                    mod.Attribute.SENSITIVE: True,
                    mod.Attribute.EXTRACTABLE: False,
                    mod.Attribute.PRIVATE: True,
                },
            )
        made = dataclasses.replace(ref, key_id=key_id)
        return TokenKey(made, _public(session, made))
