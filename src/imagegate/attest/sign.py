"""Sign an attempt: the acceptance Statement in a DSSE envelope, in the three forms consumers
read (a DSSE file, its one-line .intoto.jsonl twin, a Sigstore bundle), and the SLSA VSA beside
it. Files are created exclusively: signing never replaces an earlier attestation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagegate.attest import bundle, dsse
from imagegate.attest.keys import SigningKey
from imagegate.attest.statement import canonical_json
from imagegate.attest.vsa import build_vsa
from imagegate.errors import UsageError

DSSE_FILE = "attestation.dsse.json"
INTOTO_FILE = "attestation.intoto.jsonl"
BUNDLE_FILE = "attestation.sigstore.json"
VSA_FILE = "vsa.dsse.json"


@dataclass(frozen=True)
class Signed:
    envelope: dsse.Envelope
    files: list[Path]  # DSSE, .intoto.jsonl, Sigstore bundle, VSA: in that order
    fingerprint: str

    @property
    def dsse_path(self) -> Path:
        return self.files[0]


def serialize(statement: dict[str, Any]) -> bytes:
    """The payload bytes. Serialised once; from here on they are opaque."""
    return canonical_json(statement)


def _create(path: Path, data: bytes) -> Path:
    try:
        with open(path, "xb") as f:
            f.write(data)
    except FileExistsError as e:
        raise UsageError(
            f"{path}: already exists; an attempt is signed once",
            hint="run again for a new attempt, or verify the existing attestation",
        ) from e
    return path


def sign_attempt(attempt_dir: Path, statement: dict[str, Any], key: SigningKey) -> Signed:
    envelope = dsse.sign(serialize(statement), key)
    dsse_bytes = envelope.to_json()
    files = [
        _create(attempt_dir / DSSE_FILE, dsse_bytes),
        _create(attempt_dir / INTOTO_FILE, envelope.to_json(indent=None)),
        _create(attempt_dir / BUNDLE_FILE, bundle.to_json(envelope, key.public)),
    ]
    summary = build_vsa(statement, DSSE_FILE, dsse_bytes)
    files.append(_create(attempt_dir / VSA_FILE, dsse.sign(serialize(summary), key).to_json()))
    return Signed(envelope, files, key.public.fingerprint)
