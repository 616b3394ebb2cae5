"""Attestations as OCI 1.1 referrers, against the real registry the tests start (Debian's
docker-registry 2.8, which has no referrers API: the tag-schema fallback) and against the same
registry behind a referrers front (tests/attest/referrers_front.py, a stand-in named as such:
the API path). The referrer is what cosign v3 writes (a Sigstore bundle, its artifact type and
annotations: attest/referrers.py cites the source) and sigstore-js verifies its bundle; the form
imagegate wrote before is still read and replaced, and another tool's artifacts are left alone.
`verify --image` finds an attestation through a referrer alone and through the `.att` tag alone."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from imagegate.attest import attach, bundle, dsse, keys, referrers, sign
from imagegate.attest import statement as st
from imagegate.oci.registry import RegistryClient
from tests.attest.conftest import cli, docker, one_file_image
from tests.attest.referrers_front import referrers_front
from tests.attest.test_registry import _signed
from tests.attest.test_sigstore_bundle import sigstore_js_verify

pytestmark = pytest.mark.engine

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
DSSE = "application/vnd.dsse.envelope.v1+json"
EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_DIGEST = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


def _digest(ref: str) -> str:
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        return attach.resolve(client, parsed).digests[0]


def _get(host: str, repo: str, ref: str, accept: str) -> httpx.Response:
    return httpx.get(f"http://{host}/v2/{repo}/manifests/{ref}", headers={"Accept": accept}, timeout=10)


def _delete_tag(host: str, repo: str, tag: str) -> None:
    """Delete the manifest a tag names (the registry then drops the tag too)."""
    got = _get(host, repo, tag, f"{INDEX}, {MANIFEST}")
    assert got.status_code == 200, got.text
    digest = got.headers["Docker-Content-Digest"]
    assert httpx.delete(f"http://{host}/v2/{repo}/manifests/{digest}", timeout=10).status_code == 202


def _keypair(tmp_path: Path) -> tuple[keys.SigningKey, Path]:
    key = keys.generate()
    _, pub = keys.write_keypair(tmp_path / "k", key, None)
    return key, pub


def test_the_registry_has_no_referrers_api_and_attach_keeps_the_fallback_tag(
    registry: str, image: str, tmp_path: Path
) -> None:
    digest = _digest(image)
    api = httpx.get(f"http://{registry}/v2/attest/app/referrers/{digest}", timeout=10)
    assert api.status_code == 404  # distribution 2.8: the API is not there
    key, pub = _keypair(tmp_path)
    signed = _signed(tmp_path, image, key, "PASS", "ref")
    r = cli("attach", str(signed), image, "--key", str(pub))
    assert r.returncode == 0, r.stdout + r.stderr
    fallback = "sha256-" + digest.partition(":")[2]
    assert f"listed by tag {fallback}" in r.stdout
    index = _get(registry, "attest/app", fallback, INDEX).json()
    (entry,) = [m for m in index["manifests"] if _is_cosign_entry(m, st.PREDICATE_TYPE)]
    raw = _get(registry, "attest/app", entry["digest"], MANIFEST).content
    manifest = _cosign_manifest(raw, _subject(registry, digest))
    assert manifest["annotations"] == entry["annotations"]
    # The bundle verifies, with the key that signed the attestation, by sigstore-js.
    (layer,) = manifest["layers"]
    blob = httpx.get(f"http://{registry}/v2/attest/app/blobs/{layer['digest']}", timeout=10).content
    assert bundle.envelope_of(json.loads(blob)) == attach_envelope(signed)
    (tmp_path / "referrer.sigstore.json").write_bytes(blob)
    js = sigstore_js_verify(tmp_path / "referrer.sigstore.json", pub)
    assert js.returncode == 0 and js.stdout.startswith("VERIFIED"), js.stdout + js.stderr
    again = cli("attach", str(signed), image, "--key", str(pub))
    assert again.returncode == 0 and "already a referrer" in again.stdout
    assert _get(registry, "attest/app", fallback, INDEX).json() == index  # listed once
    # Readers get each referrer's bundle material (a keyless one's certificate proves its signer
    # by it), and none for the bare .att layer.
    parsed = attach.parse_image(image)
    with attach.client_for(parsed) as client:
        found = referrers.fetch_all(client, attach.resolve(client, parsed))
    materials = [f.material for f in found if f.envelope == attach_envelope(signed)]
    assert sorted(materials, key=lambda m: m is None) == [json.loads(blob)["verificationMaterial"], None]

    # verify --image through the referrer alone: the .att tag removed
    _delete_tag(registry, "attest/app", attach.attestation_tag(digest))
    ok = cli("verify", "--image", image, "--key", str(pub), "--expect-verdict", "PASS")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"referrer {entry['digest']} (tag {fallback})" in ok.stdout
    # ... and through the .att tag alone: the referrer's index removed, the .att put back
    _delete_tag(registry, "attest/app", fallback)
    assert cli("verify", "--image", image, "--key", str(pub)).returncode == 1  # nothing left anywhere
    parsed = attach.parse_image(image)
    with attach.client_for(parsed) as client:
        attach.append(client, attach.resolve(client, parsed), attach_envelope(signed))
    ok = cli("verify", "--image", image, "--key", str(pub), "--expect-verdict", "PASS")
    assert ok.returncode == 0 and ".att layer 1" in ok.stdout, ok.stdout


def attach_envelope(path: Path) -> Any:
    from imagegate.attest.envelopes import read_envelopes

    (env,) = read_envelopes(path)
    return env


def test_a_registry_with_the_referrers_api_indexes_them_itself(
    registry: str, image: str, tmp_path: Path
) -> None:
    key, pub = _keypair(tmp_path)
    signed = _signed(tmp_path, image, key, "PASS", "api")
    with referrers_front(registry) as front:
        via_front = image.replace(registry, front)
        digest = _digest(via_front)
        r = cli("attach", str(signed), via_front, "--key", str(pub))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "listed by the referrers API" in r.stdout
        listed = httpx.get(f"http://{front}/v2/attest/app/referrers/{digest}", timeout=10).json()["manifests"]
        assert len([m for m in listed if _is_cosign_entry(m, st.PREDICATE_TYPE)]) == 1
        # no fallback tag was written where the registry keeps the index itself
        fallback = "sha256-" + digest.partition(":")[2]
        assert _get(registry, "attest/app", fallback, INDEX).status_code == 404
        _delete_tag(registry, "attest/app", attach.attestation_tag(digest))
        ok = cli("verify", "--image", via_front, "--key", str(pub), "--expect-verdict", "PASS")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "(the referrers API)" in ok.stdout


def _is_cosign_entry(entry: dict[str, Any], predicate_type: str) -> bool:
    """A referrers index entry as cosign v3 lists a bundle: its artifact type and annotations."""
    notes = entry.get("annotations") or {}
    return (
        entry["artifactType"] == BUNDLE
        and entry["mediaType"] == MANIFEST
        and notes.get("dev.sigstore.bundle.predicateType") == predicate_type
        and notes.get("dev.sigstore.bundle.content") == "dsse-envelope"
        and re.fullmatch(
            r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", notes.get("org.opencontainers.image.created", "")
        )
        is not None
    )


def _subject(host: str, digest: str) -> dict[str, Any]:
    """The image manifest's descriptor, as a HEAD of it tells cosign."""
    got = _get(host, "attest/app", digest, f"{MANIFEST}, {DOCKER_MANIFEST}")
    return {"mediaType": got.headers["Content-Type"], "size": len(got.content), "digest": digest}


def _cosign_manifest(raw: bytes, subject: dict[str, Any]) -> dict[str, Any]:
    """`raw` checked to be the manifest cosign v3 writes for a bundle (pkg/oci/remote/write.go,
    WriteReferrer): its fields in Go's order, compact."""
    manifest: dict[str, Any] = json.loads(raw)
    assert list(manifest) == [
        "schemaVersion",
        "mediaType",
        "config",
        "layers",
        "annotations",
        "subject",
        "artifactType",
    ]
    assert json.dumps(manifest, separators=(",", ":")).encode() == raw
    assert manifest["artifactType"] == BUNDLE and manifest["mediaType"] == MANIFEST
    assert manifest["config"] == {
        "mediaType": EMPTY,
        "size": 2,
        "digest": EMPTY_DIGEST,
        "artifactType": BUNDLE,
    }
    assert list(manifest["config"]) == ["mediaType", "size", "digest", "artifactType"]
    (layer,) = manifest["layers"]
    assert list(layer) == ["mediaType", "size", "digest"] and layer["mediaType"] == BUNDLE
    assert list(manifest["subject"]) == ["mediaType", "size", "digest"] and manifest["subject"] == subject
    assert list(manifest["annotations"]) == sorted(manifest["annotations"])
    return manifest


def _refer_by_hand(
    client: RegistryClient,
    host: str,
    subject: dict[str, Any],
    layer: bytes,
    layer_type: str,
    artifact_type: str,
    *,
    listed_for: str | None = None,
) -> str:
    """Push a referrer of `subject` as another writer would, and list it in the fallback index
    (the registry has no referrers API): imagegate's earlier form, or another tool's artifact.
    `listed_for`: the image digest whose index lists it, when not the subject's (anyone who can
    push can write an index)."""
    client.upload_blob("attest/app", b"{}")
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "artifactType": artifact_type,
        "config": {"mediaType": EMPTY, "digest": EMPTY_DIGEST, "size": 2},
        "layers": [
            {"mediaType": layer_type, "digest": client.upload_blob("attest/app", layer), "size": len(layer)}
        ],
        "subject": subject,
    }
    raw = json.dumps(manifest).encode()
    digest, _ = client.put_referrer("attest/app", raw, MANIFEST)
    tag = "sha256-" + (listed_for or subject["digest"]).partition(":")[2]
    got = _get(host, "attest/app", tag, INDEX)
    index: dict[str, Any] = {"schemaVersion": 2, "mediaType": INDEX, "manifests": []}
    if got.status_code == 200:
        index = got.json()
    index["manifests"].append(
        {"mediaType": MANIFEST, "digest": digest, "size": len(raw), "artifactType": artifact_type}
    )
    client.put_manifest("attest/app", tag, json.dumps(index).encode(), INDEX)
    return str(digest)


def test_the_earlier_form_is_read_and_replaced_and_other_artifacts_are_left(
    registry: str, image: str, tmp_path: Path
) -> None:
    key, pub = _keypair(tmp_path)
    digest = _digest(image)
    subject = _subject(registry, digest)
    failed = attach_envelope(_signed(tmp_path, image, key, "FAIL", "earlier"))
    provenance = dsse.sign(
        sign.serialize(
            {
                "_type": st.STATEMENT_TYPE,
                "subject": [{"name": image, "digest": {"sha256": digest.partition(":")[2]}}],
                "predicateType": "https://slsa.dev/provenance/v1",
                "predicate": {},
            }
        ),
        key,
    )
    signature = {  # what `cosign sign` refers: a bundle signing a blob, no attestation
        "mediaType": BUNDLE,
        "verificationMaterial": {"publicKey": {"hint": "x"}},
        "messageSignature": {
            "messageDigest": {"algorithm": "SHA2_256", "digest": base64.b64encode(b"d" * 32).decode()},
            "signature": base64.b64encode(b"s").decode(),
        },
    }
    parsed = attach.parse_image(image)
    with attach.client_for(parsed) as client:
        # imagegate's earlier form, then another tool's: a provenance bundle, a signature, an SBOM
        earlier = _refer_by_hand(client, registry, subject, failed.to_json(indent=None), DSSE, DSSE)
        others = [
            _refer_by_hand(
                client,
                registry,
                subject,
                json.dumps(bundle.to_bundle(provenance, key.public)).encode(),
                BUNDLE,
                BUNDLE,
            ),
            _refer_by_hand(client, registry, subject, json.dumps(signature).encode(), BUNDLE, BUNDLE),
            _refer_by_hand(
                client,
                registry,
                subject,
                b'{"spdxVersion":"SPDX-2.3"}',
                "application/spdx+json",
                "application/spdx+json",
            ),
        ]
    # The earlier form is read: no .att tag, only that referrer, and verify finds its FAIL.
    found = cli("verify", "--image", image, "--key", str(pub), "--expect-verdict", "FAIL")
    assert found.returncode == 0 and f"referrer {earlier}" in found.stdout, found.stdout + found.stderr

    passed = _signed(tmp_path, image, key, "PASS", "later")
    r = cli("attach", str(passed), image, "--key", str(pub))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"replaced referrer {earlier} (acceptance FAIL)" in r.stdout
    fallback = "sha256-" + digest.partition(":")[2]
    listed = _get(registry, "attest/app", fallback, INDEX).json()["manifests"]
    assert [m["digest"] for m in listed] == sorted(
        m["digest"] for m in listed
    )  # as go-containerregistry keeps it
    assert earlier not in [m["digest"] for m in listed]
    assert set(others) <= {m["digest"] for m in listed}  # another tool's: listed still, and there
    assert all(_get(registry, "attest/app", d, MANIFEST).status_code == 200 for d in others)
    (entry,) = [m for m in listed if _is_cosign_entry(m, st.PREDICATE_TYPE)]
    _cosign_manifest(_get(registry, "attest/app", entry["digest"], MANIFEST).content, subject)
    _delete_tag(registry, "attest/app", attach.attestation_tag(digest))  # the bundle alone, then
    ok = cli("verify", "--image", image, "--key", str(pub), "--expect-verdict", "PASS")
    assert ok.returncode == 0 and f"referrer {entry['digest']}" in ok.stdout, ok.stdout + ok.stderr


def test_a_referrer_whose_subject_is_another_image_is_skipped(registry: str, tmp_path: Path) -> None:
    """A manifest listed among an image's referrers whose subject is another image is not the
    image's: verify does not read it, though its bundle holds a statement about the image signed
    with the trusted key, and attach does not replace (delete) it."""
    key, pub = _keypair(tmp_path)
    with (
        one_file_image(f"{registry}/attest/app:skip", b"listed for this one\n") as mine,
        one_file_image(f"{registry}/attest/app:elsewhere", b"the subject named\n") as other,
    ):
        docker("push", mine)
        docker("push", other)
        digest = _digest(mine)
        signed = _signed(tmp_path, mine, key, "PASS", "skip")
        layer = json.dumps(bundle.to_bundle(attach_envelope(signed), key.public)).encode()
        parsed = attach.parse_image(mine)
        with attach.client_for(parsed) as client:
            stray = _refer_by_hand(
                client, registry, _subject(registry, _digest(other)), layer, BUNDLE, BUNDLE, listed_for=digest
            )
        r = cli("verify", "--image", mine, "--key", str(pub))
        assert r.returncode == 1, r.stdout + r.stderr
        assert "no attestation attached to" in r.stdout + r.stderr, r.stdout + r.stderr
        # the same bundle referring to this image is read: the subject is what skipped it
        with attach.client_for(parsed) as client:
            ours = _refer_by_hand(client, registry, _subject(registry, digest), layer, BUNDLE, BUNDLE)
        ok = cli("verify", "--image", mine, "--key", str(pub), "--expect-verdict", "PASS")
        assert ok.returncode == 0 and f"referrer {ours}" in ok.stdout, ok.stdout + ok.stderr
        # a later attestation replaces this image's referrer, and leaves the other image's
        r = cli("attach", str(_signed(tmp_path, mine, key, "PASS", "later")), mine, "--key", str(pub))
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"replaced referrer {ours}" in r.stdout and stray not in r.stdout, r.stdout
        assert _get(registry, "attest/app", stray, MANIFEST).status_code == 200


def test_a_referrer_is_read_only_as_one_layer_of_a_type_read_here(registry: str, tmp_path: Path) -> None:
    """Entries anyone may list among an image's referrers, each holding the image's statement
    signed with the trusted key: listed as another artifact type, a manifest with no layer (an
    artifact of annotations alone), one with two layers, one whose layer is of another media
    type, one about another subject, one deleted since. None is read as an attestation, and none
    stops verify from reading the one referrer listed after them all."""
    key, pub = _keypair(tmp_path)
    with one_file_image(f"{registry}/attest/app:odd", b"odd referrers\n") as mine:
        docker("push", mine)
        digest = _digest(mine)
        envelope = attach_envelope(_signed(tmp_path, mine, key, "PASS", "odd"))
        wrapped = json.dumps(bundle.to_bundle(envelope, key.public)).encode()
        parsed = attach.parse_image(mine)
        with attach.client_for(parsed) as client:
            client.upload_blob("attest/app", b"{}")
            held = {
                "mediaType": BUNDLE,
                "digest": client.upload_blob("attest/app", wrapped),
                "size": len(wrapped),
            }
            # the bundle as a layer of another media type, sorting before and after the DSSE one
            others = [{**held, "mediaType": t} for t in ("application/json", "application/vnd.in-toto+json")]
            here = _subject(registry, digest)
            elsewhere = [{**here, "digest": f"sha256:{c * 64}"} for c in "0f"]  # before and after it
            entries = []
            for listed_as, layers, subject in (
                # other artifact types, sorting before and after the ones read here
                ("application/vnd.example.other+json", [held], here),
                ("application/json", [held], here),
                (BUNDLE, [], here),
                (BUNDLE, [held, held], here),
                *((BUNDLE, [layer], here) for layer in others),
                *((BUNDLE, [held], there) for there in elsewhere),
                (BUNDLE, [held], {**here, "size": 1}),  # deleted once listed: the index names it still
                (BUNDLE, [held], {**here, "annotations": {"the": "one read"}}),  # after them all
            ):
                manifest = {
                    "schemaVersion": 2,
                    "mediaType": MANIFEST,
                    "artifactType": listed_as,
                    "config": {"mediaType": EMPTY, "digest": EMPTY_DIGEST, "size": 2},
                    "layers": layers,
                    "subject": subject,
                }
                raw = json.dumps(manifest).encode()
                pushed, _ = client.put_referrer("attest/app", raw, MANIFEST)
                entries.append(
                    {"mediaType": MANIFEST, "digest": pushed, "size": len(raw), "artifactType": listed_as}
                )
            index = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": entries}).encode()
            client.put_manifest("attest/app", "sha256-" + digest.partition(":")[2], index, INDEX)
            assert client.delete_manifest("attest/app", entries[-2]["digest"])
        # only the last is read: none of the others is, and none stops the reading
        r = cli("verify", "--image", mine, "--key", str(pub), "--expect-verdict", "PASS")
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
        read = re.findall(r"referrer (sha256:[0-9a-f]{64})", r.stdout)
        assert read == [entries[-1]["digest"]], r.stdout


def test_attach_of_an_envelope_no_bundle_names_the_key_of_is_refused(
    registry: str, image: str, tmp_path: Path
) -> None:
    key, pub = _keypair(tmp_path)
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(_signed(tmp_path, image, key, "PASS", "copied"), alone / "attestation.dsse.json")
    r = cli("attach", str(alone / "attestation.dsse.json"), image, "--key", str(pub))
    assert r.returncode == 3, r.stdout + r.stderr
    assert "no Sigstore bundle holds it" in r.stderr and "attach attestation.sigstore.json" in r.stderr
    assert "attached" not in r.stdout  # refused before anything was pushed
