"""`run --pull`: an image only in a registry is pulled through the engine, as `docker run` does,
and a pushed image's attestation subject is its repository and manifest digest."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import imagegate
from tests.oci.infra import Registry, start_registry

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("pull-registry"))
    yield reg
    reg.stop()


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True).stdout


def test_missing_image_is_pulled_and_the_subject_is_the_manifest_digest(
    images: dict[str, str], registry: Registry, tmp_path: Path
) -> None:
    ref = f"{registry.host}/imagegate/python:1"
    _docker("tag", images["python"], ref)
    _docker("push", "-q", ref)
    _docker("rmi", ref)
    r = imagegate("run", ref, "-p", "python", "-o", str(tmp_path), "--format", "json")
    try:
        assert r.returncode == 0, r.stderr
        statement = r.json()
        digest = statement["predicate"]["image"]["manifestDigest"]
        assert digest and digest.startswith("sha256:")
        assert statement["subject"] == [
            {"name": f"{registry.host}/imagegate/python", "digest": {"sha256": digest.split(":")[1]}}
        ]
        assert statement["predicate"]["image"]["subjectDigest"] == "manifest"
        repo_digests = json.loads(_docker("image", "inspect", ref, "-f", "{{json .RepoDigests}}"))
        assert f"{registry.host}/imagegate/python@{digest}" in repo_digests
    finally:
        subprocess.run(["docker", "rmi", ref], capture_output=True)


def test_a_reference_with_a_tag_and_a_digest_is_pulled_by_its_digest(
    images: dict[str, str], registry: Registry, tmp_path: Path
) -> None:
    """`repo:tag@sha256:...`, as CI pins images: the digest decides, the tag is only a label."""
    tagged = f"{registry.host}/imagegate/pinned:1"
    _docker("tag", images["python"], tagged)
    _docker("push", "-q", tagged)
    digest = json.loads(_docker("image", "inspect", tagged, "-f", "{{json .RepoDigests}}"))[0].split("@")[1]
    _docker("rmi", tagged)
    ref = f"{tagged}@{digest}"
    try:
        r = imagegate(
            "run",
            ref,
            "-p",
            "python",
            "-o",
            str(tmp_path),
            "--format",
            "json",
            "--no-sign",
            "--pull",
            "always",
        )
        assert r.returncode == 0, r.stderr
        assert r.json()["predicate"]["image"]["manifestDigest"] == digest
    finally:
        subprocess.run(["docker", "rmi", f"{registry.host}/imagegate/pinned@{digest}"], capture_output=True)


def test_pull_never_and_a_missing_repository_are_usage_errors(registry: Registry, tmp_path: Path) -> None:
    ref = f"{registry.host}/imagegate/absent:1"
    r = imagegate("run", ref, "-o", str(tmp_path), "--pull", "never")
    assert r.returncode == 3
    assert f"image {ref}: not found in the docker engine" in r.stderr
    r = imagegate("run", ref, "-o", str(tmp_path))
    assert r.returncode == 3
    assert f"image {ref}: not found in the docker engine, and pulling it failed:" in r.stderr
    assert "Traceback" not in r.stderr
    assert not list(tmp_path.glob("*/*"))  # nothing ran, nothing recorded


def test_pull_always_runs_what_the_registry_holds(
    images: dict[str, str], registry: Registry, tmp_path: Path
) -> None:
    """The engine's copy under the same name is stale: `missing` runs it, `always` pulls first."""
    ref = f"{registry.host}/imagegate/moving:1"
    try:
        _docker("tag", images["python"], ref)
        _docker("push", "-q", ref)
        _docker("tag", images["conflict"], ref)  # the engine now holds another image under that name
        pushed = _docker("image", "inspect", images["python"], "-f", "{{.Id}}").strip()
        stale = _docker("image", "inspect", images["conflict"], "-f", "{{.Id}}").strip()

        def config_of(*extra: str, expect: int) -> str:
            r = imagegate(
                "run", ref, "-p", "python", "-o", str(tmp_path), "--format", "json", "--no-sign", *extra
            )
            assert r.returncode == expect, r.stderr
            return str(r.json()["predicate"]["image"]["configDigest"])

        # missing (the default): the engine's own copy, the conflict image, whose pip check FAILs
        assert config_of(expect=1) == stale
        assert config_of("--pull", "always", expect=0) == pushed  # the python image: PASS
        assert _docker("image", "inspect", ref, "-f", "{{.Id}}").strip() == pushed  # as docker pull leaves it
    finally:
        subprocess.run(["docker", "rmi", ref], capture_output=True)


def test_run_attach_pushes_an_attestation_that_verify_finds(
    images: dict[str, str], registry: Registry, tmp_path: Path
) -> None:
    ref = f"{registry.host}/imagegate/attached:1"
    key = tmp_path / "keys" / "gate"
    assert imagegate("keygen", "--out", str(key)).returncode == 0
    try:
        _docker("tag", images["python"], ref)
        _docker("push", "-q", ref)
        r = imagegate(
            "run",
            ref,
            "-p",
            "python",
            "-m",
            "json",
            "-o",
            str(tmp_path / "o"),
            "--key",
            f"{key}.key",
            "--attach",
        )
        assert r.returncode == 0, r.stdout + r.stderr
        v = imagegate("verify", "--image", ref, "--key", f"{key}.pub", "--expect-verdict", "PASS")
        assert v.returncode == 0, v.stdout + v.stderr
        assert "ok      subject" in v.stdout
        # the standard statements admission policies read are attached beside it, both ways
        assert "3 attestation(s); referrers via tag sha256-" in r.stderr + r.stdout
        for predicate_type in (
            "https://slsa.dev/verification_summary/v1",
            "https://in-toto.io/attestation/test-result/v0.1",
        ):
            v = imagegate("verify", "--image", ref, "--key", f"{key}.pub", "--type", predicate_type)
            assert v.returncode == 0, v.stdout + v.stderr
        wrong = imagegate("verify", "--image", ref, "--key", f"{key}.pub", "--expect-verdict", "FAIL")
        assert wrong.returncode == 1 and "FAILED  verdict" in wrong.stdout
    finally:
        subprocess.run(["docker", "rmi", ref], capture_output=True)
