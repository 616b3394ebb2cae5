"""The Sigstore bundle v0.3 (protobuf-specs `dev.sigstore.bundle.v1.Bundle`, JSON form) around a
key-signed DSSE envelope: a publicKey hint as verification material, no transparency-log entry and
no timestamp. `cosign verify-blob-attestation --key K --bundle F --insecure-ignore-tlog` accepts it:
with a key, sigstore-go looks the key up by whatever hint the bundle carries."""

from __future__ import annotations

import base64
import json
from typing import TypeGuard

from imagegate._support.jsontypes import JsonMapping, JsonObject
from imagegate.attest import dsse
from imagegate.attest.keys import PublicKey
from imagegate.errors import UsageError

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
# Readers accept every bundle version that can carry a DSSE envelope and a public key.
_READABLE = (
    BUNDLE_MEDIA_TYPE,
    "application/vnd.dev.sigstore.bundle+json;version=0.3",
    "application/vnd.dev.sigstore.bundle+json;version=0.2",
    "application/vnd.dev.sigstore.bundle+json;version=0.1",
)


def verification_material(key: PublicKey) -> JsonObject:
    """What names the signing key in a bundle: sigstore-go's publicKey hint, no log entry."""
    return {"publicKey": {"hint": key.hint}}


def to_bundle(envelope: dsse.Envelope, key: PublicKey) -> JsonObject:
    return wrap(envelope, verification_material(key))


def wrap(envelope: dsse.Envelope, material: JsonObject) -> JsonObject:
    """The bundle of `envelope` with `material` (one read from another bundle is kept as is)."""
    # protojson form, fields in the proto's order: bytes as standard base64, empty fields
    # (keyid "", no tlog entries) omitted.
    return {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": material,
        "dsseEnvelope": {
            "payload": base64.standard_b64encode(envelope.payload).decode(),
            "payloadType": envelope.payload_type,
            "signatures": [
                {"sig": base64.standard_b64encode(s.sig).decode(), **({"keyid": s.keyid} if s.keyid else {})}
                for s in envelope.signatures
            ],
        },
    }


def to_json(envelope: dsse.Envelope, key: PublicKey) -> bytes:
    return json_of(envelope, verification_material(key))


def json_of(envelope: dsse.Envelope, material: JsonObject) -> bytes:
    return json.dumps(wrap(envelope, material), indent=2).encode() + b"\n"


def material_of(obj: JsonMapping) -> JsonObject | None:
    """A read bundle's verificationMaterial, or None where it has none to carry over."""
    material = obj.get("verificationMaterial")
    return material if isinstance(material, dict) and material else None


def is_bundle(obj: object) -> TypeGuard[dict[str, object]]:
    return isinstance(obj, dict) and str(obj.get("mediaType", "")).startswith(
        "application/vnd.dev.sigstore.bundle"
    )


def envelope_of(obj: JsonMapping) -> dsse.Envelope:
    media_type = obj.get("mediaType")
    if media_type not in _READABLE:
        raise UsageError(f"Sigstore bundle: unsupported media type {media_type!r}")
    env = obj.get("dsseEnvelope")
    if env is None:
        raise UsageError(
            "Sigstore bundle: no dsseEnvelope",
            hint="a message-signature bundle signs a blob, not an attestation",
        )
    return dsse.from_dict(env)
