"""The subject is what ran: `run REGISTRY/app:1`, where the tag names a two-platform index, signs
the manifest of the platform that ran (linux/amd64), never the index, which admission would read
as an acceptance of the arm64 image too; the index digest is recorded in the predicate. With the
docker driver (the engine lists only the index digest), Podman through its Docker API (it
lists both) and the rootfs driver."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from imagegate._support import resources
from tests.helpers import imagegate
from tests.oci.infra import TwoPlatforms, push_two_platforms, start_registry

pytestmark = pytest.mark.engine
SCHEMA = json.loads((resources.manifests_dir() / "acceptance-v1.schema.json").read_text())


@pytest.fixture(scope="module")
def two(images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoPlatforms]:
    """The index, in a registry of this module's own."""
    registry = start_registry(tmp_path_factory.mktemp("platform-registry"))
    try:
        yield push_two_platforms(registry, images["python"], "team/multi")
    finally:
        registry.stop()


@pytest.fixture
def key(tmp_path: Path) -> Path:
    key = tmp_path / "keys" / "gate"
    assert imagegate("keygen", "--out", str(key)).returncode == 0
    return key


def _signed_for_amd64(statement: dict[str, Any], two: TwoPlatforms, out: Path, key: Path) -> None:
    """The statement's subject is the amd64 manifest, the index is in the predicate only, and
    `verify` accepts the envelope for the amd64 manifest, not for the arm64 one."""
    jsonschema.validate(statement, SCHEMA)
    repository = two.ref.rpartition(":")[0]
    assert statement["subject"] == [
        {"name": repository, "digest": {"sha256": two.amd64_digest.split(":")[1]}}
    ]
    image = statement["predicate"]["image"]
    assert image["subjectDigest"] == "manifest"
    assert image["manifestDigest"] == two.amd64_digest
    assert image["indexDigest"] == two.index_digest
    assert image["configDigest"] == two.config_digest
    assert "subjectNote" not in image
    (envelope,) = out.glob("sha256-*/*/attestation.dsse.json")
    pub = f"{key}.pub"
    ok = imagegate("verify", str(envelope), "--key", pub, "--image", f"{repository}@{two.amd64_digest}")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok      subject" in ok.stdout
    for other in (two.arm64_digest, two.index_digest):
        no = imagegate("verify", str(envelope), "--key", pub, "--image", f"{repository}@{other}")
        assert no.returncode == 1, no.stdout + no.stderr
        assert "FAILED  subject" in no.stdout


def _run(ref: str, out: Path, key: Path, *extra: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    r = imagegate(
        "run", ref, "-p", "python", "-o", str(out), "--key", f"{key}.key", "--format", "json", *extra, env=env
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    statement: dict[str, Any] = r.json()
    return statement


def test_the_docker_driver_signs_the_amd64_manifest_of_an_index(
    two: TwoPlatforms, images: dict[str, str], key: Path, tmp_path: Path
) -> None:
    """Docker pulls through the index and lists only the index digest in RepoDigests: the
    driver reads the index and signs the entry whose config is the image ID it ran."""
    out = tmp_path / "out"
    subprocess.run(["docker", "rmi", two.ref], capture_output=True)  # pulled now, through the index
    try:
        statement = _run(two.ref, out, key, "--attach")
        repository = two.ref.rpartition(":")[0]
        # the shared test image may be pushed elsewhere by other tests: theirs are listed beside
        assert f"{repository}@{two.index_digest}" in statement["predicate"]["image"]["repoDigests"]
        _signed_for_amd64(statement, two, out, key)
        # attached to the manifest that ran, where `verify --image` finds it
        pinned = f"{repository}@{two.amd64_digest}"
        found = imagegate("verify", "--image", pinned, "--key", f"{key}.pub", "--expect-verdict", "PASS")
        assert found.returncode == 0, found.stdout + found.stderr
        # the tag names the index: nothing is attached there, and verify says where to look
        by_tag = imagegate("verify", "--image", two.ref, "--key", f"{key}.pub")
        assert by_tag.returncode == 1, by_tag.stdout + by_tag.stderr
        assert "names an index, and a run attests the platform manifest that ran" in by_tag.stdout
        assert f"linux/amd64 {two.amd64_digest}" in by_tag.stdout, by_tag.stdout
        # a local name of the image: the engine knows it by the index; verify finds the manifest
        (envelope,) = out.glob("sha256-*/*/attestation.dsse.json")
        local = imagegate("verify", str(envelope), "--key", f"{key}.pub", "--image", images["python"])
        assert local.returncode == 0, local.stdout + local.stderr
    finally:
        subprocess.run(["docker", "rmi", two.ref], capture_output=True)


def test_podman_lists_both_digests_and_the_amd64_manifest_is_signed(
    podman: str, two: TwoPlatforms, key: Path, tmp_path: Path
) -> None:
    pull = ["podman", "pull", "-q", "--tls-verify=false", two.ref]
    subprocess.run(pull, check=True, capture_output=True)
    try:
        statement = _run(two.ref, tmp_path / "out", key, "--pull", "never", env={"DOCKER_HOST": podman})
        repository = two.ref.rpartition(":")[0]
        listed = statement["predicate"]["image"]["repoDigests"]
        assert f"{repository}@{two.index_digest}" in listed  # what Podman reports beside the manifest
        _signed_for_amd64(statement, two, tmp_path / "out", key)
    finally:
        subprocess.run(["podman", "rmi", two.ref], capture_output=True)


def test_the_rootfs_driver_signs_the_amd64_manifest_of_an_index(
    two: TwoPlatforms, key: Path, tmp_path: Path
) -> None:
    env = {"DOCKER_HOST": "unix:///nonexistent", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    statement = _run(f"docker://{two.ref}", tmp_path / "out", key, "--driver", "rootfs", env=env)
    _signed_for_amd64(statement, two, tmp_path / "out", key)


def test_an_index_whose_registry_is_gone_is_never_the_subject(
    images: dict[str, str], key: Path, tmp_path: Path
) -> None:
    """Pulled through an index, run when its registry is out of reach: which manifest ran cannot
    be shown, so the subject is the config digest (the image ID), and the predicate says why."""
    gone = start_registry(tmp_path / "registry")
    try:
        two = push_two_platforms(gone, images["python"], "team/gone")
        subprocess.run(["docker", "pull", "-q", two.ref], check=True, capture_output=True)
    finally:
        gone.stop()
    try:
        statement = _run(two.ref, tmp_path / "out", key, "--pull", "never")
    finally:
        subprocess.run(["docker", "rmi", two.ref], capture_output=True)
    jsonschema.validate(statement, SCHEMA)
    image = statement["predicate"]["image"]
    assert statement["subject"][0]["digest"] == {"sha256": two.config_digest.split(":")[1]}
    assert image["subjectDigest"] == "config" and image["manifestDigest"] is None
    assert f"{two.ref.rpartition(':')[0]}@{two.index_digest}" in image["repoDigests"]  # others': beside
    assert "could not be read" in image["subjectNote"], image["subjectNote"]
