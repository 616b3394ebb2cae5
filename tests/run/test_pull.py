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
