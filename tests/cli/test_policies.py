"""`imagegate policies`: the admission policies of this version, listed and written filled in with
a user's key, images and bound (what the real controllers make of them: tests/policies/
test_written_policies.py), and bad input refused with one line, exit 3."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import imagegate
from imagegate.attest import keys
from imagegate.errors import InternalError
from imagegate.policies import NAMES, PLACEHOLDER, attestors
from tests.helpers import imagegate as cli


@pytest.fixture(scope="module")
def pub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _, public = keys.write_keypair(tmp_path_factory.mktemp("keys") / "gate", keys.generate(), None)
    return public


def test_list_names_every_policy_one_line_each_within_80_columns() -> None:
    said = cli("policies", "list")
    assert said.returncode == 0, said.stderr
    lines = said.stdout.splitlines()
    for name in NAMES:
        (line,) = [x for x in lines if x.startswith(name + " ")]
        assert re.search(r"\s(Kyverno|policy-controller)", line), line
    assert all(len(x) <= 80 for x in lines), [x for x in lines if len(x) > 80]


def test_write_fills_in_the_key_the_images_and_the_bound(pub: Path, tmp_path: Path) -> None:
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    done = cli(
        "policies", "write", "--key", str(pub), "--image", "reg.local:5000/team/*", "--max-age", "2d",
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.stem for p in (tmp_path / "out").iterdir()) == sorted(NAMES)
    key_lines = pub.read_text().strip().splitlines()
    for name in NAMES:
        text = (tmp_path / "out" / f"{name}.yaml").read_text()
        assert text.startswith(f"# written by imagegate {imagegate.__version__} "), text[:200]
        assert PLACEHOLDER not in text and "registry.example" not in text
        assert all(line in text for line in key_lines)
        policy = yaml.safe_load(text)
        assert policy["metadata"]["name"] == "imagegate-accepted"
        if name == "policy-controller-clusterimagepolicy":
            assert policy["spec"]["images"] == [{"glob": "reg.local:5000/team/**"}]
            (floor,) = set(re.findall(r'timeVerified: >="([^"]+)"', text))
            when = dt.datetime.strptime(floor, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
            assert (
                before - dt.timedelta(days=2)
                <= when
                <= before - dt.timedelta(days=2) + dt.timedelta(minutes=5)
            )
        else:
            assert "reg.local:5000/team/*" in text and "168h" not in text
            assert re.search(r"value: 48h|duration\('48h'\)", text)


def test_write_to_stdout_is_one_stream_of_the_named_policies(pub: Path) -> None:
    done = cli("policies", "write", "kyverno-clusterpolicy", "--key", str(pub), "--image", "r.example/*")
    assert done.returncode == 0, done.stderr
    (policy,) = list(yaml.safe_load_all(done.stdout))
    assert policy["kind"] == "ClusterPolicy"
    conditions = policy["spec"]["rules"][0]["verifyImages"][0]["attestations"][0]["conditions"][0]["all"]
    assert conditions[-1]["value"] == "168h"  # the shipped bound by default
    everything = cli("policies", "write", "--key", str(pub), "--image", "r.example/*")
    kinds = [p["kind"] for p in yaml.safe_load_all(everything.stdout)]
    assert kinds == ["ClusterPolicy", "ImageValidatingPolicy", "ClusterImagePolicy"]


def _refused(*args: str) -> str:
    done = cli("policies", "write", *args)
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("imagegate: error:")]
    return line


def test_write_refuses_bad_input_with_one_line(pub: Path, tmp_path: Path) -> None:
    private = pub.with_suffix(".key")
    (tmp_path / "not.pem").write_text("hello\n")
    ok = ("--key", str(pub), "--image", "r.example/*")
    assert "not a PEM public key" in _refused("--key", str(tmp_path / "not.pem"), "--image", "r.example/*")
    assert "this is a private key" in _refused("--key", str(private), "--image", "r.example/*")
    assert "image pattern is empty" in _refused("--key", str(pub), "--image", " ")
    assert "not an image pattern" in _refused("--key", str(pub), "--image", 'r.example/"a"')
    assert "no shipped policy 'kyverno'" in _refused("kyverno", *ok)
    assert "a policy needs a bound" in _refused(*ok, "--max-age", "0")
    assert "not a duration" in _refused(*ok, "--max-age", "a week")


def _trusted_root(folder: Path) -> tuple[Path, x509.Certificate, bytes]:
    """A trusted_root.json with one CA (a self-signed certificate) and one log: the file, the
    CA's certificate, the log's key (SubjectPublicKeyInfo, DER)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "test"), x509.NameAttribute(NameOID.COMMON_NAME, "ca")]
    )
    now = dt.datetime.now(dt.timezone.utc)
    ca = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(1).not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    log = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    root = {
        "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
        "certificateAuthorities": [{
            "subject": {"organization": "test", "commonName": "ca"}, "uri": "https://ca.example",
            "certChain": {"certificates": [{"rawBytes": b64(ca.public_bytes(serialization.Encoding.DER))}]},
        }],
        "tlogs": [{"baseUrl": "https://log.example", "hashAlgorithm": "SHA2_256", "publicKey": {"rawBytes": b64(log)}},
                  {"baseUrl": "https://log2.example", "hashAlgorithm": "SHA2_384", "publicKey": {"rawBytes": b64(log)}}],
    }  # fmt: skip
    (folder / "trusted_root.json").write_text(json.dumps(root))
    return folder / "trusted_root.json", ca, log


WHO = "https://github.com/org/repo/.github/workflows/gate.yml@refs/heads/main"
ISSUER = "https://token.actions.githubusercontent.com"


def test_write_keyless_names_the_signer_in_each_policy_and_the_trust_beside_it(tmp_path: Path) -> None:
    """Keyless: each policy's key attestor becomes one for the identity and issuer, reading the
    Sigstore bundle referrers keyless statements are attached as; the trusted root goes inline
    to the ImageValidatingPolicy (with the TUF repository named) and into a TrustRoot beside the
    ClusterImagePolicy. What the real controllers make of them: tests/attest/test_keyless_sigstore.py."""
    root, ca, log = _trusted_root(tmp_path)
    (tmp_path / "tuf-root.json").write_bytes(b'{"signed": {}}')
    done = cli(
        "policies", "write", "--identity", WHO, "--issuer-regexp", "^https://token\\.actions\\.", "--trusted-root",
        str(root), "--tuf-mirror", "https://tuf.example", "--tuf-root", str(tmp_path / "tuf-root.json"),
        "--image", "r.example/*", "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = {n: (tmp_path / "out" / f"{n}.yaml").read_text() for n in NAMES}
    assert all(
        "PUBLIC KEY" not in t and PLACEHOLDER not in t and "keyless" in t.splitlines()[0]
        for t in text.values()
    )
    cpol = yaml.safe_load(text["kyverno-clusterpolicy"])
    for rule in cpol["spec"]["rules"]:
        (verify,) = rule["verifyImages"]
        assert verify["type"] == "SigstoreBundle" and verify["useCache"] is False
        (entry,) = verify["attestations"][0]["attestors"][0]["entries"]
        assert entry == {
            "keyless": {
                "subject": WHO,
                "issuerRegExp": "^https://token\\.actions\\.",
                "rekor": {"url": "https://log.example"},
            }
        }
    cosign = yaml.safe_load(text["kyverno-imagevalidatingpolicy"])["spec"]["attestors"][0]["cosign"]
    assert cosign["keyless"] == {
        "identities": [{"subject": WHO, "issuerRegExp": "^https://token\\.actions\\."}]
    }
    assert json.loads(cosign["trustedRoot"]["value"]) == json.loads(root.read_text())
    assert cosign["tuf"] == {
        "mirror": "https://tuf.example",
        "root": {"data": base64.b64encode(b'{"signed": {}}').decode()},
    }
    cip, trust = yaml.safe_load_all(text["policy-controller-clusterimagepolicy"])
    for authority in cip["spec"]["authorities"]:
        assert authority["signatureFormat"] == "bundle" and "key" not in authority
        assert authority["keyless"] == {
            "identities": [{"subject": WHO, "issuerRegExp": "^https://token\\.actions\\."}],
            "trustRootRef": trust["metadata"]["name"],
        }
    keys_ = trust["spec"]["sigstoreKeys"]
    (authority,) = keys_["certificateAuthorities"]
    assert x509.load_pem_x509_certificates(base64.b64decode(authority["certChain"])) == [ca]
    assert (
        authority["subject"] == {"organization": "test", "commonName": "ca"}
        and authority["uri"] == "https://ca.example"
    )
    tlog, second = keys_["tLogs"]
    pem = serialization.load_pem_public_key(base64.b64decode(tlog["publicKey"]))
    spki = pem.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert spki == log and tlog["baseURL"] == "https://log.example" and tlog["hashAlgorithm"] == "sha-256"
    assert second["baseURL"] == "https://log2.example" and second["hashAlgorithm"] == "sha-384"
    # Each signer field written once per attestor: no key twice in a mapping (kubectl refuses it).
    counts = {
        "kyverno-clusterpolicy": 2,
        "kyverno-imagevalidatingpolicy": 1,
        "policy-controller-clusterimagepolicy": 2,
    }
    for name, n in counts.items():
        assert text[name].count(f'subject: "{WHO}"') == n and text[name].count("issuerRegExp:") == n, name


def test_write_keyless_with_a_timestamp_authority_reads_the_classic_att_layers(tmp_path: Path) -> None:
    """A trusted root with a timestamp authority: the ClusterImagePolicy's authorities read the
    `.att` layers in cosign's classic keyless form (policy-controller's sigstore-go reads no
    Rekor v2 bundle): the keyless `url` set (without one it reads no keyless attestation), the
    timestamp authority in the TrustRoot, no bundle format. Admission by the real tester:
    tests/attest/test_keyless_sigstore.py."""
    root, ca, _ = _trusted_root(tmp_path)
    doc = json.loads(root.read_text())
    doc["timestampAuthorities"] = [{**doc["certificateAuthorities"][0], "uri": "https://tsa.example"}]
    doc["certificateAuthorities"].append({**doc["certificateAuthorities"][0], "uri": "https://ca2.example"})
    root.write_text(json.dumps(doc))
    done = cli(
        "policies", "write", "--identity", WHO, "--issuer", ISSUER, "--trusted-root", str(root),
        "--image", "r.example/*", "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    cip, trust = yaml.safe_load_all(
        (tmp_path / "out" / "policy-controller-clusterimagepolicy.yaml").read_text()
    )
    name = trust["metadata"]["name"]
    assert len(cip["spec"]["authorities"]) == 2
    for authority in cip["spec"]["authorities"]:
        assert "signatureFormat" not in authority and "key" not in authority
        assert authority["keyless"] == {
            "url": "https://ca.example",  # the first certificate authority's
            "identities": [{"subject": WHO, "issuer": ISSUER}],
            "trustRootRef": name,
        }
        assert authority["rfc3161timestamp"] == {"trustRootRef": name}
    (tsa,) = trust["spec"]["sigstoreKeys"]["timestampAuthorities"]
    assert tsa["uri"] == "https://tsa.example"
    assert x509.load_pem_x509_certificates(base64.b64decode(tsa["certChain"])) == [ca]


def test_a_shipped_policy_without_its_key_attestor_is_refused_not_written(tmp_path: Path) -> None:
    """A policy edited without policies/attestors.py (no key attestor to replace) is an internal
    error, never a file written with the key's place left empty."""
    root, _, _ = _trusted_root(tmp_path)
    signer = attestors.Signer(WHO, None, ISSUER, None, attestors.read_trust(root))
    for rewrite in (
        attestors.cluster_policy,
        attestors.image_validating_policy,
        attestors.cluster_image_policy,
    ):
        with pytest.raises(InternalError, match="no key attestor"):
            rewrite("spec: {}\n", signer, "edited")


def test_write_keyless_refuses_a_signer_it_cannot_name_with_one_line(pub: Path, tmp_path: Path) -> None:
    root, _, _ = _trusted_root(tmp_path)
    who = ("--identity", WHO, "--issuer", ISSUER, "--image", "r.example/*")
    assert "needs --key PUB or a keyless signer" in _refused(
        *who, "--trusted-root", str(root), "--key", str(pub)
    )
    assert "needs --key PUB or a keyless signer" in _refused("--image", "r.example/*")
    assert "one of --issuer/--issuer-regexp" in _refused(
        "--identity", WHO, "--trusted-root", str(root), "--image", "r"
    )
    assert "one of --identity/--identity-regexp" in _refused(
        *who, "--identity-regexp", "x", "--trusted-root", str(root)
    )
    assert "needs --trusted-root FILE" in _refused(*who)
    assert "--tuf-root needs --tuf-mirror" in _refused(
        *who, "--trusted-root", str(root), "--tuf-root", str(root)
    )
    assert "not a regexp" in _refused(
        "--identity-regexp", "(", "--issuer", ISSUER, "--trusted-root", str(root), "--image", "r"
    )
    (tmp_path / "bad.json").write_text(
        '{"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1"}'
    )
    assert "not a Sigstore trusted root" in _refused(*who, "--trusted-root", str(tmp_path / "bad.json"))
    good = json.loads(root.read_text())
    for name, broken in (
        ("no-log", {**good, "tlogs": []}),
        ("ca-b64", {**good, "certificateAuthorities": [_b64_spoiled(good["certificateAuthorities"][0], "certChain", "certificates")]}),
        ("log-b64", {**good, "tlogs": [_b64_spoiled(good["tlogs"][0], "publicKey")]}),
    ):  # fmt: skip
        (tmp_path / f"{name}.json").write_text(json.dumps(broken))
        assert "not a Sigstore trusted root" in _refused(
            *who, "--trusted-root", str(tmp_path / f"{name}.json")
        ), name
    assert "cannot read it" in _refused(*who, "--trusted-root", str(tmp_path / "absent.json"))


def _b64_spoiled(entry: dict[str, Any], *path: str) -> dict[str, Any]:
    """`entry` with the rawBytes under `path` given two characters base64 does not have (a
    lenient decoder drops them and reads the same bytes)."""
    spoiled: dict[str, Any] = json.loads(json.dumps(entry))
    at: Any = spoiled
    for key in path:
        at = at[key]
    (inner,) = at if isinstance(at, list) else [at]
    inner["rawBytes"] += "$$"
    return spoiled
