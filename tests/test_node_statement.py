"""A node's signed statement (attest/nodecheck.py): made from a node check's data in
gpu_preflight's form, signed with the product's DSSE signing, verified with the public key; its
subject names the node and its GPUs' UUIDs, and any change to it after signing fails."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from imagegate.attest import dsse, keys, nodecheck
from imagegate.errors import UsageError
from tests.test_fleet import _data

IMAGE = {"reference": "myorg/torch@sha256:" + "ab" * 32, "digest": "sha256:" + "ab" * 32}
ATTEMPT = "20261205T155051.684Z-fc1b32"
UUIDS = ["GPU-6b1f0c2e-0000-4000-8000-00000000000a", "GPU-6b1f0c2e-0000-4000-8000-00000000000b"]


def _node_data(scale: dict[str, float] | None = None) -> dict[str, Any]:
    data = _data(scale, gpus=2)
    # nvidia-smi's rows carry the UUID with its GPU- prefix, torch's without: one spelling signed
    data["host"] = {"nvidia_smi": [{"index": i, "uuid": u} for i, u in enumerate(UUIDS)]}
    for d, u in zip(data["facts"]["devices"], UUIDS, strict=True):
        d["uuid"] = u.removeprefix("GPU-")
    return data


def _signed(tmp_path: Path, key: keys.SigningKey, node: str, status: str, **kw: Any) -> bytes:
    folder = tmp_path / f"{node}-{status}"
    folder.mkdir()
    statement = nodecheck.node_statement(node, status, "", _node_data(**kw), IMAGE, ATTEMPT)
    return nodecheck.sign_node(folder, statement, key).read_bytes()


def test_the_statement_verifies_and_names_the_node_and_its_gpus(tmp_path: Path) -> None:
    key = keys.generate()
    statement = nodecheck.verify_node(_signed(tmp_path, key, "gpu-1", "PASS"), key.public)
    names = [s["name"] for s in statement["subject"]]
    assert names == ["node/gpu-1", *(f"node/gpu-1/gpu/{u}" for u in UUIDS)]
    assert statement["predicateType"] == nodecheck.NODE_PREDICATE_TYPE
    p = statement["predicate"]
    assert (p["node"], p["verdict"], p["gpus"], p["image"]) == ("gpu-1", "PASS", UUIDS, IMAGE)
    assert p["attempt"] == ATTEMPT  # the attempt it was made from: bound to it
    assert p["figures"]["bf16_tflops"] > 0 and p["model"] == "NVIDIA H200"


def test_an_altered_subject_or_another_key_fails(tmp_path: Path) -> None:
    key = keys.generate()
    raw = _signed(tmp_path, key, "gpu-1", "PASS")
    envelope = json.loads(raw)
    statement = json.loads(base64.b64decode(envelope["payload"]))
    # Another node's name (with its digest recomputed, as a forger would): the signature fails.
    statement["subject"] = nodecheck.subject("gpu-2", UUIDS)
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    with pytest.raises(UsageError, match="signature does not verify"):
        nodecheck.verify_node(json.dumps(envelope).encode(), key.public)
    # Re-signed with the right key but a subject that is not the predicate's node: refused too.
    forged = dsse.sign(json.dumps(statement).encode(), key).to_json()
    with pytest.raises(UsageError, match="subject is not node 'gpu-1'"):
        nodecheck.verify_node(forged, key.public)
    with pytest.raises(UsageError, match="signature does not verify"):
        nodecheck.verify_node(raw, keys.generate().public)
    assert nodecheck.verify_node(raw, key.public)["predicate"]["node"] == "gpu-1"


def test_a_node_unfit_then_fit_on_a_re_run_each_signed_once(tmp_path: Path) -> None:
    key = keys.generate()
    first = nodecheck.verify_node(
        _signed(tmp_path, key, "gpu-3", "ERROR", scale={"hbm_copy_gbps": 0.5}), key.public
    )
    second = nodecheck.verify_node(_signed(tmp_path, key, "gpu-3", "PASS"), key.public)
    assert [first["predicate"]["verdict"], second["predicate"]["verdict"]] == ["ERROR", "PASS"]
    assert first["subject"] == second["subject"]  # the same node and GPUs, judged twice
    assert second["predicate"]["figures"]["hbm_copy_gbps"] > first["predicate"]["figures"]["hbm_copy_gbps"]
    with pytest.raises(UsageError, match="signed once"):
        nodecheck.sign_node(tmp_path / "gpu-3-PASS", second, key)


def test_uuids_from_torch_alone_and_oversized_envelopes(tmp_path: Path) -> None:
    data = _node_data()
    del data["host"]
    assert nodecheck.gpu_uuids(data) == UUIDS
    assert nodecheck.gpu_uuids({}) == []
    with pytest.raises(UsageError, match="over"):
        nodecheck.verify_node(b" " * (nodecheck.MAX_ENVELOPE_BYTES + 1), keys.generate().public)


def test_a_node_below_its_peers_is_suspect_while_its_statement_keeps_pass(tmp_path: Path) -> None:
    from imagegate import fleet

    key = keys.generate()
    scales = {"gpu-1": None, "gpu-2": None, "gpu-3": {"hbm_copy_gbps": 0.8}, "gpu-4": None}
    signed = {
        n: nodecheck.verify_node(_signed(tmp_path, key, n, "PASS", scale=s), key.public)
        for n, s in scales.items()
    }
    nodes = [
        fleet.Node(n, st["predicate"]["verdict"], st["predicate"]["model"], st["predicate"]["figures"])
        for n, st in signed.items()
    ]
    verdicts = {j.node.name: j.verdict for j in fleet.judge(nodes).nodes}
    assert verdicts == {"gpu-1": "fit", "gpu-2": "fit", "gpu-3": "suspect", "gpu-4": "fit"}
    assert signed["gpu-3"]["predicate"]["verdict"] == "PASS"
    assert (
        signed["gpu-3"]["predicate"]["figures"]["hbm_copy_gbps"]
        < signed["gpu-1"]["predicate"]["figures"]["hbm_copy_gbps"]
    )
