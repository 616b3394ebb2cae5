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
