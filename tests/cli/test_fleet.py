"""`imagegate fleet report` on real attempts of the node check (`-p gpu`, here without a GPU: each
node's check is DEFERRED, so each node is unfit), their signatures checked with --key; the
judgement of real figures beside peers is tests/test_fleet.py's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import DOCKER_SOCK

pytestmark = pytest.mark.engine


def _imagegate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "imagegate", *args], capture_output=True, text=True, cwd=cwd, timeout=600,
        env={**__import__("os").environ, "DOCKER_HOST": DOCKER_SOCK},
    )  # fmt: skip


@pytest.fixture(scope="module")
def attempts(images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    work = tmp_path_factory.mktemp("fleet")
    assert _imagegate("keygen", "--out", "ci", cwd=work).returncode == 0
    made = []
    for n in range(2):
        done = _imagegate(
            "run", images["python"], "-p", "gpu", "-o", f"runs{n}", "--key", "ci.key", "-q", cwd=work
        )
        assert done.returncode == 0, done.stderr
        (attempt,) = (work / f"runs{n}").glob("*/2*")
        made.append(attempt)
    other = _imagegate(
        "run", images["python"], "-p", "python", "-o", "plain", "--key", "ci.key", "-q", cwd=work
    )
    assert other.returncode == 0, other.stderr
    return work, made


def test_nodes_whose_check_did_not_pass_are_unfit_with_the_commands(
    attempts: tuple[Path, list[Path]],
) -> None:
    work, (a, b) = attempts
    done = _imagegate("fleet", "report", f"gpu-1={a}", f"gpu-2={b}", "--key", "ci.pub", cwd=work)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gpu-1: node check DEFERRED: requires gpu, not present here" in done.stdout
    assert "kubectl taint node gpu-2 imagegate.dev/node-check=unfit:NoSchedule --overwrite" in done.stdout
    assert "not verified" not in done.stdout
    as_json = _imagegate("fleet", "report", f"gpu-1={a}", f"gpu-2={b}", "--format", "json", cwd=work)
    doc = json.loads(as_json.stdout)
    assert [(n["name"], n["check"], n["verdict"]) for n in doc["nodes"]] == [
        ("gpu-1", "DEFERRED", "unfit"), ("gpu-2", "DEFERRED", "unfit"),
    ]  # fmt: skip
    assert len(doc["commands"]) == 4 and doc["signaturesChecked"] is False
    assert "signatures not checked" in _imagegate("fleet", "report", f"gpu-1={a}", cwd=work).stdout


def test_an_attempt_that_does_not_verify_with_the_key_is_named(attempts: tuple[Path, list[Path]]) -> None:
    work, (a, _) = attempts
    assert _imagegate("keygen", "--out", "other", cwd=work).returncode == 0
    done = _imagegate("fleet", "report", f"gpu-1={a}", "--key", "other.pub", cwd=work)
    assert done.returncode == 1
    assert "not verified: gpu-1: SIGNATURE FAILED" in done.stdout


@pytest.mark.parametrize("case", ["twice", "no node check", "not NODE=ATTEMPT"])
def test_bad_input_is_refused_naming_it(case: str, attempts: tuple[Path, list[Path]]) -> None:
    work, (a, _) = attempts
    plain = next((work / "plain").glob("*/2*"))
    args = {
        "twice": [f"gpu-1={a}", f"gpu-2={a}"],
        "no node check": [f"gpu-1={plain}"],
        "not NODE=ATTEMPT": [str(a)],
    }[case]
    done = _imagegate("fleet", "report", *args, cwd=work)
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

    from tests.test_fleet import _k8s_node, _k8s_pod

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


def test_a_nodes_own_statement_is_verified_with_the_key(attempts: tuple[Path, list[Path]]) -> None:
    """An attempt with the node's signed statement beside it (as `fleet run --key` leaves it): it
    verifies for the node it names; one naming another node, or signed by another key, is named."""
    import shutil

    from imagegate.attest import keys, nodecheck

    work, (a, _) = attempts
    key = keys.load_signing_key(work / "ci.key")
    seq = []
    for n, (signer, node) in enumerate([(key, "gpu-1"), (key, "gpu-9"), (keys.generate(), "gpu-1")]):
        copy = shutil.copytree(a, work / f"signed{n}" / a.parent.name / a.name)
        statement = nodecheck.node_statement(node, "DEFERRED", "", {}, {"digest": None})
        nodecheck.sign_node(copy, statement, signer)
        done = _imagegate("fleet", "report", f"gpu-1={copy}", "--key", "ci.pub", cwd=work)
        seq.append([line for line in done.stdout.splitlines() if line.startswith("not verified")])
    assert seq[0] == []
    assert seq[1] == ["not verified: gpu-1: node-check.dsse.json: names node 'gpu-9', not 'gpu-1'"]
    assert seq[2] and "signature does not verify" in seq[2][0]
