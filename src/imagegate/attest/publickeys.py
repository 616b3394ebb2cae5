"""A signer's public key (ECDSA P-256 or ed25519), as every verifier and signer here holds it;
apart from attest/keys.py so that a key kept in a token (attest/hsm.py) needs no key files' code."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

Algorithm = Literal["ecdsa-p256", "ed25519"]
ALGORITHMS: tuple[Algorithm, ...] = ("ecdsa-p256", "ed25519")

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
