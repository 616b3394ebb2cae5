"""`compare OFFICIAL MIRROR --attest KEY`: the same content in a recompressed mirror signed as
one statement naming both manifests; an acceptance of the official image (signed by the real
runner) carried over, so that the shipped admission policies admit the mirror by its own digest
without re-running the probes; nothing signed for a different or a corrupt mirror."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from imagegate.attest import keys, sign
from imagegate.oci.registry import RegistryClient
from tests.helpers import imagegate
from tests.oci.conftest import Pushed
from tests.oci.infra import Registry
from tests.oci.moving_tag_front import moving_tag_front
from tests.oci.test_compare import push_tampered
from tests.policies import admission
from tests.policies.admission import not_before, pod

LAYERS_ONLY = "apiVersion: imagegate/v1\nname: layers-only\nstages:\n  - id: layers\n    probe: layers\n"


def _payload(path: Path) -> dict[str, Any]:
    return json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def gate_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return keys.write_keypair(tmp_path_factory.mktemp("mirror-keys") / "gate", keys.generate(), None)


@pytest.fixture(scope="module")
def acceptance(pushed: Pushed, gate_key: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The official image accepted by the real runner (its layers verified), signed."""
    tmp = tmp_path_factory.mktemp("official-run")
    pipe = tmp / "layers-only.yaml"
    pipe.write_text(LAYERS_ONLY)
    r = imagegate("run", pushed.ref, "-p", str(pipe), "-o", str(tmp / "out"), "--key", str(gate_key[0]), "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    (attempt,) = [p.parent for p in (tmp / "out").glob("*/*/statement.json")]
    return attempt / sign.DSSE_FILE


def test_a_recompressed_mirror_is_admitted_through_the_equivalence(
    pushed: Pushed, recompressed: str, acceptance: Path, gate_key: tuple[Path, Path], tmp_path: Path
) -> None:
    key, pub = gate_key
    out = tmp_path / "eq"
    r = imagegate(
        "compare", pushed.ref, recompressed, "--attest", str(key), "-o", str(out), "--carry", str(acceptance)
    )
    assert r.returncode == 0, r.stdout + r.stderr
    official = _payload(acceptance)["subject"][0]["digest"]
    eq = _payload(out / "mirror.dsse.json")
    assert eq["predicateType"] == "https://imagegate.dev/attestations/mirror/v1"
    assert eq["subject"][0]["digest"] == official and eq["subject"][1]["digest"] != official
    p = eq["predicate"]
    assert p["verdict"] == "SAME_CONTENT" and p["configDigest"] == pushed.config_digest
    assert p["compressedDigestsDiffer"] == [0, 1, 2] and len(p["diffIds"]) == 3

    vsa = _payload(out / sign.VSA_FILE)
    assert vsa["subject"] == [eq["subject"][1]]
    assert vsa["predicate"]["verifiedLevels"] == ["IMAGEGATE_CPU"]  # the pipeline has no GPU stage
    assert [i["digest"]["sha256"] for i in vsa["predicate"]["inputAttestations"]] == [
        hashlib.sha256(acceptance.read_bytes()).hexdigest(),
        hashlib.sha256((out / "mirror.dsse.json").read_bytes()).hexdigest(),
    ]
    # the mirror's own digest is the subject: verify and attach accept it for the mirror
    v = imagegate(
        "verify",
        str(out / sign.VSA_FILE),
        "--key",
        str(pub),
        "--image",
        recompressed,
        "--type",
        vsa["predicateType"],
        "--signature-only",
    )
    assert v.returncode == 0, v.stdout + v.stderr
    assert imagegate("attach", str(out / sign.VSA_FILE), recompressed, "--key", str(pub)).returncode == 0
    # the shipped policies admit the mirror on it, as they admit the official image
    now = dt.datetime.now(dt.timezone.utc)
    assert admission.kyverno(pod(gpu=False), out, pub.read_text(), now, tmp_path / "k") == []
    ok, said = admission.policy_controller(
        pod(gpu=False), out, pub.read_text(), not_before(now), tmp_path / "p"
    )
    assert ok, said


def test_no_equivalence_for_a_different_or_corrupt_mirror(
    pushed: Pushed,
    zstd_mirror: str,
    mirror: Registry,
    acceptance: Path,
    gate_key: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    tampered, _ = push_tampered(pushed, mirror, "tampered-eq")
    for other, said in ((zstd_mirror, "different image"), (tampered, "corrupt")):
        out = tmp_path / said
        r = imagegate(
            "compare",
            pushed.ref,
            other,
            "--attest",
            str(gate_key[0]),
            "-o",
            str(out),
            "--carry",
            str(acceptance),
        )
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"--attest: {said}: no equivalence signed" in r.stderr
        assert not out.exists()


def test_carry_refuses_an_acceptance_of_another_image_or_key(
    pushed: Pushed, recompressed: str, acceptance: Path, gate_key: tuple[Path, Path], tmp_path: Path
) -> None:
    other_key, _ = keys.write_keypair(tmp_path / "other", keys.generate(), None)
    # the acceptance of the official image, signed by a key other than the one trusted
    r = imagegate(
        "compare",
        pushed.ref,
        recompressed,
        "--attest",
        str(other_key),
        "-o",
        str(tmp_path / "x"),
        "--carry",
        str(acceptance),
    )
    assert r.returncode == 3 and "does not verify for the official image: signature:" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "x").exists()
    # the trusted key's acceptance, of another image: the same content compared the other way
    # round, so the official image now named is the recompressed copy, which no run accepted
    r = imagegate(
        "compare",
        recompressed,
        pushed.ref,
        "--attest",
        str(gate_key[0]),
        "-o",
        str(tmp_path / "y"),
        "--carry",
        str(acceptance),
    )
    assert r.returncode == 3, r.stdout + r.stderr
    assert "does not verify for the official image: subject: subject sha256:" in r.stderr, r.stderr
    assert "signature:" not in r.stderr and not (tmp_path / "y").exists()


def test_nothing_is_signed_for_a_mirror_whose_tag_moved(
    pushed: Pushed,
    recompressed: str,
    zstd_mirror: str,
    mirror: Registry,
    acceptance: Path,
    gate_key: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    """The mirror's tag names the recompressed copy (same content) at its first read and another
    image (other config, other layers) after: the copy read is compared, and since the tag no
    longer names it nothing is signed, carried or concluded (exit 2), the digests named; pinned
    to the digest read, the same copy is signed under that digest."""
    with RegistryClient(mirror.host) as c:
        first, then = (c.get_manifest("team/app", t).digest for t in ("gzip9", "zstd"))
    key = str(gate_key[0])
    with moving_tag_front(mirror.host, "team/app", "moving", "gzip9", "zstd") as front:
        moving = front.ref("team/app", "moving")
        out = tmp_path / "moved"
        r = imagegate(
            "compare", pushed.ref, moving, "--attest", key, "-o", str(out), "--carry", str(acceptance)
        )
        assert r.returncode == 2, r.stdout + r.stderr
        assert (
            f"docker://{moving}: the tag named {first} when it was read and names {then} now: it "
            "changed between reads" in r.stderr
        ), r.stderr
        assert f"(the one read: {front.host}/team/app@{first})" in r.stderr and "Traceback" not in r.stderr
        assert not out.exists()
        pinned = tmp_path / "pinned"
        r = imagegate(
            "compare", pushed.ref, f"{front.host}/team/app@{first}", "--attest", key, "-o", str(pinned),
            "--carry", str(acceptance),
        )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert _payload(pinned / "mirror.dsse.json")["subject"][1]["digest"] == {"sha256": first.split(":")[1]}
    assert _payload(pinned / sign.VSA_FILE)["subject"][0]["digest"] == {"sha256": first.split(":")[1]}
    # attach and verify --image read the tag once and stay on the digest it named then: the
    # VSA of the copy read is attached to it and found for it, though the tag moves right after.
    vsa = _payload(pinned / sign.VSA_FILE)["predicateType"]
    for args in (
        ("attach", str(pinned / sign.VSA_FILE), "--key", str(gate_key[1])),
        ("verify", "--key", str(gate_key[1]), "--type", vsa, "--signature-only", "--image"),
    ):
        with moving_tag_front(mirror.host, "team/app", "moving", "gzip9", "zstd") as front:
            r = imagegate(*args, front.ref("team/app", "moving"))
            reads = front.reads
        assert r.returncode == 0 and reads == 1, (reads, r.stdout + r.stderr)
        assert first in r.stdout + r.stderr and then not in r.stdout + r.stderr, r.stdout + r.stderr
