"""Sign an attempt: the acceptance Statement in a DSSE envelope, in the three forms consumers
read (a DSSE file, its one-line .intoto.jsonl twin, a Sigstore bundle), and beside it the two
standard statements made from it (attest/vsa.py): an SLSA VSA and an in-toto test-result, each a
DSSE file and a Sigstore bundle. Files are created exclusively: signing never replaces an earlier
attestation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from imagegate._support.jsontypes import JsonMapping, JsonObject, canonical_json, freeze_object, obj
from imagegate.attest import bundle, dsse
from imagegate.attest.keys import PublicKey, SigningKey, keyless_key
from imagegate.attest.vsa import standard
from imagegate.domain.statements import Predicate, Statement, TestResult, Vsa
from imagegate.errors import UsageError

DSSE_FILE = "attestation.dsse.json"
INTOTO_FILE = "attestation.intoto.jsonl"
BUNDLE_FILE = "attestation.sigstore.json"
VSA_FILE = "vsa.dsse.json"
VSA_BUNDLE_FILE = "vsa.sigstore.json"
TEST_RESULT_FILE = "testresult.dsse.json"
TEST_RESULT_BUNDLE_FILE = "testresult.sigstore.json"
# What signing writes in an attempt folder: what `verify` may be given.
SIGNED_FILES = (
    DSSE_FILE,
    INTOTO_FILE,
    BUNDLE_FILE,
    VSA_FILE,
    VSA_BUNDLE_FILE,
    TEST_RESULT_FILE,
    TEST_RESULT_BUNDLE_FILE,
)


@dataclass(frozen=True)
class Signed:
    envelope: dsse.Envelope
    files: list[Path]  # DSSE, .intoto.jsonl, Sigstore bundle, VSA, test-result (+ their bundles)
    fingerprint: str
    # The standard statements' envelopes (VSA, test-result): attached beside the acceptance.
    standard: tuple[dsse.Envelope, ...] = ()
    # The Sigstore bundles' verificationMaterial (the key's hint; keyless: the certificate, the
    # log entry and the timestamps), the acceptance's then the standard statements': the
    # referrer of each carries its own.
    materials: tuple[JsonObject, ...] = ()
    public: PublicKey | None = None  # the signing key's public half: what an attach verifies with
    signer: str = ""  # who signed, as messages name it: "key FINGERPRINT", or the keyless identity

    @property
    def material(self) -> JsonObject:
        return self.materials[0] if self.materials else {}

    @property
    def dsse_path(self) -> Path:
        return self.files[0]


def serialize(statement: Statement[Predicate] | JsonMapping) -> bytes:
    """The payload bytes. Serialised once; from here on they are opaque."""
    return canonical_json(statement.to_json() if isinstance(statement, Statement) else statement)


def create_once(
    path: Path,
    data: bytes,
    why: str = "an attempt is signed once",
    hint: str = "run again for a new attempt, or verify the existing attestation",
) -> Path:
    """`data` written to `path`, which must not exist: signing never replaces a file."""
    try:
        with open(path, "xb") as f:
            f.write(data)
    except FileExistsError as e:
        raise UsageError(f"{path}: already exists; {why}", hint=hint) from e
    return path


def _standard(said: JsonMapping, dsse_bytes: bytes) -> tuple[Statement[Vsa], Statement[TestResult]]:
    """The VSA and test-result made from a statement as signed: a run's, or an index's
    (attest/platforms.py)."""
    from imagegate.attest import platforms

    if said.get("predicateType") == platforms.INDEX_PREDICATE_TYPE:
        return (
            platforms.build_index_vsa(said, DSSE_FILE, dsse_bytes),
            platforms.build_index_test_result(said),
        )
    return standard(said, DSSE_FILE, dsse_bytes)


def seal(payload: bytes, key: SigningKey) -> tuple[dsse.Envelope, JsonObject]:
    """`payload` signed in a DSSE envelope, and its Sigstore bundle's verificationMaterial: the
    key's hint, or for a keyless signer its certificate, log entry and timestamps (made with
    the signature, one per statement)."""
    keyless = keyless_key(key)
    if keyless is not None:
        made = keyless.seal(payload)
        envelope = bundle.envelope_of(made)
        if (envelope.payload_type, envelope.payload) != (dsse.INTOTO_PAYLOAD_TYPE, payload):
            raise UsageError(f"{keyless.uri}: the bundle signs other bytes than the statement")
        return envelope, freeze_object(obj(made.get("verificationMaterial")))
    return dsse.sign(payload, key), bundle.verification_material(key.public)


def signer_of(key: SigningKey) -> str:
    keyless = keyless_key(key)
    if keyless is not None:
        from imagegate.attest.keyless import describe

        return describe(keyless)
    return f"key {key.public.fingerprint}"


def sign_attempt(attempt_dir: Path, statement: Statement[Predicate] | JsonMapping, key: SigningKey) -> Signed:
    """`statement`: a value, or JSON signed as it is (a statement read back: a test's, or one
    written by another tool)."""
    said = statement.to_json() if isinstance(statement, Statement) else statement
    envelope, material = seal(serialize(said), key)
    dsse_bytes = envelope.to_json()
    files = [
        create_once(attempt_dir / DSSE_FILE, dsse_bytes),
        create_once(attempt_dir / INTOTO_FILE, envelope.to_json(indent=None)),
        create_once(attempt_dir / BUNDLE_FILE, bundle.json_of(envelope, material)),
    ]
    standard, materials = [], [material]
    vsa, test_result = _standard(said, dsse_bytes)
    for made, name, bundle_name in (
        (vsa, VSA_FILE, VSA_BUNDLE_FILE),
        (test_result, TEST_RESULT_FILE, TEST_RESULT_BUNDLE_FILE),
    ):
        signed, its = seal(serialize(made), key)
        files.append(create_once(attempt_dir / name, signed.to_json()))
        files.append(create_once(attempt_dir / bundle_name, bundle.json_of(signed, its)))
        standard.append(signed)
        materials.append(its)
    return Signed(
        envelope,
        files,
        key.public.fingerprint,
        tuple(standard),
        tuple(materials),
        key.public,
        signer_of(key),
    )
