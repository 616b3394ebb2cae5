"""The signed statements as values (domain/statements.py): what a real run signs reads back
into its type and out again byte for byte as it was signed (the acceptance, its VSA and
test-result, a node's statement), the acceptance as the published schema describes it, and a
field of the wrong kind reads as absent, never as an error. The run is `run --here` (the local
driver): no engine needed."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import jsonschema

from imagegate._support import resources
from imagegate._support.jsontypes import canonical_json
from imagegate.attest import keys, sign
from imagegate.domain.statements import Acceptance, NodeCheck, Statement, TestResult, Vsa
from imagegate.drivers.local import LocalDriver
from imagegate.fleet import node_statement
from imagegate.usecases import accept, runner

SCHEMA = json.loads((resources.manifests_dir() / "acceptance-v1.schema.json").read_text())


def _payload(path: Path) -> object:
    return json.loads(base64.b64decode(json.loads(path.read_bytes())["payload"]))


def test_what_a_run_signs_reads_back_into_its_type_and_out_unchanged(tmp_path: Path) -> None:
    opts = runner.RunOptions(pipeline="python", modules=["json"], out=tmp_path / "out")
    key = keys.generate()
    observer = runner.DriverObserver(LocalDriver(None), None, opts)
    done = accept.accept(accept.Request(runner.prepare(opts), observer, opts.out, accept.Outputs(key=key)))
    assert done.signed is not None
    folder = Path(done.record.attempt_dir)
    kinds = {sign.DSSE_FILE: Acceptance, sign.VSA_FILE: Vsa, sign.TEST_RESULT_FILE: TestResult}
    for name, kind in kinds.items():
        said = _payload(folder / name)
        read = Statement.from_json(said)
        assert isinstance(read.predicate, kind), name
        assert canonical_json(read.to_json()) == canonical_json(said), name
    jsonschema.validate(_payload(folder / sign.DSSE_FILE), SCHEMA)
    node = node_statement.sign_attempt("gpu-1", done.record, key)
    assert node is None  # the python pipeline ran no node check: nothing to say of a node
    data = {"facts": {"devices": [{"name": "NVIDIA H200", "uuid": "GPU-1"}]}}
    made = node_statement.node_statement("gpu-1", "PASS", "", data, {"reference": "r/t:1"}, "A")
    said = json.loads(sign.serialize(made))
    read = Statement.from_json(said)
    assert isinstance(read.predicate, NodeCheck) and read.predicate.gpus == ("GPU-1",)
    assert canonical_json(read.to_json()) == canonical_json(said)


def test_a_field_of_the_wrong_kind_reads_as_absent() -> None:
    odd = NodeCheck.from_json({"node": 3, "gpus": "GPU-1", "figures": {"tflops": "many", "hbm": 2}})
    assert (odd.node, odd.gpus, dict(odd.figures)) == ("", (), {"hbm": 2.0})
    assert Statement.from_json({"subject": "x", "predicateType": None}).subject == ()
    assert Acceptance.from_json(["not", "an", "object"]).verdict == ""
