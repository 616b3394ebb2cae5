"""An engine that will not pull an image whose registry copy is tampered: the
run reads that copy itself, and a copy that fails verification is a signed FAIL naming the layer
and its expected and actual digests, the same evidence as the rootfs driver's refusal (not an
input error and no attempt, as before). A crafted image of unique bytes, so that no engine holds
its layers already."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

from imagegate.attest import keys
from tests.helpers import DOCKER_SOCK, imagegate
from tests.oci.infra import skopeo, start_registry
from tests.rootfs.infra import Entry, layer_tar, write_layout


def test_a_tampered_registry_copy_the_engine_will_not_pull_is_a_signed_fail(
    engine: str, tmp_path: Path
) -> None:
    # Docker only: Podman will not pull from a plain-HTTP registry on 127.0.0.1 at all (its
    # refusal then is TLS, not the bytes, and stands as the input error it is).
    host = DOCKER_SOCK
    unique = os.urandom(16).hex().encode()
    layers = [layer_tar([Entry("a", data=unique)]), layer_tar([Entry("b", data=unique * 2)])]
    layout = write_layout(tmp_path / "layout", layers)
    registry = start_registry(tmp_path / "registry")
    priv, pub = keys.write_keypair(tmp_path / "keys" / "gate", keys.generate(), None)
    try:
        ref = f"{registry.host}/team/unique:1"
        skopeo("copy", "-q", "--dest-tls-verify=false", f"oci:{layout}", f"docker://{ref}")
        raw = skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{ref}")
        manifest = json.loads(raw)
        victim = manifest["layers"][1]["digest"]
        data = bytearray(registry.blob_file(victim).read_bytes())
        data[len(data) // 2] ^= 0x01
        registry.blob_file(victim).write_bytes(bytes(data))
        r = imagegate(
            "run", ref, "-p", "python", "--key", str(priv), "-o", str(tmp_path / "out"),
            env={"DOCKER_HOST": host},
        )  # fmt: skip
    finally:
        registry.stop()
        subprocess.run(["docker", "-H", host, "rmi", ref], capture_output=True)
    assert r.returncode == 1, r.stdout + r.stderr
    (attempt,) = [p.parent for p in (tmp_path / "out").glob("*/*/statement.json")]
    # A signed rejection: verify exits 1 on it, and 0 when asked to check that it is one.
    v = imagegate("verify", str(attempt / "attestation.dsse.json"), "--key", str(pub))
    assert v.returncode == 1 and "verified, but verdict FAIL is not accepted" in v.stdout, v.stdout + v.stderr
    v = imagegate(
        "verify", str(attempt / "attestation.dsse.json"), "--key", str(pub), "--expect-verdict", "FAIL"
    )
    assert v.returncode == 0 and "verified: verdict FAIL, as expected" in v.stdout, v.stdout + v.stderr
    statement = json.loads((attempt / "statement.json").read_text())
    stages = {s["id"]: s for s in statement["predicate"]["stages"]}
    pull = stages["pull"]
    assert pull["status"] == "FAIL" and pull["probe"] == "refusal"
    layer = pull["facts"]["layer"]
    assert layer["index"] == 1 and layer["status"] == "DIGEST_MISMATCH"
    assert layer["expected_digest"] == victim and layer["actual_digest"] not in (None, victim)
    assert {stages[s]["status"] for s in ("pip_check", "find_spec")} == {"SKIPPED"}
    # Named by the manifest the run read and hashed: the registry's.
    assert statement["subject"][0]["digest"] == {"sha256": hashlib.sha256(raw.encode()).hexdigest()}
