"""A registry that lists more attestations than anyone attaches, or more bytes of them, or an
envelope nested past any parser's stack: `verify --image` reads a bounded number and size for
one image, in listing order, and past a bound fails closed (exit 1, the bound named, nothing
verified: a signed PASS among the flood never passes), in bounded memory, without a traceback.
A real registry on 127.0.0.1; the flood is pushed with imagegate's own registry client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagegate.attest import attach, keys
from imagegate.attest.attach import MAX_ATTESTATION_BYTES_READ, MAX_ATTESTATIONS
from imagegate.attest.referrers import BUNDLE_TYPES, fallback_tag
from imagegate.domain.digest import digest_of
from tests.attest.conftest import docker, start_registry
from tests.attest.test_registry import _signed
from tests.oci.test_hostile_answers import MAX_RSS_KIB, imagegate

pytestmark = pytest.mark.engine

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY = b"{}"


@pytest.fixture
def flooded(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """A fresh registry and image with a signed PASS attached: (image, the public key, tmp)."""
    (tmp_path / "registry").mkdir()
    with start_registry(tmp_path / "registry") as host:
        ref = f"{host}/flood/app:1"
        docker("import", "-", ref, stdin=_tar())
        docker("push", ref)
        key = keys.generate()
        (tmp_path / "k.pub").write_bytes(key.public.pem)
        passed = _signed(tmp_path, ref, key, "PASS", "ok")
        done = imagegate("attach", str(passed), ref, "--key", str(tmp_path / "k.pub"), timeout=120)
        assert done.rc == 0, done.stderr
        yield ref, tmp_path / "k.pub", tmp_path
        docker("rmi", "-f", ref)


def _tar() -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("flood.txt")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"flood\n"))
    return buf.getvalue()


def _att_layers(ref: str, blobs: list[bytes]) -> int:
    """The image's `.att` tag, rewritten with one DSSE layer per blob after the ones it has: how
    many it lists then."""
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        remote = attach.resolve(client, parsed)
        repo, tag = parsed.repository, attach.attestation_tag(remote.digests[0])
        doc = json.loads(client.get_manifest(repo, tag).raw)
        for blob in blobs:
            client.upload_blob(repo, blob)
            doc["layers"].append(
                {"mediaType": attach.DSSE_LAYER_MEDIA_TYPE, "size": len(blob), "digest": digest_of(blob)}
            )
        client.put_manifest(repo, tag, json.dumps(doc).encode(), doc.get("mediaType") or OCI_MANIFEST)
    return len(doc["layers"])


def _assert_refused(ran_rc: int, stderr: str, rss_kib: int, *words: str) -> None:
    assert ran_rc == 1, stderr[-2000:]
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr[-2000:]
    errors = [line for line in stderr.splitlines() if line.startswith("imagegate: error:")]
    assert len(errors) == 1, stderr[-2000:]
    assert "nothing verified" in errors[0], errors[0]
    for word in words:
        assert word in errors[0], errors[0]
    assert rss_kib <= MAX_RSS_KIB, f"peak RSS {rss_kib >> 10} MiB"


def test_a_tag_listing_more_attestations_than_read_fails_closed(flooded: tuple[str, Path, Path]) -> None:
    ref, pub, _ = flooded
    assert imagegate("verify", "--image", ref, "--key", str(pub), timeout=120).rc == 0  # the PASS alone
    listed = _att_layers(ref, [b'{"n": %d}' % n for n in range(MAX_ATTESTATIONS)])
    ran = imagegate("verify", "--image", ref, "--key", str(pub), timeout=120)
    _assert_refused(
        ran.rc, ran.stderr, ran.rss_kib, f"lists {listed} attestations, more than the {MAX_ATTESTATIONS}"
    )


def test_referrers_listing_more_than_read_fails_closed(flooded: tuple[str, Path, Path]) -> None:
    ref, pub, _ = flooded
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        remote = attach.resolve(client, parsed)
        repo, tag = parsed.repository, fallback_tag(remote.digests[0])
        index = json.loads(client.get_manifest(repo, tag, accept=(OCI_INDEX,)).raw)
        client.upload_blob(repo, EMPTY)
        bundle_type = BUNDLE_TYPES + ".v0.3+json"
        # Real manifests (the registry checks an index's entries exist), each a bundle type's.
        for n in range(MAX_ATTESTATIONS):
            raw = json.dumps(
                {
                    "schemaVersion": 2,
                    "mediaType": OCI_MANIFEST,
                    "artifactType": bundle_type,
                    "config": {
                        "mediaType": "application/vnd.oci.empty.v1+json",
                        "digest": digest_of(EMPTY),
                        "size": 2,
                    },
                    "layers": [{"mediaType": bundle_type, "digest": digest_of(EMPTY), "size": 2}],
                    "annotations": {"n": str(n)},
                }
            ).encode()
            digest = client.put_manifest(repo, digest_of(raw), raw, OCI_MANIFEST)
            index["manifests"].append(
                {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw), "artifactType": bundle_type}
            )
        client.put_manifest(repo, tag, json.dumps(index).encode(), OCI_INDEX)
    ran = imagegate("verify", "--image", ref, "--key", str(pub), timeout=120)
    _assert_refused(ran.rc, ran.stderr, ran.rss_kib, "the referrers", str(MAX_ATTESTATIONS))


def test_more_bytes_of_attestations_than_read_fails_closed_in_bounded_memory(
    flooded: tuple[str, Path, Path],
) -> None:
    ref, pub, _ = flooded
    # Each under the per-envelope cap (16 MiB), together past the image's: valid JSON, so each
    # is parsed before it is found to be no envelope.
    size = 15 << 20
    count = MAX_ATTESTATION_BYTES_READ // size + 1
    _att_layers(ref, [b'"' + bytes([97 + n]) * size + b'"' for n in range(count)])
    ran = imagegate("verify", "--image", ref, "--key", str(pub), timeout=300)
    _assert_refused(ran.rc, ran.stderr, ran.rss_kib, f"more than {MAX_ATTESTATION_BYTES_READ >> 20} MiB")


def test_an_envelope_nested_past_the_parser_s_stack_is_no_envelope(
    flooded: tuple[str, Path, Path], tmp_path: Path
) -> None:
    ref, pub, _ = flooded
    deep = b"[" * 200_000 + b"]" * 200_000
    _att_layers(ref, [deep])
    ran = imagegate("verify", "--image", ref, "--key", str(pub), timeout=120)
    assert ran.rc == 0, ran.stderr[-2000:]  # read, found to be no envelope, passed over: the PASS stands
    assert "Traceback" not in ran.stderr and "RecursionError" not in ran.stderr
    # The same as a local file: a usage error (exit 3), one line, no traceback.
    (tmp_path / "deep.dsse.json").write_bytes(deep)
    local = imagegate("verify", str(tmp_path / "deep.dsse.json"), "--key", str(pub), timeout=60)
    assert local.rc == 3 and "Traceback" not in local.stderr, local.stderr[-2000:]
    assert "nested more than" in local.stderr
