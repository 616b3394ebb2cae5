"""Attestations as OCI 1.1 referrers, against the real registry the tests start (Debian's
docker-registry 2.8, which has no referrers API: the tag-schema fallback) and against the same
registry behind a referrers front (tests/attest/referrers_front.py, a stand-in named as such:
the API path). `verify --image` finds an attestation through a referrer alone and through the
`.att` tag alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from imagegate.attest import attach, keys
from imagegate.attest import statement as st
from tests.attest.conftest import cli
from tests.attest.referrers_front import referrers_front
from tests.attest.test_registry import _signed

pytestmark = pytest.mark.engine

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


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
    r = cli("attach", str(signed), image)
    assert r.returncode == 0, r.stdout + r.stderr
    fallback = "sha256-" + digest.partition(":")[2]
    assert f"listed by tag {fallback}" in r.stdout
    index = _get(registry, "attest/app", fallback, INDEX).json()
    (entry,) = [
        m for m in index["manifests"] if m["annotations"]["in-toto.io/predicate-type"] == st.PREDICATE_TYPE
    ]
    assert entry["artifactType"] == "application/vnd.dsse.envelope.v1+json"
    manifest: dict[str, Any] = _get(registry, "attest/app", entry["digest"], MANIFEST).json()
    assert manifest["subject"]["digest"] == digest and manifest["artifactType"] == entry["artifactType"]
    assert manifest["config"]["mediaType"] == "application/vnd.oci.empty.v1+json"
    assert manifest["annotations"] == {"in-toto.io/predicate-type": st.PREDICATE_TYPE}
    again = cli("attach", str(signed), image)
    assert again.returncode == 0 and "already a referrer" in again.stdout
    assert _get(registry, "attest/app", fallback, INDEX).json() == index  # listed once

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
        attach.attach(client, parsed, attach_envelope(signed))
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
        r = cli("attach", str(signed), via_front)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "listed by the referrers API" in r.stdout
        # no fallback tag was written where the registry keeps the index itself
        fallback = "sha256-" + digest.partition(":")[2]
        assert _get(registry, "attest/app", fallback, INDEX).status_code == 404
        _delete_tag(registry, "attest/app", attach.attestation_tag(digest))
        ok = cli("verify", "--image", via_front, "--key", str(pub), "--expect-verdict", "PASS")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "(the referrers API)" in ok.stdout
