"""Reading attestation files in the forms imagegate writes and cosign reads: a DSSE envelope
(`.dsse.json`), a Sigstore bundle (`.sigstore.json`), JSON lines of envelopes (`.intoto.jsonl`).
Shared by `verify` (which checks them) and `attach` (which pushes them)."""

from __future__ import annotations

from pathlib import Path

from imagegate._support.files import read_named
from imagegate._support.jsontypes import JsonObject
from imagegate.attest import bundle, dsse
from imagegate.errors import UsageError
from imagegate.oci import untrusted_json

# Attestations come from anywhere (a registry, a copied file): parsed within bounds.
MAX_ATTESTATION_BYTES = 64 << 20


def read_bounded(path: Path, what: str = "attestation") -> bytes:
    """The file's bytes, never more than MAX_ATTESTATION_BYTES of them read: a larger file (or a
    FIFO or device, which may never end) is refused, named."""
    return read_named(path, what=what, max_bytes=MAX_ATTESTATION_BYTES)


def one_envelope(data: bytes, source: object) -> dsse.Envelope:
    """`data` as exactly one DSSE envelope (what `imagegate complete` links, byte for byte):
    parsed within bounds; anything else is a UsageError naming `source`."""
    try:
        return dsse.from_dict(untrusted_json.loads(data, max_bytes=MAX_ATTESTATION_BYTES))
    except untrusted_json.UntrustedJSONError as e:
        raise UsageError(f"{source}: not a DSSE envelope: {e}") from e
    except UsageError as e:
        raise UsageError(f"{source}: {e}") from e


def read_envelopes(path: Path) -> list[dsse.Envelope]:
    """A DSSE envelope (`.dsse.json`), a Sigstore bundle (`.sigstore.json`), or JSON lines of
    envelopes (`.intoto.jsonl`, which may hold several)."""
    data = read_bounded(path)
    if untrusted_json.nesting_depth(data.decode("utf-8", "replace")) > untrusted_json.MAX_DEPTH:
        raise UsageError(f"attestation {path}: nested more than {untrusted_json.MAX_DEPTH} levels deep")
    try:
        obj = untrusted_json.loads(data, max_bytes=MAX_ATTESTATION_BYTES)
    except ValueError:
        obj = None
    if obj is not None:
        return [_one(obj, path)]
    out = []
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(_one(untrusted_json.loads(line, max_bytes=MAX_ATTESTATION_BYTES), path))
        except ValueError as e:
            raise UsageError(f"attestation {path}: line {n} is not JSON") from e
    if not out:
        raise UsageError(f"attestation {path}: empty")
    return out


def _one(obj: object, path: Path) -> dsse.Envelope:
    try:
        if bundle.is_bundle(obj):
            assert isinstance(obj, dict)
            return bundle.envelope_of(obj)
        return dsse.from_dict(obj)
    except UsageError as e:
        raise UsageError(
            f"attestation {path}: {e}", hint="pass attestation.dsse.json, .intoto.jsonl or .sigstore.json"
        ) from e


def bundle_material(path: Path, envelope: dsse.Envelope) -> JsonObject | None:
    """The verificationMaterial (what names the signing key) of a Sigstore bundle holding
    `envelope`: `path` itself when it is one, else the `.sigstore.json` that signing writes
    beside each DSSE file (attestation.dsse.json: attestation.sigstore.json). None when neither
    holds it: a bare envelope does not say which key signed it."""
    for candidate in (path, path.with_name(path.name.split(".")[0] + ".sigstore.json")):
        try:
            obj = untrusted_json.loads(read_bounded(candidate), max_bytes=MAX_ATTESTATION_BYTES)
            if bundle.is_bundle(obj) and bundle.envelope_of(obj) == envelope:
                return bundle.material_of(obj)
        except (UsageError, OSError, ValueError):
            continue
    return None
