"""Attach and fetch against a real registry (Debian's docker-registry on 127.0.0.1, no auth),
with an image pushed by the real Docker engine: the `.att` layout cosign reads, another
pipeline's attestation preserved, `verify --image` from the registry."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from imagegate.attest import attach, keys, sign
from imagegate.attest import statement as st
from imagegate.attest.vsa import TEST_RESULT_PREDICATE_TYPE, VSA_PREDICATE_TYPE
from imagegate.domain.results import EvidenceFile, ImageFacts, RunRecord, StageResult, Status
from tests.attest.conftest import cli, docker, pub_of, said_now

pytestmark = pytest.mark.engine


def _signed(
    tmp_path: Path,
    ref: str,
    key: keys.SigningKey,
    verdict: str,
    name: str,
    *,
    pushed: bool = True,
    pipeline: str = "python",
    source: str | None = None,
    said: tuple[str, str] | None = None,
) -> Path:
    """An attestation of `ref` by `pipeline` (its VSA and test-result beside it, `source` the
    pipeline's source, default `builtin:<pipeline>`); `pushed=False`: made before the push, its
    subject the config digest. Said (`said`: startedOn, finishedOn) after every one made before."""
    started, finished = said or said_now()
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        remote = attach.resolve(client, parsed)
    rec = RunRecord(
        attempt_id=name,
        attempt_dir=str(tmp_path / name),
        pipeline={
            "name": pipeline,
            "version": "1",
            "sha256": "a" * 64,
            "source": source or f"builtin:{pipeline}",
        },
        plan={"apiVersion": "imagegate/v1", "pipeline": {}, "stages": []},
        image=ImageFacts(
            reference=ref,
            config_digest=remote.digests[1],
            manifest_digest=remote.digests[0] if pushed else None,
            repository=f"{parsed.registry}/{parsed.repository}",
        ),
        environment={"driver": "docker", "engine": "docker", "gpu": {"present": False}},
        stages=[
            StageResult(
                "pip_check",
                "pip_check",
                "inside",
                Status(verdict),
                "x",
                0.1,
                evidence=[EvidenceFile("a", "0" * 64, 0)],
            )
        ],
        started_at=started,
        finished_at=finished,
        verdict=verdict,
        imagegate_version="0.1.0",
    )
    (tmp_path / name).mkdir()
    return sign.sign_attempt(tmp_path / name, st.build_statement(rec), key).dsse_path


def _att(registry: str, ref: str) -> tuple[str, dict[str, Any]]:
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        remote = attach.resolve(client, parsed)
        tag = attach.attestation_tag(remote.digests[0])
        got = client.get_manifest(parsed.repository, tag)
    return tag, json.loads(got.raw)


def test_attach_adds_like_cosign_and_verify_fetches(registry: str, image: str, tmp_path: Path) -> None:
    key = keys.generate()
    pub = tmp_path / "k.pub"
    pub.write_bytes(key.public.pem)
    first = _signed(tmp_path, image, key, "PASS", "one")

    r = cli("attach", str(first), image, "--key", str(pub))
    assert r.returncode == 0, r.stderr
    tag, m1 = _att(registry, image)
    assert tag.startswith("sha256-") and tag.endswith(".att") and tag in r.stdout
    assert m1["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert m1["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    # The acceptance, and the VSA and test-result signed beside it in the attempt folder.
    layer, *standard = m1["layers"]
    assert [x["annotations"]["predicateType"] for x in standard] == [
        VSA_PREDICATE_TYPE,
        TEST_RESULT_PREDICATE_TYPE,
    ]
    assert layer["mediaType"] == "application/vnd.dsse.envelope.v1+json"
    assert layer["annotations"] == {
        "dev.cosignproject.cosign/signature": "",
        "predicateType": st.PREDICATE_TYPE,
        "in-toto.io/predicate-type": st.PREDICATE_TYPE,
    }

    # Another pipeline's attestation is added; the earlier layers are kept as they were.
    second = _signed(tmp_path, image, key, "FAIL", "two", pipeline="other")
    r = cli("attach", str(second.parent / sign.BUNDLE_FILE), image, "--key", str(pub))
    assert r.returncode == 0, r.stderr
    _, m2 = _att(registry, image)
    assert len(m2["layers"]) == 6 and m2["layers"][:3] == m1["layers"]
    # Attaching the same envelopes again changes nothing.
    r = cli("attach", str(first), image, "--key", str(pub))
    assert r.returncode == 0 and r.stdout.count("already attached") == 3
    assert _att(registry, image)[1] == m2

    # Every pipeline's statements are read, as the shipped ClusterPolicy reads them: the other
    # pipeline's FAIL decides, unless one pipeline is asked for.
    ok = cli("verify", "--image", image, "--key", str(pub), "--expect-verdict", "PASS")
    assert ok.returncode == 1 and "FAIL of pipeline builtin:other" in ok.stdout, ok.stdout + ok.stderr
    ok = cli(
        "verify", "--image", image, "--key", str(pub), "--expect-verdict", "PASS", "--pipeline", "python"
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok      subject" in ok.stdout and "layer 1" in ok.stdout
    failed = cli("verify", "--image", image, "--key", str(pub), "--expect-verdict", "FAIL")
    assert failed.returncode == 0 and "layer 4" in failed.stdout  # the other pipeline's matches
    neither = cli("verify", "--image", image, "--key", str(pub), "--expect-verdict", "ERROR")
    assert neither.returncode == 1 and "FAILED  verdict" in neither.stdout

    _, other = keys.write_keypair(tmp_path / "other", keys.generate(), None)
    wrong = cli("verify", "--image", image, "--key", str(other))
    assert wrong.returncode == 1 and "no signature verifies with key" in wrong.stdout

    # The attestation file checked against the image in the registry.
    r = cli("verify", str(first), "--key", str(pub), "--image", image, "--signature-only")
    assert r.returncode == 0 and "ok      subject" in r.stdout


def test_attach_refuses_an_attestation_of_another_image(registry: str, image: str, tmp_path: Path) -> None:
    key = keys.generate()
    pub = pub_of(key, tmp_path)
    signed = _signed(tmp_path, image, key, "PASS", "x")
    # Push a different image and try to attach the first image's attestation to it.
    other = f"{registry}/attest/app:other"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("empty"), io.BytesIO(b""))
    docker("import", "-", other, stdin=buf.getvalue())
    try:
        docker("push", other)
        r = cli("attach", str(signed), other, "--key", str(pub))
        assert r.returncode == 3 and "is not" in r.stderr and "attestation subject" in r.stderr
        v = cli("verify", str(signed), "--key", "/dev/null", "--image", other)
        assert v.returncode == 3  # the key is unreadable as a public key: a usage error, not a verdict
    finally:
        subprocess.run(["docker", "rmi", "-f", other], capture_output=True)


def test_verify_image_without_attestations(registry: str, image: str, tmp_path: Path) -> None:
    bare = f"{registry}/attest/bare:1"
    docker("tag", image, bare)
    try:
        docker("push", bare)
        _, pub = keys.write_keypair(tmp_path / "k", keys.generate(), None)
        r = cli("verify", "--image", bare, "--key", str(pub))
        assert r.returncode == 1 and "no attestation attached" in r.stdout
    finally:
        subprocess.run(["docker", "rmi", "-f", bare], capture_output=True)


def test_attach_and_verify_image_agree_on_the_subject(registry: str, image: str, tmp_path: Path) -> None:
    """A statement naming only the config digest (made before the push): the registry's readers
    match the subject with the manifest digest, so `attach` refuses it and `verify --image` does
    not pass it either; the manifest-digest statement passes both."""
    key = keys.generate()
    _, pub = keys.write_keypair(tmp_path / "k", key, None)
    early = _signed(tmp_path, image, key, "PASS", "early", pushed=False)
    v = cli("verify", str(early), "--key", str(pub), "--image", image, "--no-evidence")
    a = cli("attach", str(early), image, "--key", str(pub))
    assert v.returncode == 1 and "FAILED  subject" in v.stdout, v.stdout + v.stderr
    assert a.returncode == 3 and "attestation subject" in a.stderr
    late = _signed(tmp_path, image, key, "PASS", "late")
    v = cli("verify", str(late), "--key", str(pub), "--image", image, "--no-evidence")
    assert v.returncode == 0, v.stdout + v.stderr
    a = cli("attach", str(late), image, "--key", str(pub))
    assert a.returncode == 0 and "attestation subject" not in a.stderr, a.stdout + a.stderr
