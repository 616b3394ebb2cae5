"""A node's signed statement (fleet/node_statement.py): made from a node check's data in
gpu_preflight's form, signed with the product's DSSE signing, verified with the public key; its
subject names the node and its GPUs' UUIDs, and any change to it after signing fails."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from imagegate.attest import dsse, keys, sign
from imagegate.domain.results import ImageFacts, RunRecord
from imagegate.errors import UsageError
from imagegate.fleet import node_statement as nodecheck
from tests.fleet.test_judge import _data

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
    from imagegate.fleet import judge as fleet

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


def test_only_a_node_check_statement_in_an_in_toto_envelope_verifies() -> None:
    """Signed with the key, and still refused: another payload type, another predicate type
    (whichever side of the right one each sorts), a payload that is not JSON, GPUs that are not
    a list; the size bound is a size over it, not at it."""
    key = keys.generate()
    made = nodecheck.node_statement("gpu-1", "PASS", "", _node_data(), IMAGE, ATTEMPT)
    payload = sign.serialize(made)
    statement = made.to_json()  # reshaped below, as a forger would
    for ptype in ("application/json", "text/plain"):
        with pytest.raises(UsageError, match="signature does not verify"):
            nodecheck.verify_node(dsse.sign(payload, key, ptype).to_json(), key.public)
    for other in (
        "https://imagegate.dev/attestations/acceptance/v1",
        "https://slsa.dev/verification_summary/v1",
    ):
        raw = dsse.sign(sign.serialize({**statement, "predicateType": other}), key).to_json()
        with pytest.raises(UsageError, match=f"not a {nodecheck.NODE_PREDICATE_TYPE} statement"):
            nodecheck.verify_node(raw, key.public)
    with pytest.raises(UsageError, match="node statement: payload"):
        nodecheck.verify_node(dsse.sign(b"{not json", key).to_json(), key.public)
    no_list = {**statement, "predicate": {**statement["predicate"], "gpus": None}}
    with pytest.raises(UsageError, match="subject is not node 'gpu-1'"):
        nodecheck.verify_node(dsse.sign(sign.serialize(no_list), key).to_json(), key.public)
    with pytest.raises(UsageError) as at_the_bound:
        nodecheck.verify_node(b" " * nodecheck.MAX_ENVELOPE_BYTES, key.public)
    assert "over" not in str(at_the_bound.value)
    assert nodecheck.verify_node(dsse.sign(payload, key).to_json(), key.public) == statement


OTHER_ATTEMPT = "20261205T160000.000Z-aaaaaa"  # sorts after ATTEMPT


def _record(attempt: str = ATTEMPT, node: str | None = None) -> RunRecord:
    """An attempt's record with what the binding reads: its id and the node its environment names."""
    env = {"node": node} if node else {}
    return RunRecord(attempt, "", {}, {}, ImageFacts("local", None), env, [], "", "", "PASS", "0")


def _beside(tmp_path: Path, name: str, raw: bytes) -> Path:
    """An attempt folder with `raw` as the node statement beside it (the attempt itself: `_record`)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / nodecheck.NODE_FILE).write_bytes(raw)
    return folder


def _statement_of(key: keys.SigningKey, node: str, attempt: str) -> bytes:
    statement = nodecheck.node_statement(node, "PASS", "", _node_data(), IMAGE, attempt)
    return dsse.sign(sign.serialize(statement), key).to_json()


def test_an_attempt_is_bound_to_the_node_and_attempt_its_statement_names_either_way(tmp_path: Path) -> None:
    """Another node or another attempt, whichever sorts first, is named (here read without a key:
    the binding holds for --unsigned too); so is a run whose environment names another node."""
    key = keys.generate()
    for given, named in (("gpu-1", "gpu-2"), ("gpu-2", "gpu-1")):
        folder = _beside(tmp_path, f"{given}-{named}", _statement_of(key, named, ATTEMPT))
        assert nodecheck.problems(given, folder, _record(), None) == [
            f"node-check.dsse.json names node '{named}', not '{given}': an attempt is taken only as "
            "the node its statement names"
        ]
        assert nodecheck.problems(named, folder, _record(), None) == []
        assert nodecheck.ran_elsewhere(given, _record(node=named)) == [
            f"the attempt ran on node '{named}' (its signed environment), not '{given}'"
        ]
        assert nodecheck.ran_elsewhere(given, _record(node=given)) == []
    assert nodecheck.ran_elsewhere("gpu-1", _record()) == []  # a run on a host names no node
    for this, signed_for in ((ATTEMPT, OTHER_ATTEMPT), (OTHER_ATTEMPT, ATTEMPT)):
        folder = _beside(tmp_path, f"for-{this}", _statement_of(key, "gpu-1", signed_for))
        assert nodecheck.problems("gpu-1", folder, _record(this), None) == [
            f"node-check.dsse.json was signed for attempt '{signed_for}', not this one ({this})"
        ]
    empty = tmp_path / "none"
    empty.mkdir()
    assert nodecheck.problems("gpu-1", empty, _record(), None) == []  # no key: taken at its word
    with_key = nodecheck.problems("gpu-1", empty, _record(), key.public)
    assert any(w.startswith("no node-check.dsse.json beside the attempt") for w in with_key), with_key


def test_an_unreadable_node_statement_is_named_never_taken(tmp_path: Path) -> None:
    key = keys.generate()
    cases = {
        "not json": (dsse.sign(b"{not json", key).to_json(), "node statement: payload"),
        "no predicate": (
            dsse.sign(b'{"_type": "x"}', key).to_json(),
            "not an in-toto statement with a predicate",
        ),
        "a list": (dsse.sign(b"[1]", key).to_json(), "not an in-toto statement with a predicate"),
        "not an envelope": (b"{}", "DSSE envelope: missing"),
    }
    for name, (raw, expected) in cases.items():
        (why,) = nodecheck.problems("gpu-1", _beside(tmp_path, name, raw), _record(), None)
        assert why.startswith("node-check.dsse.json: ") and expected in why, (name, why)
