"""`run --driver rootfs` on an image refused while unpacking (a tampered layer, a config that is
not the one expected, a hostile entry): a signed FAIL like any other outcome, whose evidence
names what was found, and whose subject is a digest of bytes read in the run. Crafted OCI
layouts on disk: no engine, no registry, a second each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from imagegate.attest import keys
from tests.helpers import Result, imagegate
from tests.rootfs.infra import Entry, layer_tar, write_layout

BASE = [Entry("etc", "dir", mode=0o755), Entry("etc/os-release", data=b"ID=crafted\n")]
APP = [Entry("app", "dir", mode=0o755), Entry("app/main.py", data=b"print('hello')\n")]

# A pipeline with a layers stage: it reports the unpack's own verification, with its table.
WITH_LAYERS = """\
apiVersion: imagegate/v1
kind: Pipeline
name: with-layers
version: "1"
stages:
  - id: pip_check
    probe: pip_check
    timeout: 1m
  - id: layers
    probe: layers
    timeout: 1m
"""


@pytest.fixture
def keypair(tmp_path: Path) -> tuple[Path, Path]:
    return keys.write_keypair(tmp_path / "keys" / "gate", keys.generate(), None)


def _sha(path: Path) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _blob(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / digest.split(":", 1)[1]


def _manifest(layout: Path) -> tuple[str, dict[str, Any]]:
    digest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    return digest, json.loads(_blob(layout, digest).read_text())


def _run(layout: Path, tmp_path: Path, key: Path, *args: str, pipeline: str = "python") -> Result:
    return imagegate(
        "run", f"oci:{layout}", "--driver", "rootfs", "-p", pipeline, "--key", str(key),
        "-o", str(tmp_path / "out"), *args,
        env={"XDG_CACHE_HOME": str(tmp_path / "cache"), "DOCKER_HOST": "unix:///nonexistent"},
    )  # fmt: skip


def _signed_attempt(tmp_path: Path, pub: Path) -> tuple[Path, dict[str, Any]]:
    """The one attempt, its envelope verified by `imagegate verify`; its statement."""
    (attempt,) = [p.parent for p in (tmp_path / "out").glob("*/*/statement.json")]
    # A signed rejection: verify exits 1 on it, and 0 when asked to check that it is one.
    v = imagegate("verify", str(attempt / "attestation.dsse.json"), "--key", str(pub))
    assert v.returncode == 1 and "verified, but verdict FAIL is not accepted" in v.stdout, v.stdout + v.stderr
    v = imagegate(
        "verify", str(attempt / "attestation.dsse.json"), "--key", str(pub), "--expect-verdict", "FAIL"
    )
    assert v.returncode == 0 and "verified: verdict FAIL, as expected" in v.stdout, v.stdout + v.stderr
    return attempt, json.loads((attempt / "statement.json").read_text())


def _stages(statement: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in statement["predicate"]["stages"]}


@pytest.mark.parametrize("pipeline", ["python", "with-layers"])
def test_a_tampered_layer_is_a_signed_fail_naming_the_layer(
    pipeline: str, tmp_path: Path, keypair: tuple[Path, Path]
) -> None:
    layout = write_layout(tmp_path / "layout", [layer_tar(BASE), layer_tar(APP)])
    manifest_digest, manifest = _manifest(layout)
    victim = manifest["layers"][1]["digest"]
    data = bytearray(_blob(layout, victim).read_bytes())
    data[len(data) // 2] ^= 0x01
    _blob(layout, victim).write_bytes(bytes(data))
    actual = _sha(_blob(layout, victim))
    if pipeline == "with-layers":
        (tmp_path / "p.yaml").write_text(WITH_LAYERS)
        pipeline = str(tmp_path / "p.yaml")
    r = _run(layout, tmp_path, keypair[0], pipeline=pipeline)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "layer 2/2" in r.stdout and victim in r.stdout and actual in r.stdout
    attempt, statement = _signed_attempt(tmp_path, keypair[1])
    assert statement["predicate"]["verdict"] == "FAIL"
    # The subject: the manifest that was read and hashed in this run.
    assert statement["subject"][0]["digest"] == {"sha256": manifest_digest.split(":")[1]}
    stages = _stages(statement)
    unpack = stages["unpack"]
    assert unpack["status"] == "FAIL" and unpack["token"] == "UNPACK_FAIL"
    layer = unpack["facts"]["layer"]
    assert layer["index"] == 1 and layer["status"] == "DIGEST_MISMATCH"
    assert (layer["expected_digest"], layer["actual_digest"]) == (victim, actual)
    assert unpack["facts"]["source"] == f"oci:{layout}" and unpack["facts"]["refused"] == "LayerRefused"
    assert [f["path"] for f in unpack["evidence"]] == ["unpack.json"]
    evidence = json.loads((attempt / "unpack.json").read_text())
    assert [x["status"] for x in evidence["verification"]["layers"]] == ["OK", "DIGEST_MISMATCH"]
    assert stages["pip_check"]["status"] == "SKIPPED"
    assert "the image was refused before it could run" in stages["pip_check"]["detail"]
    if "layers" in stages:  # the partial verification, as the docker driver's layers stage shows it
        assert stages["layers"]["status"] == "FAIL"
        assert "layer 2 DIGEST_MISMATCH" in stages["layers"]["detail"]
        table = json.loads((attempt / "stages/02-layers/layers.json").read_text())
        assert table["source_choice"]["kind"] == "driver" and table["ok"] is False


def test_a_config_that_is_not_the_expected_one_is_a_signed_fail(
    tmp_path: Path, keypair: tuple[Path, Path]
) -> None:
    layout = write_layout(tmp_path / "layout", [layer_tar(BASE)])
    manifest_digest, manifest = _manifest(layout)
    official = "sha256:" + "ab" * 32
    r = _run(layout, tmp_path, keypair[0], "--expect-config", official)
    assert r.returncode == 1, r.stdout + r.stderr
    _, statement = _signed_attempt(tmp_path, keypair[1])
    unpack = _stages(statement)["unpack"]
    assert unpack["status"] == "FAIL" and unpack["facts"]["refused"] == "ConfigRefused"
    config = unpack["facts"]["config"]
    assert config["official_digest"] == official
    assert config["actual_digest"] == manifest["config"]["digest"]
    assert statement["predicate"]["image"]["configDigest"] == manifest["config"]["digest"]
    assert statement["subject"][0]["digest"] == {"sha256": manifest_digest.split(":")[1]}


def test_a_hostile_entry_is_a_signed_fail_and_the_layers_stage_does_not_pass(
    tmp_path: Path, keypair: tuple[Path, Path]
) -> None:
    # A layer whose bytes are the declared ones, but which writes outside the root.
    hostile = [Entry("/etc/passwd-owned", data=b"owned\n")]
    layout = write_layout(tmp_path / "layout", [layer_tar(BASE), layer_tar(hostile), layer_tar(APP)])
    (tmp_path / "p.yaml").write_text(WITH_LAYERS)
    r = _run(layout, tmp_path, keypair[0], pipeline=str(tmp_path / "p.yaml"))
    assert r.returncode == 1, r.stdout + r.stderr
    _, statement = _signed_attempt(tmp_path, keypair[1])
    stages = _stages(statement)
    assert stages["unpack"]["facts"]["refused"] == "HostileLayer"
    assert stages["unpack"]["facts"]["entry"] == "/etc/passwd-owned"
    assert stages["unpack"]["facts"]["layer"]["index"] == 1
    # Every layer read verified, yet the layers stage says what stopped the unpack: never PASS.
    assert stages["layers"]["status"] == "FAIL", stages["layers"]
    assert "entry '/etc/passwd-owned' refused" in stages["layers"]["detail"]
    assert "layers 3-3 not read" in stages["layers"]["detail"]


def test_a_manifest_changed_in_the_layout_is_not_named_by_the_digest_it_claims(
    tmp_path: Path, keypair: tuple[Path, Path]
) -> None:
    layout = write_layout(tmp_path / "layout", [layer_tar(BASE), layer_tar(APP)])
    digest, manifest = _manifest(layout)
    manifest["layers"] = manifest["layers"][:1]  # edited in place: the index still names the old digest
    _blob(layout, digest).write_text(json.dumps(manifest))
    r = _run(layout, tmp_path, keypair[0])
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"the manifest {digest} hashes to" in r.stderr
    assert not list((tmp_path / "out").glob("*/*/attestation.dsse.json"))
