"""The Sigstore bundle v0.3: its form, and an independent verifier (sigstore-js, which finds the
key by the bundle's publicKey hint, as sigstore-go does not need to). sigstore-js comes from the
npm registry, with Debian's node and npm (scripts/engines.sh): IMAGEGATE_SIGSTORE_JS=DIR names
an `npm install --prefix DIR` of tests/attest/sigstore_js/package.json; without it the test
installs one into .cache/sigstore-js."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from imagegate.attest import bundle, dsse, keys, sign
from tests.npm_tools import node_modules

HERE = Path(__file__).parent


def test_bundle_form(signed: sign.Signed, attempt: Path, keypair: tuple[Path, Path]) -> None:
    b = json.loads((attempt / sign.BUNDLE_FILE).read_text())
    assert b["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    der = keys.load_public_key(keypair[1]).der
    assert b["verificationMaterial"] == {
        "publicKey": {"hint": base64.standard_b64encode(hashlib.sha256(der).digest()).decode()}
    }  # no tlogEntries, no timestamps: a key-signed attestation
    envelope = json.loads((attempt / sign.DSSE_FILE).read_text())
    assert b["dsseEnvelope"]["payload"] == envelope["payload"]
    assert b["dsseEnvelope"]["payloadType"] == envelope["payloadType"]
    assert b["dsseEnvelope"]["signatures"] == [{"sig": envelope["signatures"][0]["sig"]}]
    assert bundle.envelope_of(b) == dsse.from_dict(envelope)


def _sigstore_js() -> Path:
    return node_modules(
        HERE / "sigstore_js" / "package.json", "IMAGEGATE_SIGSTORE_JS", "sigstore-js", "@sigstore/verify"
    )


def sigstore_js_verify(path: Path, pub: Path) -> subprocess.CompletedProcess[str]:
    """sigstore-js's verdict on the bundle at `path` with the public key `pub`."""
    return subprocess.run(
        ["node", str(HERE / "sigstore_js" / "verify_bundle.js"), str(path), str(pub)],
        capture_output=True,
        text=True,
        env={**os.environ, "NODE_PATH": str(_sigstore_js())},
        timeout=60,
    )


@pytest.mark.parametrize("algorithm", keys.ALGORITHMS)
def test_sigstore_js_verifies_our_bundle(tmp_path: Path, algorithm: keys.Algorithm) -> None:
    key = keys.generate(algorithm)
    pub = tmp_path / "k.pub"
    pub.write_bytes(key.public.pem)
    st = {"_type": "https://in-toto.io/Statement/v1", "subject": [], "predicateType": "x", "predicate": {}}
    path = tmp_path / "b.json"
    path.write_bytes(bundle.to_json(dsse.sign(sign.serialize(st), key), key.public))
    run = sigstore_js_verify
    ok = run(path, pub)
    assert ok.returncode == 0 and ok.stdout.startswith("VERIFIED"), ok.stdout + ok.stderr
    other = tmp_path / "o.pub"
    other.write_bytes(keys.generate(algorithm).public.pem)
    assert "key not found" in run(path, other).stdout  # the hint names our key, not any key
    b = json.loads(path.read_text())
    b["dsseEnvelope"]["payloadType"] = "application/json"
    path.write_text(json.dumps(b))
    assert "SIGNATURE_ERROR" in run(path, pub).stdout
