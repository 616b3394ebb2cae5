"""DSSE envelopes: PAE per the spec (checked by code written here, not the product's), the
envelope's form as cosign reads it, an independent verifier (securesystemslib), tampering."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from securesystemslib.dsse import Envelope as SslibEnvelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey

from imagegate.attest import dsse, keys


def spec_pae(payload_type: str, payload: bytes) -> bytes:
    """PAE as the DSSE protocol (protocol.md) words it, written independently of dsse.pae:
    "DSSEv1" + SP + LEN(type) + SP + type + SP + LEN(body) + SP + body, LEN in ASCII decimal bytes."""
    t = payload_type.encode("utf-8")
    parts = [b"DSSEv1", str(len(t)).encode("ascii"), t, str(len(payload)).encode("ascii"), payload]
    return b" ".join(parts)


def test_pae_known_answer_from_the_spec() -> None:
    expected = b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    assert dsse.pae("http://example.com/HelloWorld", b"hello world") == expected
    assert spec_pae("http://example.com/HelloWorld", b"hello world") == expected


@pytest.mark.parametrize(
    "ptype,payload",
    [
        (dsse.INTOTO_PAYLOAD_TYPE, b"{}"),
        ("", b""),
        ("tÿpe/ünicode", "ünïcode bödy ✓".encode()),  # lengths are bytes, not characters
        (dsse.INTOTO_PAYLOAD_TYPE, b"a b\nc\x00" * 1000),
    ],
)
def test_pae_equals_the_spec_wording(ptype: str, payload: bytes) -> None:
    assert dsse.pae(ptype, payload) == spec_pae(ptype, payload)


def test_spec_example_signature_verifies() -> None:
    # The protocol's example key and raw r||s signature, re-encoded as ASN.1 DER (cosign's form).
    x = 46950820868899156662930047687818585632848591499744589407958293238635476079160
    y = 5640078356564379163099075877009565129882514886557779369047442380624545832820
    pub = keys.PublicKey(ec.EllipticCurvePublicNumbers(x, y, ec.SECP256R1()).public_key())
    raw = base64.b64decode(
        "A3JqsQGtVsJ2O2xqrI5IcnXip5GToJ3F+FnZ+O88SjtR6rDAajabZKciJTfUiHqJPcIAriEGAHTVeCUjW2JIZA=="
    )
    der = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
    env = dsse.Envelope(b"hello world", "http://example.com/HelloWorld", (dsse.Signature(der),))
    assert env.verified_by(pub)


@pytest.mark.parametrize("algorithm", keys.ALGORITHMS)
def test_signature_is_over_the_spec_pae(algorithm: keys.Algorithm) -> None:
    key = keys.generate(algorithm)
    payload = b'{"_type":"https://in-toto.io/Statement/v1"}'
    env = dsse.sign(payload, key)
    (sig,) = env.signatures
    # Verified with the cryptography library directly over the test's own PAE.
    message = spec_pae(dsse.INTOTO_PAYLOAD_TYPE, payload)
    if algorithm == "ed25519":
        assert len(sig.sig) == 64  # raw ed25519, no DER
        key.key.public_key().verify(sig.sig, message)  # type: ignore[call-arg]
    else:
        assert sig.sig[0] == 0x30  # ASN.1 DER SEQUENCE (r, s)
        key.key.public_key().verify(sig.sig, message, ec.ECDSA(hashes.SHA256()))  # type: ignore[call-arg]


def test_envelope_form_is_what_cosign_reads(key: keys.SigningKey) -> None:
    env = dsse.sign(b'{"a":1}', key)
    obj = json.loads(env.to_json())
    assert set(obj) == {"payloadType", "payload", "signatures"}
    assert obj["payloadType"] == "application/vnd.in-toto+json"
    assert obj["payload"] == base64.standard_b64encode(b'{"a":1}').decode()  # standard, padded
    assert obj["payload"].endswith("=")
    assert len(obj["signatures"]) == 1
    assert obj["signatures"][0]["keyid"] == ""  # a non-empty keyid cosign cannot match is skipped
    assert base64.b64decode(obj["signatures"][0]["sig"], validate=True)
    assert b"\n" not in env.to_json(indent=None).rstrip(b"\n")  # the .intoto.jsonl line


def blank_keyid(pub: keys.PublicKey) -> SSlibKey:
    k = SSlibKey.from_crypto(pub.key)  # from_crypto computes a keyid for an empty one
    return SSlibKey("", k.keytype, k.scheme, k.keyval)


@pytest.mark.parametrize("algorithm", keys.ALGORITHMS)
def test_securesystemslib_accepts_our_envelope(algorithm: keys.Algorithm) -> None:
    key = keys.generate(algorithm)
    env = dsse.sign(b'{"_type":"https://in-toto.io/Statement/v1"}', key)
    theirs = SslibEnvelope.from_dict(json.loads(env.to_json()))
    # securesystemslib only tries keys whose keyid equals the signature's: blank on both sides.
    accepted = theirs.verify([blank_keyid(key.public)], 1)
    assert list(accepted) == [""]
    other = blank_keyid(keys.generate(algorithm).public)
    with pytest.raises(VerificationError, match="Found: 0"):
        theirs.verify([other], 1)


def _flip(b64: str, index: int) -> str:
    raw = bytearray(base64.b64decode(b64))
    raw[index] ^= 0x01
    return base64.standard_b64encode(bytes(raw)).decode()


@pytest.mark.parametrize("field", ["payload", "sig", "payloadType"])
def test_each_tamper_breaks_the_signature(key: keys.SigningKey, field: str) -> None:
    obj = json.loads(dsse.sign(b'{"subject":"x"}', key).to_json())
    if field == "payload":
        obj["payload"] = _flip(obj["payload"], 3)
    elif field == "sig":
        obj["signatures"][0]["sig"] = _flip(obj["signatures"][0]["sig"], 10)
    else:
        obj["payloadType"] = "application/json"
    assert not dsse.from_dict(obj).verified_by(key.public)


def test_reader_rejects_malformed_envelopes() -> None:
    from imagegate.errors import UsageError

    with pytest.raises(UsageError, match="no signatures"):
        dsse.from_dict({"payloadType": "t", "payload": "", "signatures": []})
    with pytest.raises(UsageError, match="not base64"):
        dsse.from_dict({"payloadType": "t", "payload": "***", "signatures": [{"sig": "AA=="}]})
    with pytest.raises(UsageError, match="missing payload"):
        dsse.from_dict({"payloadType": "t", "signatures": [{"sig": "AA=="}]})
