"""No level, no acceptance, with real images in the real engine: a run whose checks were all left
out reaches no level, `run` exits 1 naming them and `verify` refuses it; a stage with nothing to
check is SKIPPED and counts neither way, so a healthy image still reaches the CPU level; and an
image whose interpreter claims a GPU the runner never granted (tests/images/hostile-gpu) earns
no GPU level."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from imagegate.attest import sign
from tests.helpers import imagegate
from tests.run.test_gpu import GPU_PIPELINE

pytestmark = pytest.mark.engine


def _key(tmp_path: Path) -> tuple[Path, Path]:
    r = imagegate("keygen", "--out", str(tmp_path / "k"))
    assert r.returncode == 0, r.stderr
    return tmp_path / "k.key", tmp_path / "k.pub"


def _one(out: Path) -> Path:
    (attempt,) = [p.parent for p in out.glob("*/*/statement.json")]
    return attempt


def _signed(path: Path) -> dict[str, Any]:
    return json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))  # type: ignore[no-any-return]


def _verify(attempt: Path, pub: Path) -> tuple[int, str]:
    r = imagegate("verify", str(attempt / sign.DSSE_FILE), "--key", str(pub))
    return r.returncode, r.stdout + r.stderr


def test_a_stage_with_nothing_to_check_counts_neither_way(images: dict[str, str], tmp_path: Path) -> None:
    """`-p python` with no --module: find_spec had nothing to check (SKIPPED); pip check passed,
    so the CPU level stands and the run is accepted."""
    key, pub = _key(tmp_path)
    r = imagegate("run", images["python"], "-p", "python", "-o", str(tmp_path / "out"), "--key", str(key))
    assert r.returncode == 0, r.stdout + r.stderr
    attempt = _one(tmp_path / "out")
    stages = {s["id"]: s for s in _signed(attempt / sign.DSSE_FILE)["predicate"]["stages"]}
    assert stages["find_spec"]["status"] == "SKIPPED", stages["find_spec"]
    assert stages["find_spec"]["detail"].startswith("no modules to check")
    assert stages["pip_check"]["status"] == "PASS"
    assert _signed(attempt / sign.VSA_FILE)["predicate"]["verifiedLevels"] == ["IMAGEGATE_CPU"]
    code, words = _verify(attempt, pub)
    assert code == 0 and "verified: verdict PASS, accepted (levels: IMAGEGATE_CPU)" in words, words


def test_every_check_left_out_is_rejected_by_run_and_verify_and_complete_earns_it(
    images: dict[str, str], tmp_path: Path
) -> None:
    key, pub = _key(tmp_path)
    out = tmp_path / "out"
    skip = ("--skip", "pip_check", "--skip", "find_spec")
    r = imagegate(
        "run", images["python"], "-p", "python", "-m", "json", *skip, "-o", str(out), "--key", str(key)
    )
    assert r.returncode == 1, r.stdout + r.stderr
    said = " ".join(r.stdout.split())  # the table's verdict line, however wide the console
    assert "verdict: CPU_PASS_PIP_CHECK_FIND_SPEC_DEFERRED" in said, said
    assert (
        "rejected: no level reached (no stage checked something and passed; not run or not passed: "
        "pip_check DEFERRED, find_spec DEFERRED)"
    ) in said, said
    attempt = _one(out)
    code, words = _verify(attempt, pub)
    assert code == 1, words
    assert "verdict CPU_PASS_PIP_CHECK_FIND_SPEC_DEFERRED reaches no level: not accepted" in words, words
    assert _signed(attempt / sign.VSA_FILE)["predicate"]["verificationResult"] == "FAILED"
    # what was left out runs later, and the completion reaches the level
    done = imagegate("complete", str(attempt), "--key", str(key), "-q")
    assert done.returncode == 0, done.stdout + done.stderr
    (later,) = [p.parent for p in out.glob("*/*/statement.json") if p.parent != attempt]
    assert _signed(later / sign.VSA_FILE)["predicate"]["verifiedLevels"] == ["IMAGEGATE_CPU"]
    code, words = _verify(later, pub)
    assert code == 0, words  # it failed once in CI: what verify said is the clue


def test_an_image_claiming_a_gpu_the_runner_never_granted_earns_no_gpu_level(
    images: dict[str, str], tmp_path: Path
) -> None:
    """The hostile interpreter makes the controller see a GPU (a device file of its own, the
    visibility variables set): the controller runs the GPU stage and says PASS. The runner gave
    the container no GPU, so the stage is DEFERRED, ran for the record, and the GPU level is
    not reached; the image's word and the runner's fact are both in the evidence."""
    key, pub = _key(tmp_path)
    pipe = tmp_path / "gpu-env.yaml"
    pipe.write_text(GPU_PIPELINE.format(python="python3"))
    out = tmp_path / "out"
    r = imagegate("run", images["hostile-gpu"], "-p", str(pipe), "-o", str(out), "--key", str(key))
    assert r.returncode == 0, r.stdout + r.stderr
    attempt = _one(out)
    pred = _signed(attempt / sign.DSSE_FILE)["predicate"]
    env = pred["environment"]
    assert env["gpu"]["present"] is True and env["gpuPresent"] is True, env["gpu"]  # the image's word
    assert env["gpuGranted"] is False and env["gpus_granted"] is None  # the runner's fact
    gpu = next(s for s in pred["stages"] if s["id"] == "gpu_env")
    assert gpu["status"] == "DEFERRED" and "gpuGranted" not in gpu, gpu
    assert gpu["detail"].startswith("requires gpu, and the runner granted none; ran for the record:")
    assert gpu["facts"]["ran_for_record"]["status"] == "PASS"  # what the image said of it
    assert "cvd='0' nvd='all'" in next(attempt.glob("stages/*-gpu_env/stdout.txt")).read_text()
    assert pred["verdict"] == "CPU_PASS_GPU_ENV_DEFERRED"
    assert _signed(attempt / sign.VSA_FILE)["predicate"]["verifiedLevels"] == ["IMAGEGATE_CPU"]
    controllers = json.loads((attempt / "run.json").read_text())["run"]["controllers"]
    assert controllers and [c["gpus_granted"] for c in controllers] == [None] * len(controllers)
    code, words = _verify(attempt, pub)
    assert code == 0 and "levels: IMAGEGATE_CPU)" in words, words
