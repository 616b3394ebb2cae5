"""`imagegate fleet report` on real attempts of the node check (`run --here -p gpu`: without a GPU
here each node's check is DEFERRED, so each node is unfit), each with the node's statement signed
beside it as `fleet run --key` signs it, checked with --key: an attempt is bound to its node, and a
copied, re-labelled or partly deleted one is refused. The judgement of figures beside peers is
tests/fleet/test_judge.py's; here, where a node must pass, the one stand-in (named: no GPU here) is
`_gpu_node`."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from imagegate.attest import keys, sign
from imagegate.attest.statement import environment_digest
from imagegate.domain.evidence import sha256_file
from imagegate.fleet import node_statement as nodecheck
from imagegate.report.load import read_attempt
from tests.fleet.test_judge import _data

UUIDS = {n: [f"GPU-6b1f0c2e-0000-4000-8000-00000000000{n}"] for n in range(1, 6)}
RESULT = "stages/01-node_check/result.json"


def _imagegate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "imagegate", *args], capture_output=True, text=True, cwd=cwd, timeout=600,
        env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip


def _here(work: Path, out: str, *args: str, pipeline: str = "gpu") -> Path:
    """A real attempt of the node check (or of `pipeline`), run here (`--here`: this interpreter,
    no engine)."""
    done = _imagegate(
        "run", "--here", "--python", sys.executable, "-p", pipeline, "-o", out, "-q", *args, cwd=work
    )
    # Here, with no GPU, the node check is deferred: the gpu pipeline reaches no level (exit 1),
    # and its attempt is what a GPU node's would be, figures aside.
    want = 1 if pipeline == "gpu" else 0
    assert done.returncode == want and (want == 0 or "no level reached" in done.stdout), (
        done.stdout + done.stderr
    )
    (attempt,) = (work / out).glob("*/2*")
    return attempt


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("fleet")
    assert _imagegate("keygen", "--out", "ci", cwd=work).returncode == 0
    assert _imagegate("keygen", "--out", "other", cwd=work).returncode == 0
    return work


@pytest.fixture(scope="module")
def attempts(work: Path) -> list[Path]:
    """Two nodes' signed attempts, each with its node's statement signed beside it."""
    key = keys.load_signing_key(work / "ci.key")
    made = []
    for n in (1, 2):
        attempt = _here(work, f"runs{n}", "--key", "ci.key")
        nodecheck.sign_attempt(f"gpu-{n}", read_attempt(attempt).record, key)
        made.append(attempt)
    return made


@pytest.fixture(scope="module")
def unsigned(work: Path) -> Path:
    return _here(work, "unsigned", "--no-sign")


def _rehash(folder: Path, pred: dict[str, Any], rel: str) -> None:
    """The sha256 and size the statement lists for evidence file `rel`, after it was rewritten."""
    for entry in [*pred["evidence"], *(e for s in pred["stages"] for e in s["evidence"])]:
        if entry["path"] == rel:
            entry["sha256"], entry["size"] = sha256_file(folder / rel), (folder / rel).stat().st_size


def _gpu_node(
    base: Path, folder: Path, node: str, uuids: list[str], scale: dict[str, float] | None = None,
    ran_on: str | None = None,
) -> Path:  # fmt: skip
    """The stand-in for a node check that ran on a GPU node (a GPU cannot start here): a real
    attempt of it (`base`, unsigned) whose node check is PASS with a real H200's figures
    (tests/test_fleet._data, times `scale`) and these GPUs' UUIDs, in an environment that names
    node `ran_on` as a Pod's run does; signed as the runner signs (attest/sign.py) with the key
    in `folder`'s grandparent, then the node's statement beside it as `fleet run --key` signs it."""
    shutil.copytree(base, folder)
    statement = json.loads((folder / "statement.json").read_text())
    pred = statement["predicate"]
    pred["attempt"]["id"] = f"{folder.parent.name}-{folder.name}"  # an attempt of its own
    data = _data(scale)
    data["host"] = {"nvidia_smi": [{"index": 0, "uuid": u} for u in uuids]}
    result = {"id": "node_check", "status": "PASS", "detail": "node fit", "data": data}
    (folder / RESULT).write_text(json.dumps(result))
    _rehash(folder, pred, RESULT)
    pred["stages"][0].update(status="PASS", token="NODE_CHECK_PASS", detail="node fit")
    pred["verdict"] = "PASS"
    if ran_on:
        facts = json.loads((folder / "run.json").read_text())
        facts["environment"]["node"] = pred["environment"]["node"] = ran_on
        (folder / "run.json").write_text(json.dumps(facts))
        _rehash(folder, pred, "run.json")
        statement["subject"][0]["digest"]["sha256"] = environment_digest(pred["environment"])
    (folder / "statement.json").write_text(json.dumps(statement, indent=2))
    signing = keys.load_signing_key(folder.parents[1] / "ci.key")
    sign.sign_attempt(folder, statement, signing)
    nodecheck.sign_attempt(node, read_attempt(folder).record, signing)
    return folder


@pytest.fixture(scope="module")
def fleet_of_four(work: Path, unsigned: Path) -> dict[str, Path]:
    """Four H200 nodes that passed their check; gpu-3's HBM copy 20 % below the others'."""
    scales: dict[int, dict[str, float] | None] = {1: None, 2: None, 3: {"hbm_copy_gbps": 0.8}, 4: None}
    return {
        f"gpu-{n}": _gpu_node(unsigned, work / "nodes" / f"gpu-{n}", f"gpu-{n}", UUIDS[n], s)
        for n, s in scales.items()
    }


def _report(work: Path, nodes: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    return _imagegate("fleet", "report", *(f"{n}={a}" for n, a in nodes.items()), *args, cwd=work)


def _verdicts(done: subprocess.CompletedProcess[str]) -> dict[str, tuple[str, str]]:
    """node -> (verdict, evidence), from the JSON report."""
    return {n["name"]: (n["verdict"], n["evidence"]) for n in json.loads(done.stdout)["nodes"]}


def test_nodes_whose_check_did_not_pass_are_unfit_with_the_commands(work: Path, attempts: list[Path]) -> None:
    a, b = attempts
    done = _report(work, {"gpu-1": a, "gpu-2": b}, "--key", "ci.pub")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gpu-1: node check DEFERRED: requires gpu, not present here" in done.stdout
    assert "kubectl taint node gpu-2 imagegate.dev/node-check=unfit:NoSchedule --overwrite" in done.stdout
    assert "refused" not in done.stdout
    as_json = _report(work, {"gpu-1": a, "gpu-2": b}, "--key", "ci.pub", "--format", "json")
    doc = json.loads(as_json.stdout)
    assert [(n["name"], n["check"], n["verdict"], n["evidence"]) for n in doc["nodes"]] == [
        ("gpu-1", "DEFERRED", "unfit", "verified"), ("gpu-2", "DEFERRED", "unfit", "verified"),
    ]  # fmt: skip
    assert len(doc["commands"]) == 4 and doc["signaturesChecked"] is True and doc["unverified"] == []


def test_a_fit_fleet_verified_exits_0_and_a_suspect_node_1(
    work: Path, fleet_of_four: dict[str, Path]
) -> None:
    done = _report(work, fleet_of_four, "--key", "ci.pub", "--format", "json")
    assert done.returncode == 1, done.stdout + done.stderr
    assert _verdicts(done) == {
        "gpu-1": ("fit", "verified"), "gpu-2": ("fit", "verified"),
        "gpu-3": ("suspect", "verified"), "gpu-4": ("fit", "verified"),
    }  # fmt: skip
    fit = {n: a for n, a in fleet_of_four.items() if n != "gpu-3"}
    assert _report(work, fit, "--key", "ci.pub").returncode == 0


def test_an_attempt_copied_under_another_nodes_name_is_refused(
    work: Path, fleet_of_four: dict[str, Path]
) -> None:
    """gpu-1's attempt and statement copied as gpu-5's: its statement names gpu-1, and gpu-1's GPU
    is on two nodes: both refused, unfit, and neither is a peer (the median is the others')."""
    copy = shutil.copytree(fleet_of_four["gpu-1"], work / "copied" / "gpu-5")
    nodes = {**fleet_of_four, "gpu-5": copy}
    done = _report(work, nodes, "--key", "ci.pub")
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "gpu-5: refused: node-check.dsse.json names node 'gpu-1', not 'gpu-5': an attempt is taken only "
        "as the node its statement names"
    ) in done.stdout
    assert f"gpu-5: refused: GPU {UUIDS[1][0]} is also on node gpu-1" in done.stdout
    assert f"gpu-1: refused: GPU {UUIDS[1][0]} is also on node gpu-5" in done.stdout
    # Four peers make a median: the four nodes alone have them, and gpu-3 is suspect; beside the
    # copy, gpu-1 and gpu-5 are no peers, three are left, and gpu-3 is judged by the floors alone.
    four = _verdicts(_report(work, fleet_of_four, "--key", "ci.pub", "--min-peers", "4", "--format", "json"))
    assert four["gpu-3"] == ("suspect", "verified")
    verdicts = _verdicts(_report(work, nodes, "--key", "ci.pub", "--min-peers", "4", "--format", "json"))
    # gpu-1's own evidence verifies; the GPU it shares refuses it all the same
    assert verdicts["gpu-5"] == ("unfit", "refused") and verdicts["gpu-1"] == ("unfit", "verified")
    assert verdicts["gpu-3"] == ("fit", "verified")


def test_the_same_gpu_on_two_nodes_refuses_both_naming_it(work: Path, unsigned: Path) -> None:
    """Two attempts, each validly signed for its own node, that name one GPU UUID: a GPU is in one
    node, so one of them is not its node's own result; which one cannot be told."""
    shared = UUIDS[5][0]
    nodes = {
        "gpu-6": _gpu_node(unsigned, work / "twice" / "gpu-6", "gpu-6", [shared]),
        "gpu-7": _gpu_node(unsigned, work / "twice" / "gpu-7", "gpu-7", [UUIDS[4][0], shared]),
    }
    done = _report(work, nodes, "--key", "ci.pub")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"gpu-6: refused: GPU {shared} is also on node gpu-7" in done.stdout
    assert f"gpu-7: refused: GPU {shared} is also on node gpu-6" in done.stdout
    assert UUIDS[4][0] not in done.stdout.replace(f"gpu-7: refused: GPU {shared}", "")


def _alter(path: Path) -> None:
    """What a forger with write access does: a better figure in the result, a PASS in the node
    statement's payload (its signature left as it was)."""
    if path.name == nodecheck.NODE_FILE:
        envelope = json.loads(path.read_text())
        statement = json.loads(base64.b64decode(envelope["payload"]))
        statement["predicate"]["figures"]["hbm_copy_gbps"] *= 1.25
        envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
        path.write_text(json.dumps(envelope))
    else:
        result = json.loads(path.read_text())
        result["data"]["bandwidth"]["gpus"][0]["hbm_copy_gbps"] *= 1.25
        path.write_text(json.dumps(result))


@pytest.mark.parametrize(
    ("file", "change", "expected"),
    [
        (nodecheck.NODE_FILE, "delete", "no node-check.dsse.json beside the attempt"),
        (RESULT, "delete", "missing from"),
        (sign.DSSE_FILE, "delete", "not a signed attempt"),
        (RESULT, "alter", f"{RESULT}: changed"),
        (nodecheck.NODE_FILE, "alter", "signature does not verify"),
    ],
    ids=["node statement deleted", "evidence file deleted", "envelope deleted", "evidence file altered",
         "node statement altered"],
)  # fmt: skip
def test_a_deleted_or_altered_signed_file_makes_the_node_unfit(
    file: str, change: str, expected: str, work: Path, fleet_of_four: dict[str, Path]
) -> None:
    """The suspect node's signed files, one deleted or altered: the node is refused (unfit), never
    unknown or fit, and the report exits 1; nor is it a peer of the others."""
    where = work / "changed" / f"{change}-{file.replace('/', '-')}" / "gpu-3"
    copy = shutil.copytree(fleet_of_four["gpu-3"], where)
    if change == "delete":
        (copy / file).unlink()
    else:
        _alter(copy / file)
    done = _report(work, {**fleet_of_four, "gpu-3": copy}, "--key", "ci.pub", "--format", "json")
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    (node,) = [n for n in doc["nodes"] if n["name"] == "gpu-3"]
    assert (node["verdict"], node["evidence"]) == ("unfit", "refused")
    assert node["why"] and all(w.startswith("refused: ") for w in node["why"])
    assert any(expected in w for w in node["why"]), node["why"]
    assert doc["unverified"] == ["gpu-3"]
    assert "kubectl taint node gpu-3 imagegate.dev/node-check=unfit:NoSchedule --overwrite" in doc["commands"]


def test_a_node_statement_of_another_attempt_or_key_or_a_run_on_another_node_is_refused(
    work: Path, unsigned: Path, fleet_of_four: dict[str, Path]
) -> None:
    """gpu-1's attempt with gpu-1's statement of an earlier attempt beside it; an attempt whose
    signed environment says it ran on gpu-9; a node statement signed with another key."""
    older = _gpu_node(unsigned, work / "older" / "gpu-1", "gpu-1", UUIDS[1])
    swapped = shutil.copytree(fleet_of_four["gpu-1"], work / "swapped" / "gpu-1")
    shutil.copy(older / nodecheck.NODE_FILE, swapped / nodecheck.NODE_FILE)
    elsewhere = _gpu_node(unsigned, work / "elsewhere" / "gpu-2", "gpu-2", UUIDS[2], ran_on="gpu-9")
    other_key = _gpu_node(unsigned, work / "other-key" / "gpu-4", "gpu-4", UUIDS[4])
    (other_key / nodecheck.NODE_FILE).unlink()
    (other_key / nodecheck.NODE_BUNDLE_FILE).unlink()
    nodecheck.sign_attempt("gpu-4", read_attempt(other_key).record, keys.load_signing_key(work / "other.key"))
    nodes = {"gpu-1": swapped, "gpu-2": elsewhere, "gpu-4": other_key}
    done = _report(work, nodes, "--key", "ci.pub", "--format", "json")
    assert done.returncode == 1, done.stdout + done.stderr
    why = {n["name"]: n["why"] for n in json.loads(done.stdout)["nodes"]}
    assert why["gpu-1"] == [
        "refused: node-check.dsse.json was signed for attempt 'older-gpu-1', not this one (nodes-gpu-1)"
    ]
    assert why["gpu-2"] == ["refused: the attempt ran on node 'gpu-9' (its signed environment), not 'gpu-2'"]
    assert len(why["gpu-4"]) == 1 and "signature does not verify" in why["gpu-4"][0]


def test_without_a_key_every_node_is_unverified_and_only_unsigned_accepts(
    work: Path, fleet_of_four: dict[str, Path]
) -> None:
    fit = {n: a for n, a in fleet_of_four.items() if n != "gpu-3"}
    done = _report(work, fit)
    assert done.returncode == 1, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("gpu-")]
    assert len(rows) == 3 and all(" fit " in r and " unverified " in r for r in rows), rows
    assert "to check them, or --unsigned to judge them at their word" in done.stderr
    taken = _report(work, fit, "--unsigned", "--format", "json")
    assert taken.returncode == 0, taken.stdout + taken.stderr
    doc = json.loads(taken.stdout)
    assert {n["evidence"] for n in doc["nodes"]} == {"unverified"} and doc["unsigned"] is True
    assert doc["unverified"] == ["gpu-1", "gpu-2", "gpu-4"] and doc["signaturesChecked"] is False
    both = _report(work, fit, "--unsigned", "--key", "ci.pub")
    assert both.returncode == 3 and "check the signatures one way, or not" in both.stderr


def test_unsigned_still_refuses_a_copy_its_statement_names_otherwise(
    work: Path, fleet_of_four: dict[str, Path]
) -> None:
    copy = shutil.copytree(fleet_of_four["gpu-2"], work / "copied-unsigned" / "gpu-5")
    done = _report(work, {"gpu-1": fleet_of_four["gpu-1"], "gpu-5": copy}, "--unsigned")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gpu-5: refused: node-check.dsse.json names node 'gpu-2', not 'gpu-5'" in done.stdout


def test_an_attempt_that_does_not_verify_with_the_key_is_refused(work: Path, attempts: list[Path]) -> None:
    done = _report(work, {"gpu-1": attempts[0]}, "--key", "other.pub")
    assert done.returncode == 1
    assert "gpu-1: refused: " in done.stdout and "does not verify" in done.stdout


@pytest.mark.parametrize("case", ["twice", "no node check", "not NODE=ATTEMPT"])
def test_bad_input_is_refused_naming_it(case: str, work: Path, attempts: list[Path]) -> None:
    a = attempts[0]
    plain = _here(work, "py", "--no-sign", pipeline="python") if case == "no node check" else a
    args = {
        "twice": [f"gpu-1={a}", f"gpu-2={a}"],
        "no node check": [f"gpu-1={plain}"],
        "not NODE=ATTEMPT": [str(a)],
    }[case]
    done = _imagegate("fleet", "report", *args, "--key", "ci.pub", cwd=work)
    assert done.returncode == 3, done.stdout + done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("imagegate: error:")]
    assert {
        "twice": "named twice",
        "no node check": "ran no node check",
        "not NODE=ATTEMPT": "not NODE=ATTEMPT",
    }[case] in error


def test_render_pins_one_validated_job_per_gpu_node_requesting_all_its_gpus(tmp_path: Path) -> None:
    """The objects are validated against the Kubernetes schemas by the command itself (the kube
    extra); here: one Job per node to check, pinned to it, all its GPUs, a cordon tolerated."""
    import yaml

    from tests.fleet.test_judge import _k8s_node, _k8s_pod

    (tmp_path / "nodes.json").write_text(json.dumps({"items": [
        _k8s_node("h200-a"), _k8s_node("node.with.dots", gpus=4), _k8s_node("busy-1"),
        _k8s_node("cpu-1", gpus=None, product=None),
    ]}))  # fmt: skip
    (tmp_path / "pods.json").write_text(json.dumps({"items": [_k8s_pod("busy-1", "train-0")]}))
    image = "registry.example/team/torch@sha256:" + "ab" * 32
    done = _imagegate("fleet", "render", image, "--nodes", "nodes.json", "--pods", "pods.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "imagegate: skipped busy-1: GPU work running (team/train-0)" in done.stderr
    jobs = [d for d in yaml.safe_load_all(done.stdout) if d["kind"] == "Job"]
    assert [j["spec"]["template"]["spec"]["nodeSelector"] for j in jobs] == [
        {"kubernetes.io/hostname": "h200-a"}, {"kubernetes.io/hostname": "node.with.dots"},
    ]  # fmt: skip
    names = [j["metadata"]["name"] for j in jobs]
    assert names[0] == "imagegate-node-check-h200-a" and len(set(names)) == 2
    for job, gpus in zip(jobs, ("8", "4"), strict=True):
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
        assert container["image"] == image
        assert {
            "key": "node.kubernetes.io/unschedulable",
            "operator": "Exists",
            "effect": "NoSchedule",
        } in pod["tolerations"]
    bad = _imagegate("fleet", "render", image, "--nodes", "pods.json", cwd=tmp_path)
    assert bad.returncode == 3 and "no GPU node to check" in bad.stderr
