"""Attempts signed by the real runner (`run --here`, real keys) for every verdict a policy must
tell apart: PASS (a pipeline without GPU stages), FAIL, ERROR, a deferred GPU stage, a stage
left out with --skip, PASS signed by another key, and a completion of the deferred attempt (no
GPU here: it stays deferred). One stand-in, named: a GPU cannot start here, so `gpu_pass` is the
deferred attempt's statement with its GPU stage PASS, as a GPU node's completion says it, signed
by the real signer (attest/sign.py). Each is made once."""

from __future__ import annotations

import base64
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from imagegate.attest import keys, sign
from tests.helpers import imagegate

# A CPU stage and a GPU stage: deferred here (no GPU), the GPU level only once the GPU one passed.
from tests.run.test_gpu import GPU_PIPELINE

# A stage whose command outlives its timeout: the runner's ERROR (the check could not run).
ERROR_PIPELINE = """\
apiVersion: imagegate/v1
name: outlives-its-timeout
stages:
  - id: slow
    probe: cli
    timeout: 1
    with:
      command: [{python}, -c, "import time; time.sleep(60)"]
"""

# A stage that passes and one skipped: `run --here` has no image whose layers it could read.
LAYERS_HERE_PIPELINE = """\
apiVersion: imagegate/v1
name: layers-here
stages:
  - id: runs
    probe: cli
    timeout: 1m
    with:
      command: [{python}, -c, "pass"]
  - id: layers
    probe: layers
    timeout: 1m
"""


# `run --here` with this interpreter and the python pipeline: add -m MODULE (json passes)
PYTHON_HERE = ("--python", sys.executable, "-p", "python")


@dataclass(frozen=True)
class Keys:
    key: Path  # the key the policies trust
    pub: Path
    other_key: Path  # a key they do not
    other_pub: Path


@pytest.fixture(scope="session")
def policy_keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return make_keys(tmp_path_factory.mktemp("policy-keys"))


def run_here(out: Path, key: Path, *args: str) -> Path:
    """The attempt folder of one `run --here` into `out`, signed with `key`."""
    r = imagegate("run", "--here", *args, "-o", str(out), "--key", str(key), "-q")
    assert r.returncode in (0, 1, 2), r.stdout + r.stderr
    (attempt,) = [p.parent for p in out.glob("*/*/statement.json")]
    return attempt


def make_keys(folder: Path) -> Keys:
    """Two fresh key pairs: the one the policies trust and another."""
    key, pub = keys.write_keypair(folder / "gate", keys.generate(), None)
    other, other_pub = keys.write_keypair(folder / "other", keys.generate(), None)
    return Keys(key, pub, other, other_pub)


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory, policy_keys: Keys) -> dict[str, Path]:
    return make_runs(tmp_path_factory.mktemp("policy-runs"), policy_keys)


def make_runs(tmp: Path, policy_keys: Keys) -> dict[str, Path]:
    """name -> attempt folder under `tmp`: pass, fail, error, deferred, skipped, other_key,
    completion, gpu_pass (the stand-in), layers_skipped (PASS with a stage skipped)."""
    py = PYTHON_HERE
    error_pipe, gpu_pipe = tmp / "error.yaml", tmp / "gpu.yaml"
    error_pipe.write_text(ERROR_PIPELINE.format(python=sys.executable))
    gpu_pipe.write_text(GPU_PIPELINE.format(python=sys.executable))
    here_pipe = tmp / "layers-here.yaml"
    here_pipe.write_text(LAYERS_HERE_PIPELINE.format(python=sys.executable))
    made = {
        "pass": run_here(tmp / "pass", policy_keys.key, *py, "-m", "json"),
        "fail": run_here(tmp / "fail", policy_keys.key, *py, "-m", "no_such_module_anywhere"),
        "error": run_here(tmp / "error", policy_keys.key, "-p", str(error_pipe)),
        "deferred": run_here(tmp / "deferred", policy_keys.key, "-p", str(gpu_pipe)),
        "skipped": run_here(tmp / "skipped", policy_keys.key, *py, "-m", "json", "--skip", "pip_check"),
        "other_key": run_here(tmp / "other", policy_keys.other_key, *py, "-m", "json"),
        "layers_skipped": run_here(tmp / "layers_skipped", policy_keys.key, "-p", str(here_pipe)),
    }
    done = imagegate("complete", str(made["deferred"]), "--here", "--key", str(policy_keys.key), "-q")
    assert done.returncode == 0, done.stdout + done.stderr
    (made["completion"],) = [
        p.parent for p in (tmp / "deferred").glob("*/*/statement.json") if p.parent != made["deferred"]
    ]
    made["gpu_pass"] = _gpu_stand_in(made["deferred"], tmp / "gpu_pass", policy_keys.key)
    return made


def _gpu_stand_in(deferred: Path, folder: Path, key: Path) -> Path:
    """The stand-in for a GPU node's completion (no GPU here): the deferred statement with its
    GPU stage PASS on GPUs the runner granted (`gpuGranted`, the runner's own fact) and the
    verdict PASS, signed as the runner signs (attest/sign.py)."""
    statement = json.loads((deferred / "statement.json").read_text())
    pred = statement["predicate"]
    for stage in pred["stages"]:
        if stage["status"] == "DEFERRED":
            stage["status"], stage["token"] = "PASS", stage["token"].replace("_DEFERRED", "_PASS")
            stage["gpuGranted"] = True
    pred["verdict"] = "PASS"
    folder.mkdir()
    sign.sign_attempt(folder, statement, keys.load_signing_key(key))
    return folder


def payload(path: Path) -> dict[str, Any]:
    """The statement a DSSE file signs (the signature is checked where a test needs it)."""
    return json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))  # type: ignore[no-any-return]


def vsa(attempt: Path) -> dict[str, Any]:
    return payload(attempt / sign.VSA_FILE)


def result_statement(attempt: Path) -> dict[str, Any]:
    return payload(attempt / sign.TEST_RESULT_FILE)
