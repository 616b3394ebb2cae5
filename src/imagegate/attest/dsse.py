"""DSSE envelopes (secure-systems-lab/dsse, protocol v1), exactly as cosign checks them:
payloadType `application/vnd.in-toto+json`, signatures over PAE(type, payload), standard padded
base64, one signature with an empty keyid (cosign skips a signature whose non-empty keyid is not
its own idea of the key's id). The payload is kept as opaque bytes: what is signed is what is
written, never a re-serialisation."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from imagegate._support.jsontypes import JsonObject
from imagegate.attest.keys import PublicKey, SigningKey
from imagegate.errors import UsageError
from imagegate.oci import untrusted_json

INTOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"


def pae(payload_type: str, payload: bytes) -> bytes:
    """Pre-Authentication Encoding: `DSSEv1 SP LEN(type) SP type SP LEN(body) SP body`, lengths
    in bytes as ASCII decimal. The only bytes any signature here covers."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(t), t, len(payload), payload)


@dataclass(frozen=True)
class Signature:
    sig: bytes
    keyid: str = ""


@dataclass(frozen=True)
class Envelope:
    payload: bytes
    payload_type: str
    signatures: tuple[Signature, ...]

    def to_dict(self) -> JsonObject:
        return {
            "payloadType": self.payload_type,
            "payload": _b64(self.payload),
            "signatures": [{"keyid": s.keyid, "sig": _b64(s.sig)} for s in self.signatures],
        }

    def to_json(self, *, indent: int | None = 2) -> bytes:
        seps = (",", ": ") if indent else (",", ":")
        return json.dumps(self.to_dict(), indent=indent, separators=seps).encode() + b"\n"

    def verified_by(self, key: PublicKey) -> bool:
        """True when some signature verifies with `key` (its keyid is only a hint: ignored)."""
        message = pae(self.payload_type, self.payload)
        return any(key.verify(s.sig, message) for s in self.signatures)


def _b64(data: bytes) -> str:
    return base64.standard_b64encode(data).decode("ascii")


_URLSAFE = str.maketrans("-_", "+/")


def _unb64(text: object, what: str) -> bytes:
    if not isinstance(text, str):
        raise UsageError(f"DSSE envelope: {what} is not a string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        pass
    try:  # the DSSE spec lets readers accept URL-safe base64 too, as cosign's reader does
        return base64.b64decode(text.translate(_URLSAFE) + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as e:
        raise UsageError(f"DSSE envelope: {what} is not base64") from e


def sign(payload: bytes, key: SigningKey, payload_type: str = INTOTO_PAYLOAD_TYPE) -> Envelope:
    return Envelope(payload, payload_type, (Signature(key.sign(pae(payload_type, payload))),))


def from_dict(obj: object) -> Envelope:
    if not isinstance(obj, dict):
        raise UsageError("DSSE envelope: not a JSON object")
    missing = [k for k in ("payloadType", "payload", "signatures") if k not in obj]
    if missing:
        raise UsageError(f"DSSE envelope: missing {', '.join(missing)}")
    ptype = obj["payloadType"]
    if not isinstance(ptype, str):
        raise UsageError("DSSE envelope: payloadType is not a string")
    sigs = obj["signatures"]
    if not isinstance(sigs, list) or not sigs:
        raise UsageError("DSSE envelope: no signatures")
    parsed = []
    for i, s in enumerate(sigs):
        if not isinstance(s, dict):
            raise UsageError(f"DSSE envelope: signature {i} is not an object")
        keyid = s.get("keyid") or ""
        parsed.append(Signature(_unb64(s.get("sig"), f"signature {i}"), str(keyid)))
    return Envelope(_unb64(obj["payload"], "payload"), ptype, tuple(parsed))


def from_json(data: bytes) -> Envelope:
    try:
        # Nesting checked before parsing (a RecursionError otherwise); the size is the caller's.
        obj = untrusted_json.loads(data, max_bytes=len(data))
    except untrusted_json.UntrustedJSONError as e:
        raise UsageError(f"DSSE envelope: {e}") from e
    return from_dict(obj)
