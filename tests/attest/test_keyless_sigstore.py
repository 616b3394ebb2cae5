"""A keyless run, end to end, against the tests' own Sigstore (tests/attest/sigstore_local.py:
Fulcio, a CT log, Rekor v2 and a timestamp authority built from their Go modules, and an OIDC
issuer that is a STAND-IN for GitHub's and GitLab's): `run --key sigstore:TRUST` with a
GitHub-shaped token signs each statement with a certificate for the workflow; `verify` accepts
it for that identity and issuer under that trusted root alone, and cosign v3 verifies the same
bundle as an admission controller would."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import hashlib
import http.server
import json
import secrets
import shutil
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from imagegate.attest import attach, dsse, keys, referrers, sign
from imagegate.oci.manifest import OCI_INDEX
from tests.attest import tuf_repo
from tests.attest.conftest import HERE_RUN, Result, cli
from tests.attest.sigstore_local import LocalSigstore, bundle_stamped_before_its_certificate, local_sigstore
from tests.helpers import DOCKER_SOCK, ROOT, go_tools, load_script, serving
from tests.install import test_ci_steps as ci
from tests.install.ci_runners import run_act, run_gitlab_job
from tests.oci.infra import skopeo
from tests.run import test_gpu as ci_gpu

REPO = "org/gate"


@pytest.fixture(scope="module")
def local() -> Iterator[LocalSigstore]:
    with local_sigstore(go_tools("sigstore", "tesseract")) as s:
        yield s


@pytest.fixture(scope="module")
def signed(local: LocalSigstore, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One attempt folder, signed keyless as REPO's release workflow."""
    where = tmp_path_factory.mktemp("keyless")
    r = _run(local, where, local.token(REPO))
    assert r.returncode == 0, r.stderr
    assert "signed keyless" in r.stdout and local.identity(REPO) in r.stdout, r.stdout
    (attempt,) = (where / "runs").glob("*/*/")
    return attempt


def _run(local: LocalSigstore, cwd: Path, token: str, *extra: str, run: tuple[str, ...] = HERE_RUN) -> Result:
    cwd.mkdir(parents=True, exist_ok=True)
    env = {"SIGSTORE_ID_TOKEN": token, "XDG_CONFIG_HOME": str(cwd / "cfg")}
    trust = f"sigstore:{local.client_trust_config}"
    return cli(*run, "-o", "runs", "--key", trust, *extra, env=env, cwd=cwd)


def _verify(local: LocalSigstore, target: Path, *options: str, root: Path | None = None) -> Result:
    return cli(
        "verify", str(target), "--trusted-root", str(root or local.trusted_root), *options,
        env={"IMAGEGATE_SIGNING_KEY": "", "XDG_CONFIG_HOME": str(target.parent / "no-config")},
    )  # fmt: skip


def _who(local: LocalSigstore) -> tuple[str, ...]:
    return ("--identity", local.identity(REPO), "--issuer", local.issuer("github"))


def test_every_statement_is_signed_as_the_workflow_and_logged(local: LocalSigstore, signed: Path) -> None:
    for name in (sign.BUNDLE_FILE, sign.VSA_BUNDLE_FILE, sign.TEST_RESULT_BUNDLE_FILE):
        bundle = json.loads((signed / name).read_text())
        material = bundle["verificationMaterial"]
        cert = x509.load_der_x509_certificate(base64.b64decode(material["certificate"]["rawBytes"]))
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.UniformResourceIdentifier) == [local.identity(REPO)]
        (entry,) = material["tlogEntries"]
        assert entry["kindVersion"] == {"kind": "hashedrekord", "version": "0.0.2"}  # Rekor v2's
        assert material["timestampVerificationData"]["rfc3161Timestamps"], name
    # the DSSE file is the envelope the bundle carries, byte for byte in its payload
    dsse = json.loads((signed / sign.DSSE_FILE).read_text())
    assert dsse["payload"] == json.loads((signed / sign.BUNDLE_FILE).read_text())["dsseEnvelope"]["payload"]


def test_verify_accepts_the_workflow_it_names_and_no_other(local: LocalSigstore, signed: Path) -> None:
    ok = _verify(local, signed / sign.BUNDLE_FILE, *_who(local))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "verified: verdict PASS" in ok.stdout and f"keyless, as {local.identity(REPO)}" in ok.stdout
    beside = _verify(local, signed / sign.DSSE_FILE, *_who(local))  # the .sigstore.json beside it
    assert beside.returncode == 0, beside.stdout + beside.stderr
    vsa = _verify(local, signed / sign.VSA_BUNDLE_FILE, *_who(local), "--type", "vsa")
    assert vsa.returncode == 0, vsa.stdout + vsa.stderr
    regexp = (
        "--identity-regexp",
        f"^https://github\\.com/{REPO}/",
        "--issuer-regexp",
        "^http://127\\.0\\.0\\.1:",
    )
    assert _verify(local, signed / sign.BUNDLE_FILE, *regexp).returncode == 0
    for options, said in [
        (
            ("--identity", local.identity("org/other"), "--issuer", local.issuer("github")),
            "not https://github.com/org/other",
        ),
        (
            ("--identity", local.identity(REPO), "--issuer", local.issuer("gitlab")),
            "not " + local.identity(REPO),
        ),
        (("--identity-regexp", "^org/gate", "--issuer", local.issuer("github")), "matching /^org/gate/"),
    ]:
        refused = _verify(local, signed / sign.BUNDLE_FILE, *options)
        assert refused.returncode == 1 and said in refused.stdout, refused.stdout + refused.stderr


def _another_root(local: LocalSigstore, folder: Path) -> Path:
    """The same logs and TSA, another Fulcio CA: a certificate of ours does not chain to it."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "another Fulcio")])
    now = datetime.datetime.now(datetime.timezone.utc)
    ca = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    root = json.loads(local.trusted_root.read_text())
    der = base64.b64encode(ca.public_bytes(serialization.Encoding.DER)).decode()
    for authority in root["certificateAuthorities"]:
        authority["certChain"] = {"certificates": [{"rawBytes": der}]}
    (folder / "another_root.json").write_text(json.dumps(root))
    return folder / "another_root.json"


def test_a_bundle_from_another_trust_root_is_refused(
    local: LocalSigstore, signed: Path, tmp_path: Path
) -> None:
    other = _verify(local, signed / sign.BUNDLE_FILE, *_who(local), root=_another_root(local, tmp_path))
    assert other.returncode == 1 and "keyless:" in other.stdout, other.stdout + other.stderr
    # a key-signed statement's bundle names no certificate: refused for want of one
    garbage = tmp_path / "root.json"
    garbage.write_text('{"mediaType": "nothing"}')
    bad = _verify(local, signed / sign.BUNDLE_FILE, *_who(local), root=garbage)
    assert bad.returncode == 3 and "not a Sigstore trusted root" in bad.stderr


def test_a_certificate_used_outside_its_validity_is_refused(local: LocalSigstore, signed: Path) -> None:
    """A signature the TSA stamped before Fulcio issued its certificate: the time a verifier may
    trust is outside the certificate's validity."""
    from sigstore.dsse import Statement

    payload = base64.b64decode(json.loads((signed / sign.DSSE_FILE).read_text())["payload"])
    early = bundle_stamped_before_its_certificate(local, local.token(REPO), Statement(payload))
    target = signed.parent / "early" / sign.BUNDLE_FILE
    target.parent.mkdir(exist_ok=True)
    target.write_text(early.to_json())
    r = _verify(local, target, *_who(local), "--signature-only")
    assert r.returncode == 1 and "not valid at validation time" in r.stdout, r.stdout + r.stderr


def test_cosign_verifies_imagegates_keyless_bundle(local: LocalSigstore, signed: Path) -> None:
    script = go_tools("cosign")
    cosign = script.exe(script.named("cosign"))
    statement = json.loads((signed / "statement.json").read_text())
    r = subprocess.run(
        [cosign, "verify-blob-attestation", "--bundle", str(signed / sign.BUNDLE_FILE),
         "--trusted-root", str(local.trusted_root), "--certificate-identity", local.identity(REPO),
         "--certificate-oidc-issuer", local.issuer("github"), "--type", statement["predicateType"],
         "--check-claims=false"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0 and "Verified OK" in r.stderr, r.stderr


def test_a_refused_token_stops_before_the_run(local: LocalSigstore, tmp_path: Path) -> None:
    expired = _run(local, tmp_path, local.token(REPO, expires_in=-60))
    assert expired.returncode == 3 and "identity token from $SIGSTORE_ID_TOKEN is refused" in expired.stderr
    assert not (tmp_path / "runs").exists()  # nothing ran


def _referrers(image: str) -> list[dict[str, Any]]:
    """The referrers listed for `image`, as readers find them (the API or the fallback tag)."""
    parsed = attach.parse_image(image)
    with attach.client_for(parsed) as client:
        digest = attach.resolve(client, parsed).digests[0]
        return referrers._listed(client, parsed.repository, digest)[0]


def _verify_image(local: LocalSigstore, image: str, cwd: Path, *who: str) -> Result:
    return cli(
        "verify", "--image", image, "--trusted-root", str(local.trusted_root), *who,
        env={"IMAGEGATE_SIGNING_KEY": "", "XDG_CONFIG_HOME": str(cwd / "no-config")},
    )  # fmt: skip


@pytest.fixture(scope="module")
def pushed_python(images: dict[str, str], registry: str) -> str:
    """The python test image, copied to the tests' registry (skopeo: a docker push would give the
    shared image a repository digest, which a test of an image never pushed must not see)."""
    ref = f"{registry}/keyless/python:1"
    skopeo("copy", "-q", "--dest-tls-verify=false", f"docker-daemon:{images['python']}", f"docker://{ref}")
    return ref


def _in(image: str) -> tuple[str, ...]:
    """`run IMAGE` read from its registry (no engine): the manifest that ran is the one --attach
    pushes to."""
    return ("run", image, "--driver", "rootfs", "-p", "python", "-m", "json")


def _att(image: str) -> list[dict[str, Any]]:
    """The `.att` tag's layers of `image` ([] without the tag)."""
    parsed = attach.parse_image(image)
    with attach.client_for(parsed) as client:
        digest = attach.resolve(client, parsed).digests[0]
        found = attach._existing(client, parsed.repository, attach.attestation_tag(digest))
    return list(found["layers"]) if found else []


def _cosign_verifies(local: LocalSigstore, image: str, predicate_type: str, *form: str) -> Result:
    """`cosign verify-attestation` for REPO's workflow, as an admission controller checks it."""
    script = go_tools("cosign")
    parsed = attach.parse_image(image)
    with attach.client_for(parsed) as client:
        digest = attach.resolve(client, parsed).digests[0]
    return subprocess.run(
        [script.exe(script.named("cosign")), "verify-attestation", f"{parsed.registry}/{parsed.repository}@{digest}",
         "--trusted-root", str(local.trusted_root), "--certificate-identity", local.identity(REPO),
         "--certificate-oidc-issuer", local.issuer("github"), "--type", predicate_type,
         "--allow-http-registry", *form],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _replaced(said: str) -> dict[str, int]:
    """How many `.att` layers and referrers the attach's "replaced …" line names."""
    line = next((x for x in said.splitlines() if referrers.REPLACED_KEPT in x), "")
    return {w: line.count(f"{w} sha256:") for w in ("layer", "referrer")}


CLASSIC = ("--new-bundle-format=false", "--use-signed-timestamps", "--insecure-ignore-tlog")


@pytest.mark.engine
def test_a_keyless_attach_supersedes_only_its_own_identitys_word(
    local: LocalSigstore, pushed_python: str, tmp_path: Path
) -> None:
    """`run --attach` keyless pushes each statement as a Sigstore bundle referrer and as an `.att`
    layer in cosign's classic keyless form (the certificate, a timestamp over the layer, the
    bundle material beside them). A later run of the same identity replaces both, proven by each
    earlier bundle; another workflow's run or a key's keeps them; `verify --image` reads them for
    the identity it is given, and cosign verifies both forms as an admission controller does."""
    from imagegate.attest import keyless

    image = pushed_python
    first = _run(local, tmp_path / "a", local.token(REPO), "--attach", run=_in(image))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "3 attestation(s); referrers via" in first.stderr, first.stderr
    listed, layers = _referrers(image), _att(image)
    assert len(listed) == 3 and {m["artifactType"] for m in listed} == {
        "application/vnd.dev.sigstore.bundle.v0.3+json"
    }
    assert len(layers) == 3 and all(
        {keyless.CERTIFICATE_ANNOTATION, keyless.RFC3161_ANNOTATION, attach.MATERIAL_ANNOTATION}
        <= set(x["annotations"])
        for x in layers
    ), layers
    ok = _verify_image(local, image, tmp_path, *_who(local))
    assert ok.returncode == 0 and "verified: verdict PASS" in ok.stdout, ok.stdout + ok.stderr
    other = ("--identity", local.identity("org/other"), "--issuer", local.issuer("github"))
    refused = _verify_image(local, image, tmp_path, *other)
    assert refused.returncode == 1 and "not https://github.com/org/other" in refused.stdout, refused.stdout

    statement = json.loads(next((tmp_path / "a" / "runs").glob("*/*/statement.json")).read_text())
    for form in ((), CLASSIC):  # the referrer's bundle, then the .att layer's classic form
        r = _cosign_verifies(local, image, statement["predicateType"], *form)
        assert r.returncode == 0, (form, r.stderr)

    again = _run(local, tmp_path / "b", local.token(REPO), "--attach", run=_in(image))
    assert again.returncode == 0, again.stdout + again.stderr
    assert _replaced(again.stderr) == {"layer": 3, "referrer": 3}, again.stderr
    assert {m["digest"] for m in _referrers(image)}.isdisjoint(m["digest"] for m in listed)
    assert len(_att(image)) == 3
    assert {x["digest"] for x in _att(image)}.isdisjoint(x["digest"] for x in layers)
    assert len(_referrers(image)) == 3
    theirs = _run(local, tmp_path / "c", local.token("org/other"), "--attach", run=_in(image))
    assert theirs.returncode == 0, theirs.stdout + theirs.stderr
    assert f"not signed by identity {local.identity('org/other')}" in theirs.stderr, theirs.stderr
    # another workflow's word never erases this one's
    assert len(_referrers(image)) == 6 and len(_att(image)) == 6
    assert cli("keygen", "--out", str(tmp_path / "team")).returncode == 0
    keyed = cli(*_in(image), "-o", "runs", "--key", str(tmp_path / "team.key"), "--attach", cwd=tmp_path)
    assert keyed.returncode == 0, keyed.stdout + keyed.stderr
    assert "not signed by key " in keyed.stderr, keyed.stderr  # nor a key's
    assert len(_referrers(image)) == 9 and len(_att(image)) == 9


@pytest.mark.engine
def test_a_stripped_or_forged_proof_on_a_layer_hides_no_copy_and_proves_nothing(
    local: LocalSigstore, registry: str, images: dict[str, str], tmp_path: Path
) -> None:
    """Anyone who can push may rewrite the `.att` tag's annotations: with each layer's bundle
    material stripped or swapped for another identity's, `verify --image` still takes the
    statement from its referrer copy, and a later attach of the same identity keeps those
    layers (nothing proves them its own) while it replaces the referrers. With the referrers
    gone, the `.att` layers whose material proves the identity give the word alone."""
    image = f"{registry}/keyless-forged/python:1"
    skopeo("copy", "-q", "--dest-tls-verify=false", f"docker-daemon:{images['python']}", f"docker://{image}")
    first = _run(local, tmp_path / "a", local.token(REPO), "--attach", run=_in(image))
    assert first.returncode == 0, first.stdout + first.stderr
    theirs = _run(local, tmp_path / "b", local.token("org/other"), "--attach", run=_in(image))
    assert theirs.returncode == 0, theirs.stdout + theirs.stderr
    parsed = attach.parse_image(image)
    with attach.client_for(parsed) as client:
        remote = attach.resolve(client, parsed)
        tag = attach.attestation_tag(remote.digests[0])
        manifest = attach._existing(client, parsed.repository, tag)
        assert manifest is not None and len(manifest["layers"]) == 6
        ours, others = manifest["layers"][:3], manifest["layers"][3:]
        for n, (x, y) in enumerate(zip(ours, others, strict=True)):
            notes = x["annotations"]
            notes[attach.MATERIAL_ANNOTATION] = (
                "{" if n == 0 else y["annotations"][attach.MATERIAL_ANNOTATION]
            )
        raw = json.dumps(manifest).encode()
        client.put_manifest(parsed.repository, tag, raw, manifest["mediaType"])
    ok = _verify_image(local, image, tmp_path, *_who(local))
    assert ok.returncode == 0 and "verified: verdict PASS" in ok.stdout, ok.stdout + ok.stderr
    again = _run(local, tmp_path / "c", local.token(REPO), "--attach", run=_in(image))
    assert again.returncode == 0, again.stdout + again.stderr
    assert _replaced(again.stderr) == {"layer": 0, "referrer": 3}, again.stderr
    assert len(_att(image)) == 9 and len(_referrers(image)) == 6
    # the referrers gone (their fallback index emptied): the `.att` layers alone give the word
    empty = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    with attach.client_for(parsed) as client:
        where = referrers.fallback_tag(remote.digests[0])
        client.put_manifest(parsed.repository, where, json.dumps(empty).encode(), OCI_INDEX)
    assert _referrers(image) == []
    alone = _verify_image(local, image, tmp_path, *_who(local))
    assert alone.returncode == 0 and "verified: verdict PASS" in alone.stdout, alone.stdout + alone.stderr


@contextlib.contextmanager
def _fulcio_that(answer: Callable[[http.server.BaseHTTPRequestHandler], None]) -> Iterator[str]:
    """A server in Fulcio's place that answers as `answer` does: its URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))  # read whole: no reset
            answer(self)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        yield url


def _flood(h: http.server.BaseHTTPRequestHandler) -> None:
    h.send_response(201)
    h.send_header("Content-Type", "application/json")
    h.end_headers()
    with contextlib.suppress(OSError):
        for _ in range(80):  # 5 MiB and more, never a whole answer
            h.wfile.write(b" " * (1 << 16))


def _stall(h: http.server.BaseHTTPRequestHandler) -> None:
    h.send_response(201)
    h.send_header("Content-Length", "1000")
    h.end_headers()
    with contextlib.suppress(OSError):
        for _ in range(600):  # a byte a second: each read is answered, the whole never
            h.wfile.write(b" ")
            h.wfile.flush()
            time.sleep(1)


def _trust_with_fulcio(local: LocalSigstore, folder: Path, url: str) -> Path:
    config = json.loads(local.client_trust_config.read_text())
    config["signingConfig"]["caUrls"][0]["url"] = url
    (folder / "trust.json").write_text(json.dumps(config))
    return folder / "trust.json"


def test_a_fulcio_that_floods_or_trickles_is_cut(local: LocalSigstore, tmp_path: Path) -> None:
    env = {"SIGSTORE_ID_TOKEN": local.token(REPO), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    with _fulcio_that(_flood) as url:
        trust = _trust_with_fulcio(local, tmp_path, url)
        r = cli(*HERE_RUN, "-o", "runs", "--key", f"sigstore:{trust}", env=env, cwd=tmp_path)
    assert r.returncode == 3 and "Fulcio's certificate: " in r.stderr and "answered over 4 MiB" in r.stderr, (
        r.stderr
    )
    assert local.token(REPO)[:20] not in r.stderr
    with _fulcio_that(_stall) as url:
        trust = _trust_with_fulcio(local, tmp_path, url)
        began = time.monotonic()
        r = cli(
            *HERE_RUN, "-o", "runs", "--timeout", "5", "--key", f"sigstore:{trust}", env=env, cwd=tmp_path
        )
        took = time.monotonic() - began
    assert r.returncode == 2 and "Fulcio's certificate" in r.stderr, r.stderr
    assert took < 5 + 2 + 10, took  # the deadline, its 2 s, and the interpreter's start-up under load
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("kind", ["caUrls", "rekorTlogUrls", "tsaUrls"])
def test_a_service_over_plain_http_elsewhere_is_refused(
    local: LocalSigstore, tmp_path: Path, kind: str
) -> None:
    config = json.loads(local.client_trust_config.read_text())
    config["signingConfig"][kind][0]["url"] = "http://sigstore.example"
    (tmp_path / "trust.json").write_text(json.dumps(config))
    env = {"SIGSTORE_ID_TOKEN": local.token(REPO), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    r = cli(*HERE_RUN, "-o", "runs", "--key", f"sigstore:{tmp_path / 'trust.json'}", env=env, cwd=tmp_path)
    assert (
        r.returncode == 3 and f"{kind} names 'http://sigstore.example'" in r.stderr and "in clear" in r.stderr
    )
    assert not (tmp_path / "runs").exists()


def _cert(start: datetime.datetime, end: datetime.datetime) -> dict[str, dict[str, str]]:
    """A bundle's certificate material: a self-signed certificate valid from `start` to `end`."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "signer")])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(1).not_valid_before(start).not_valid_after(end).sign(key, hashes.SHA256())
    )  # fmt: skip
    return {
        "certificate": {"rawBytes": base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()}
    }


def test_an_att_layers_classic_proof_is_a_checked_timestamp_over_its_bytes(local: LocalSigstore) -> None:
    """What a keyless `.att` layer carries for policy-controller (KeylessKey.stamp): the signing
    certificate, and the timestamp authority's answer over exactly the layer's bytes, checked
    against the trusted root. An answer over other bytes (a STAND-IN client in front of the
    real TSA), a certificate not valid at the stamped time, are refused before anything is
    written; a signing config with no timestamp authority gives no proof (no `.att` layer)."""
    from rfc3161_client import decode_timestamp_response

    from imagegate.attest import bundle, keyless
    from imagegate.errors import UsageError

    key = keyless.open_key(f"sigstore:{local.client_trust_config}", {"SIGSTORE_ID_TOKEN": local.token(REPO)})
    statement = {"_type": "https://in-toto.io/Statement/v1", "predicateType": "https://example/p",
                 "subject": [{"name": "x", "digest": {"sha256": "0" * 64}}], "predicate": {}}  # fmt: skip
    made = key.seal(json.dumps(statement).encode())
    layer, material = attach.layer_bytes(bundle.envelope_of(made)), bundle.material_of(made) or {}
    notes = key.stamp(layer, material)
    assert notes is not None
    cert = x509.load_pem_x509_certificate(notes[keyless.CERTIFICATE_ANNOTATION].encode())
    assert cert.public_bytes(serialization.Encoding.DER) == base64.b64decode(
        material["certificate"]["rawBytes"]
    )
    said = json.loads(notes[keyless.RFC3161_ANNOTATION])
    answer = decode_timestamp_response(base64.b64decode(said["SignedRFC3161Timestamp"]))
    assert answer.tst_info.message_imprint.message == hashlib.sha256(layer).digest()
    for none in ({}, {"certificate": {"rawBytes": "bm90IGEgY2VydGlmaWNhdGU="}}):  # no certificate
        assert key.stamp(layer, none) is None
    clients = key._signer._signing_ctx._tsa_clients  # type: ignore[union-attr]
    real = clients[0]

    class Answers:
        """STAND-IN in front of the real TSA: its one answer over `over`, whatever it is asked."""

        url = real.url

        def __init__(self, over: bytes) -> None:
            self.answer = real.request_timestamp(over)

        def request_timestamp(self, data: bytes) -> Any:
            return self.answer

    clients[0] = same = Answers(layer)
    at, day = same.answer.tst_info.gen_time, datetime.timedelta(days=1)  # whole seconds, as X.509's
    for start, end in ((at, at + day), (at - day, at)):  # valid from, or until, that very second
        assert key.stamp(layer, _cert(start, end)) is not None
    second = datetime.timedelta(seconds=1)
    for start, end in ((at - day, at - second), (at + second, at + day)):  # expired, not yet valid
        with pytest.raises(UsageError, match="inside the signing certificate's validity"):
            key.stamp(layer, _cert(start, end))
    clients[0] = Answers(layer + b"\n")  # an answer over other bytes
    with pytest.raises(UsageError, match="does not verify with the trusted root"):
        key.stamp(layer, material)
    clients.clear()
    assert key.stamp(layer, material) is None


def test_an_attach_proves_each_bundle_for_the_identity_and_an_earlier_one_only_by_its_own(
    local: LocalSigstore, signed: Path
) -> None:
    """What `run --attach` writes keyless must prove the signer's identity, and an earlier
    envelope is that identity's only with a bundle that proves it (a bare one never is)."""
    from imagegate.attest import bundle, keyless
    from imagegate.errors import NotVerified

    made = json.loads((signed / sign.BUNDLE_FILE).read_text())
    envelope, material = bundle.envelope_of(made), made["verificationMaterial"]
    root = keyless.trusted_root(local.trusted_root)
    ours = keyless.Expected(root, identity=local.identity(REPO), issuer=local.issuer("github"))
    new = referrers.keyless_verified(envelope, material, ours, "the attestation")
    assert new.named() == f"identity {ours}"
    assert new.made(envelope, material) and not new.made(envelope, None) and not new.made(envelope, {})
    theirs = keyless.Expected(root, identity=local.identity("org/other"), issuer=local.issuer("github"))
    with pytest.raises(NotVerified, match="does not prove"):
        referrers.keyless_verified(envelope, material, theirs, "the attestation")


@pytest.fixture(scope="module")
def tuf_mirror(local: LocalSigstore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The local Sigstore's trusted root published in a TUF repository of the test's own
    (tests/attest/tuf_repo.py): its mirror URL and root.json."""
    folder = tmp_path_factory.mktemp("tuf")
    (folder / "root.json").write_bytes(
        tuf_repo.build(folder / "repo", {"trusted_root.json": local.trusted_root.read_bytes()})
    )
    with tuf_repo.served(folder / "repo") as url:
        yield url, folder / "root.json"


def _written(
    local: LocalSigstore, mirror: tuple[str, Path], sub: str, pattern: str, out: Path
) -> dict[str, Path]:
    """`policies write` keyless for workflow `sub`: each policy's file, the ClusterImagePolicy's
    TrustRoot split into a file of its own (the tester reads one of each)."""
    r = cli(
        "policies", "write", "--identity", local.identity(sub), "--issuer", local.issuer("github"),
        "--trusted-root", str(local.trusted_root), "--tuf-mirror", mirror[0], "--tuf-root", str(mirror[1]),
        "--image", pattern, "--out", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    files = {p.stem: p for p in out.glob("*.yaml")}
    consumers = load_script(ROOT / "scripts" / "consumers.py")
    files["policy-controller-clusterimagepolicy"], files["trustroot"] = consumers.split_trust_root(
        files["policy-controller-clusterimagepolicy"]
    )
    cip, trust = (
        yaml.safe_load(files[n].read_text()) for n in ("policy-controller-clusterimagepolicy", "trustroot")
    )
    assert trust["kind"] == "TrustRoot"
    assert {a["keyless"]["trustRootRef"] for a in cip["spec"]["authorities"]} == {trust["metadata"]["name"]}
    return files


@dataclasses.dataclass(frozen=True)
class Judging:
    pinned: str  # the image, by digest, its VSA attached keyless as REPO's workflow
    pod: Path  # a Pod running it
    policies: dict[str, dict[str, Path]]  # workflow -> the policies written for it
    env: dict[str, str]  # where Kyverno's two TUF clients cache


@pytest.fixture(scope="module")
def judging(
    local: LocalSigstore,
    images: dict[str, str],
    registry: str,
    tuf_mirror: tuple[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Judging:
    where = tmp_path_factory.mktemp("keyless-policies")
    ref = f"{registry}/keyless-policies/python:1"
    # Copied and run without the engine: a tag or a pull would give the shared test image a
    # repository digest, which other tests (an image never pushed) must not see.
    skopeo("copy", "-q", "--dest-tls-verify=false", f"docker-daemon:{images['python']}", f"docker://{ref}")
    rootfs = ("run", ref, "--driver", "rootfs", "-p", "python", "-m", "json")
    r = _run(local, where / "run", local.token(REPO), "--attach", run=rootfs)
    assert r.returncode == 0, r.stdout + r.stderr
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        pinned = f"{parsed.registry}/{parsed.repository}@{attach.resolve(client, parsed).digests[0]}"
    pod = where / "pod.yaml"
    pod.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app"},
                                   "spec": {"containers": [{"name": "app", "image": pinned}]}}))  # fmt: skip
    pattern = f"{registry}/keyless-policies/*"
    written = {
        sub: _written(local, tuf_mirror, sub, pattern, where / sub.replace("/", "-"))
        for sub in (REPO, "org/other")
    }
    # sigstore-go's TUF cache is under HOME; sigstore/sigstore's under TUF_ROOT
    env = {"HOME": str(where / "home"), "TUF_ROOT": str(where / "tuf-cache")}
    return Judging(pinned, pod, written, env)


@pytest.mark.engine
def test_kyverno_admits_on_the_identity_its_policies_name_and_refuses_another(judging: Judging) -> None:
    """Both Kyverno policies written keyless (`policies write --identity --issuer
    --trusted-root --tuf-mirror --tuf-root`), judged by Kyverno's CLI on an image whose VSA
    `run --attach` signed keyless as REPO's workflow: the ImageValidatingPolicy (the trusted root
    inline, the TUF repository it names initialised), then the ClusterPolicy, whose only trust is
    Kyverno's TUF cache, which the first check left. Each admits for REPO's workflow and refuses
    another workflow of the same issuer; policy-controller's tester refuses the other too."""
    consumers = go_tools("kyverno", "policy-controller")
    for sub in (REPO, "org/other"):
        files = judging.policies[sub]
        answers = [
            consumers.kyverno_apply(files["kyverno-imagevalidatingpolicy"], judging.pod, env=judging.env),
            consumers.kyverno_apply(files["kyverno-clusterpolicy"], judging.pod, env=judging.env),
        ]
        said = "\n".join(a.said for a in answers)
        assert [a.admitted for a in answers] == [sub == REPO] * 2, (sub, said)
    files = judging.policies["org/other"]
    pc = consumers.policy_controller_test(
        files["policy-controller-clusterimagepolicy"], judging.pinned, judging.pod, files["trustroot"]
    )
    assert pc.admitted is False, pc.said


@pytest.mark.engine
def test_policy_controller_admits_on_the_identity_its_policy_names(judging: Judging) -> None:
    """The ClusterImagePolicy written keyless and its TrustRoot, in policy-controller's tester, on
    the image REPO's workflow attested: it reads the `.att` layers `run --attach` wrote in cosign's
    classic keyless form (the certificate, a timestamp over the layer; its sigstore-go reads no
    Rekor v2 bundle) and admits; the policy written for another workflow refuses (above)."""
    consumers = go_tools("policy-controller")
    files = judging.policies[REPO]
    cip = yaml.safe_load(files["policy-controller-clusterimagepolicy"].read_text())
    assert all("rfc3161timestamp" in a for a in cip["spec"]["authorities"]), cip
    pc = consumers.policy_controller_test(
        files["policy-controller-clusterimagepolicy"], judging.pinned, judging.pod, files["trustroot"]
    )
    assert pc.admitted is True, pc.said


def test_a_fleet_signed_keyless_is_verified_by_the_identity_each_statement_proves(
    local: LocalSigstore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fleet run --key sigstore:…` (FleetCluster standing in for the API server, as in
    tests/fleet/test_run.py: each Pod's log is the real controller running the real node check
    bundle here, with no GPU, so every node is unfit) signs each node's attempt and its node
    statement keyless, each with its bundle beside it. `fleet report --identity --issuer
    --trusted-root` verifies both by the identity they prove; it refuses every node for another
    identity, and the one node whose statement another workflow signed in its place."""
    from typer.testing import CliRunner

    from imagegate.attest import keyless
    from imagegate.cli import app
    from imagegate.fleet import node_statement as nodecheck
    from imagegate.usecases import runner
    from tests.fleet.test_judge import _k8s_node
    from tests.fleet.test_run import FleetCluster
    from tests.helpers import controller_output
    from tests.kube.test_podrun import DIGEST

    gpu_prep = runner.prepare(runner.RunOptions(pipeline="gpu", gpus="8"))  # as fleet run plans it
    cluster = FleetCluster(lambda k: controller_output(gpu_prep, k), pending=0)
    monkeypatch.setattr("imagegate.kube.kubectl.KubectlCluster", lambda context=None: cluster)
    monkeypatch.setenv("SIGSTORE_ID_TOKEN", local.token(REPO))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    (tmp_path / "nodes.json").write_text(json.dumps({"items": [_k8s_node(n) for n in ("gpu-1", "gpu-2")]}))
    trust = f"sigstore:{local.client_trust_config}"
    args = ["fleet", "run", f"myorg/torch@{DIGEST}", "--nodes", str(tmp_path / "nodes.json"),
            "-o", str(tmp_path / "runs"), "--key", trust, "--format", "json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output  # unfit: no GPU here
    attempts = json.loads(result.stdout)["attempts"]
    assert all((Path(a) / nodecheck.NODE_BUNDLE_FILE).is_file() for a in attempts.values())
    given = [f"{n}={a}" for n, a in attempts.items()]
    root = ("--trusted-root", str(local.trusted_root), "--format", "json")

    def report(*who: str) -> dict[str, dict[str, Any]]:
        done = CliRunner().invoke(app, ["fleet", "report", *given, *who, *root])
        assert done.exit_code == 1, done.output
        return {n["name"]: n for n in json.loads(done.stdout)["nodes"]}

    assert {n["evidence"] for n in report(*_who(local)).values()} == {"verified"}
    other = ("--identity", local.identity("org/other"), "--issuer", local.issuer("github"))
    theirs = report(*other)
    assert {n["evidence"] for n in theirs.values()} == {"refused"}, theirs
    assert all("not signed by" in " ".join(n["why"]) for n in theirs.values()), theirs
    # gpu-1's node statement, the same statement, signed by another workflow and put in its place
    folder = Path(attempts["gpu-1"])
    statement = json.loads(dsse.from_json((folder / nodecheck.NODE_FILE).read_bytes()).payload)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other_key = keyless.open_key(trust, {"SIGSTORE_ID_TOKEN": local.token("org/other")})
    nodecheck.sign_node(elsewhere, statement, other_key)
    for name in (nodecheck.NODE_FILE, nodecheck.NODE_BUNDLE_FILE):
        shutil.copyfile(elsewhere / name, folder / name)
    swapped = report(*_who(local))
    assert swapped["gpu-2"]["evidence"] == "verified"
    assert swapped["gpu-1"]["evidence"] == "refused", swapped
    assert f"node statement: not signed by {local.identity(REPO)}" in " ".join(swapped["gpu-1"]["why"])


@pytest.mark.engine
def test_a_keyless_index_combines_the_runs_its_identity_signed(
    local: LocalSigstore, images: dict[str, str], registry: str, tmp_path: Path
) -> None:
    """`run --all-platforms --key sigstore:… --attach` on an index of two platforms (each run here
    with the rootfs driver): each platform's run signed keyless, the index statement combining
    them by the identity each run's certificate proves, attached to the index digest in both
    forms (the `.att` layers with their classic proof); `verify --image` of the tag reads it for
    that identity. `index` over the same runs takes them for that identity, named, and refuses
    them for another workflow's."""
    from imagegate.attest import keyless
    from tests.oci.infra import push_two_platforms

    two = push_two_platforms(registry, images["python"], "keyless-index/multi")
    token = local.token(REPO)
    arm = f"docker://{registry}/keyless-index/multi@{two.arm64_digest}"  # its layers run here
    arm_run = _run(local, tmp_path / "ci", token, run=("run", arm, "-p", "python", "--driver", "rootfs"))
    assert arm_run.returncode == 0, arm_run.stdout + arm_run.stderr
    run = ("run", f"docker://{two.ref}", "--all-platforms", "-p", "python", "--driver", "rootfs")
    partial = _run(local, tmp_path / "ci", token, "--attach", run=run)  # amd64 alone runs here
    assert partial.returncode == 1 and "not run: linux/arm64/v8" in partial.stderr, partial.stderr
    assert len(_att(two.ref)) == 3 and len(_referrers(two.ref)) == 3  # attached all the same
    runs = sorted(str(p.parent) for p in (tmp_path / "ci" / "runs").glob("sha256-*/*/attestation.dsse.json"))
    assert len(runs) == 2, runs
    done = _run(local, tmp_path / "ci", token, "--attach", run=("index", two.ref, *runs))
    assert done.returncode == 0, done.stdout + done.stderr
    replaced = [x for x in done.stdout.splitlines() if x.startswith("  replaced ")]
    assert sum(" layer sha256:" in x for x in replaced) == 3 and len(replaced) == 6, done.stdout
    layers = _att(two.ref)  # the tag names the index: what is attached to its digest
    assert len(layers) == 3 and all(keyless.CERTIFICATE_ANNOTATION in x["annotations"] for x in layers)
    ok = _verify_image(local, two.ref, tmp_path, *_who(local))
    assert ok.returncode == 0 and "verified: verdict PASS" in ok.stdout, ok.stdout + ok.stderr
    assert cli("keygen", "--out", str(tmp_path / "team")).returncode == 0
    index = (
        "index",
        two.ref,
        *runs,
        "--key",
        str(tmp_path / "team.key"),
        "--trusted-root",
        str(local.trusted_root),
    )
    env = {"XDG_CONFIG_HOME": str(tmp_path / "no-config")}
    taken = cli(*index, *_who(local), "-o", str(tmp_path / "ours"), env=env)
    assert taken.returncode == 0, taken.stdout + taken.stderr
    other = ("--identity", local.identity("org/other"), "--issuer", local.issuer("github"))
    refused = cli(*index, *other, "-o", str(tmp_path / "theirs"), env=env)
    assert refused.returncode == 1 and "not signed by https://github.com/org/other" in refused.stderr, (
        refused.stdout + refused.stderr
    )


@pytest.mark.engine
def test_pod_collect_signs_keyless_as_the_workflow(local: LocalSigstore, tmp_path: Path) -> None:
    """`pod collect` of what a zero-GPU Pod left (its log, the Pod and the Secret it names, as
    kubectl gives them: tests/kube/test_collect.py's real controller run) signs the collected
    attempt keyless as `run` does: it verifies for the workflow's identity and not another's."""
    from tests.kube.test_collect import log, pod, secret

    (tmp_path / "pod.log").write_bytes(log("pass"))
    (tmp_path / "pod.json").write_text(json.dumps(pod("pod-containerd-succeeded.json")))
    (tmp_path / "secret.json").write_text(json.dumps(secret()))
    collect = ("pod", "collect", "--logs", "pod.log", "--pod", "pod.json", "--secret", "secret.json",
               "-p", "python", "-m", "json")  # fmt: skip
    done = _run(local, tmp_path, local.token(REPO), run=collect)
    assert done.returncode == 0 and "signed keyless" in done.stdout, done.stdout + done.stderr
    (attempt,) = [p.parent for p in (tmp_path / "runs").glob("*/*/statement.json")]
    ok = _verify(local, attempt, *_who(local))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    other = _verify(
        local, attempt, "--identity", local.identity("org/other"), "--issuer", local.issuer("github")
    )
    assert other.returncode == 1, other.stdout


# ---- the CI steps, keyless as the job's identity -----------------------------------------------


@contextlib.contextmanager
def _github_token_request(local: LocalSigstore, sub: str) -> Iterator[dict[str, str]]:
    """GitHub's ID-token request for a job with `id-token: write`, a STAND-IN (GitHub's cannot
    run here): GET ACTIONS_ID_TOKEN_REQUEST_URL&audience=AUD with the bearer
    ACTIONS_ID_TOKEN_REQUEST_TOKEN answers {"value": JWT}, the JWT minted by the tests' issuer
    for `sub`'s workflow. The variables a runner sets for such a job."""
    bearer = secrets.token_hex(16)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
            ok = self.headers.get("Authorization", "").lower() == f"bearer {bearer}" and "audience" in query
            body = json.dumps(
                {"value": local.token(sub, audience=query["audience"][0])} if ok else {}
            ).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        yield {
            "ACTIONS_ID_TOKEN_REQUEST_URL": f"{url}/token?api-version=2.0",
            "ACTIONS_ID_TOKEN_REQUEST_TOKEN": bearer,
        }


@pytest.mark.engine
def test_the_action_and_the_gitlab_job_sign_keyless_as_the_jobs_identity(
    local: LocalSigstore, images: dict[str, str], tmp_path: Path
) -> None:
    """With no key and an identity (GitHub: `id-token: write`, the runner's token request;
    GitLab: `id_tokens` SIGSTORE_ID_TOKEN), the Action and the GitLab job sign keyless through
    the Sigstore named (`sigstore`, IMAGEGATE_SIGSTORE), as that workflow or project; naming
    none stops the step before anything runs: the public instance is never a default."""
    trust = str(local.client_trust_config)
    common = {"image": images["python"], "imagegate": str(ci.IMAGEGATE)}
    with _github_token_request(local, REPO) as runner:
        env = {**ci._env(), **runner}
        unnamed, workspace = ci._action(tmp_path / "unnamed", env, **common)
        assert unnamed.outcome == "failure" and unnamed.outputs["exit-code"] == "3", unnamed.log
        assert (
            "set input sigstore" in unnamed.steps["check"]["stdout"]
            and not (workspace / "imagegate-runs").exists()
        )
        run, workspace = ci._action(tmp_path / "github", env, **common, sigstore=trust)
    assert run.outcome == "success" and run.outputs["signed"] == "true", run.log
    ok = _verify(local, workspace / run.outputs["attempt"], *_who(local))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    project = tmp_path / "project"
    project.mkdir()
    job = {"extends": ".imagegate", "variables": {
        "DOCKER_HOST": DOCKER_SOCK, "IMAGEGATE_DRIVER": "docker", "IMAGEGATE_IMAGE": images["python"],
        "IMAGEGATE_BIN": str(ci.IMAGEGATE), "IMAGEGATE_SIGSTORE": trust}}  # fmt: skip
    token = {"SIGSTORE_ID_TOKEN": local.token("group/app", kind="gitlab")}  # what id_tokens sets
    done = run_gitlab_job(ci.GITLAB, job, project, {**ci._env(), **token})
    assert done.returncode == 0 and "(signed)" in done.output, done.output
    attempt = project / ci._dotenv(project / "imagegate.env")["IMAGEGATE_ATTEMPT"]
    gitlab = ("--identity", local.identity("group/app", kind="gitlab"), "--issuer", local.issuer("gitlab"))
    ok = _verify(local, attempt, *gitlab)
    assert ok.returncode == 0, ok.stdout + ok.stderr


@pytest.mark.engine
def test_the_action_through_act_signs_keyless_with_the_jobs_token(
    local: LocalSigstore, images: dict[str, str], tmp_path: Path
) -> None:
    """GitHub's runner as nektos/act runs it (on this machine's shell), the runner's ID-token
    request a stand-in given to act as the runner's variables: the job with `id-token: write`
    and `sigstore` signs keyless as REPO's workflow, and its artifact's attestation verifies for
    that identity alone."""
    action = tmp_path / "action"
    (action / "ci").mkdir(parents=True)
    shutil.copy(ci.ACTION, action / "action.yml")
    shutil.copy(ci.CONSTRAINTS, action / "ci" / "constraints.txt")
    results, artifacts = tmp_path / "results", tmp_path / "artifacts"
    results.mkdir()
    job = ci._act_job(
        "keyless",
        images["python"],
        {"imagegate": str(ci.IMAGEGATE), "sigstore": str(local.client_trust_config)},
    )
    workflow = {
        "on": "push",
        "env": {"IMAGEGATE_TEST_RESULTS": str(results), "IMAGEGATE_TEST_ARTIFACTS": str(artifacts)},
        "jobs": {"keyless": {**job, "permissions": {"contents": "read", "id-token": "write"}}},
    }
    upload = next(s["uses"] for s in yaml.safe_load(ci.ACTION.read_text())["runs"]["steps"] if "uses" in s)
    act = go_tools("act")
    with _github_token_request(local, REPO) as runner:
        run = run_act(
            str(act.exe(act.ACT)), yaml.safe_dump(workflow), tmp_path / "act",
            {"imagegate/imagegate@v1": action, upload: ci.UPLOAD_STAND_IN}, {}, runner,
        )  # fmt: skip
    assert run.returncode == 0 and "[test.yml/keyless] 🏁  Job succeeded" in run.log, run.log[-5000:]
    got = json.loads((results / "keyless.json").read_text())
    assert got["OUTCOME"] == "success" and got["SIGNED"] == "true", got
    attempt = artifacts / "imagegate" / got["ATTEMPT"]
    ok = _verify(local, attempt, *_who(local))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    other = ("--identity", local.identity("org/other"), "--issuer", local.issuer("github"))
    assert _verify(local, attempt, *other).returncode == 1


# ---- complete: a GPU node completes what the CI signed keyless ---------------------------------


def test_complete_verifies_a_keyless_attempt_by_its_identity_and_the_chain_verifies(
    local: LocalSigstore, tmp_path: Path
) -> None:
    """A CI's deferred attempt signed keyless as REPO's workflow: `complete` on the GPU node
    verifies it for that identity (--identity, --issuer, --trusted-root), not for another or
    without one, and signs the completion with its own key; `verify` of the completion checks
    the link with the key and the identity, from the earlier folder beside or, with it gone, the
    copy the completion keeps (envelope and bundle)."""
    pipeline = tmp_path / "gpu.yaml"
    pipeline.write_text(ci_gpu.GPU_PIPELINE.format(python=sys.executable))
    deferred = _run(
        local,
        tmp_path / "ci",
        local.token(REPO),
        run=("run", "--here", "--python", sys.executable, "-p", str(pipeline)),
    )
    assert deferred.returncode == 0 and "DEFERRED" in deferred.stdout + deferred.stderr, (
        deferred.stdout + deferred.stderr
    )
    (earlier,) = [p.parent for p in (tmp_path / "ci" / "runs").glob("*/*/statement.json")]
    assert cli("keygen", "--out", str(tmp_path / "gpu")).returncode == 0
    node = (
        "complete",
        str(earlier),
        "--here",
        "--python",
        sys.executable,
        "--key",
        str(tmp_path / "gpu.key"),
        "-q",
    )
    no_config = {"XDG_CONFIG_HOME": str(tmp_path / "no-config")}
    unnamed = cli(*node, env=no_config)
    assert unnamed.returncode == 1 and "does not verify" in unnamed.stderr, unnamed.stderr
    other = (
        "--identity",
        local.identity("org/other"),
        "--issuer",
        local.issuer("github"),
        "--trusted-root",
        str(local.trusted_root),
    )
    refused = cli(*node, *other, env=no_config)
    assert refused.returncode == 1 and "not signed by https://github.com/org/other" in refused.stderr, (
        refused.stderr
    )
    done = cli(*node, *_who(local), "--trusted-root", str(local.trusted_root), env=no_config)
    assert done.returncode == 0, done.stdout + done.stderr
    (completion,) = [
        p.parent for p in (tmp_path / "ci" / "runs").glob("*/*/statement.json") if p.parent != earlier
    ]
    assert (completion / "completes" / "attestation.sigstore.json").read_bytes() == (
        earlier / sign.BUNDLE_FILE
    ).read_bytes()
    key = ("--key", str(tmp_path / "gpu.pub"))
    ok = _verify(local, completion, *key, *_who(local))
    assert ok.returncode == 0 and "link" in ok.stdout, ok.stdout + ok.stderr
    keyed_only = cli("verify", str(completion), *key, env=no_config)
    assert keyed_only.returncode == 1 and "the earlier attestation does not verify" in keyed_only.stdout, (
        keyed_only.stdout
    )
    shutil.move(earlier, tmp_path / "elsewhere")  # only the completion's copy is left
    ok = _verify(local, completion, *key, *_who(local))
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_a_hostile_link_never_breaks_a_keyless_verify(local: LocalSigstore, tmp_path: Path) -> None:
    """A statement read unverified for the keys of its chain (keyless) may say anything: a
    payload that is not JSON, or a link to a file whose sha256 it names but that is no envelope.
    Either is refused as not verifying (exit 1), named, never an error of imagegate's own."""
    key = keys.generate()
    _, pub = keys.write_keypair(tmp_path / "k", key, None)
    junk = b"not an envelope, but the bytes the link names"
    (tmp_path / "X").mkdir()
    (tmp_path / "X" / "attestation.dsse.json").write_bytes(junk)
    link = {"predicate": {"completes": {"attempt": "X", "envelopeSha256": hashlib.sha256(junk).hexdigest()}}}
    for name, payload in (("not-json", b"{not json"), ("linked", json.dumps(link).encode())):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "attestation.dsse.json").write_bytes(dsse.sign(payload, key).to_json())
        said = _verify(local, folder / "attestation.dsse.json", "--key", str(pub), *_who(local))
        assert said.returncode == 1 and "Traceback" not in said.stderr, (name, said.stdout + said.stderr)
