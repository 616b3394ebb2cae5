"""Attempts signed by the real runner (`run --here`, real keys) for every verdict a policy must
tell apart: PASS, FAIL, ERROR, a deferred GPU stage, PASS signed by another key, and a completion
of the deferred attempt (no GPU here: it stays deferred). Nothing is mocked; each is made once."""

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


@dataclass(frozen=True)
class Keys:
    key: Path  # the key the policies trust
    pub: Path
    other_key: Path  # a key they do not
    other_pub: Path


@pytest.fixture(scope="session")
def policy_keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    folder = tmp_path_factory.mktemp("policy-keys")
    key, pub = keys.write_keypair(folder / "gate", keys.generate(), None)
    other, other_pub = keys.write_keypair(folder / "other", keys.generate(), None)
    return Keys(key, pub, other, other_pub)


def _run(out: Path, key: Path, *args: str) -> Path:
    r = imagegate("run", "--here", *args, "-o", str(out), "--key", str(key), "-q")
    assert r.returncode in (0, 1, 2), r.stdout + r.stderr
    (attempt,) = [p.parent for p in out.glob("*/*/statement.json")]
    return attempt


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory, policy_keys: Keys) -> dict[str, Path]:
    """name -> attempt folder: pass, fail, error, deferred, other_key, completion."""
    tmp = tmp_path_factory.mktemp("policy-runs")
    py = ("--python", sys.executable, "-p", "python")
    error_pipe = tmp / "error.yaml"
    error_pipe.write_text(ERROR_PIPELINE.format(python=sys.executable))
    made = {
        "pass": _run(tmp / "pass", policy_keys.key, *py, "-m", "json"),
        "fail": _run(tmp / "fail", policy_keys.key, *py, "-m", "no_such_module_anywhere"),
        "error": _run(tmp / "error", policy_keys.key, "-p", str(error_pipe)),
        "deferred": _run(tmp / "deferred", policy_keys.key, "-p", "gpu", "--gpus", "all"),
        "other_key": _run(tmp / "other", policy_keys.other_key, *py, "-m", "json"),
    }
    done = imagegate("complete", str(made["deferred"]), "--here", "--key", str(policy_keys.key), "-q")
    assert done.returncode == 0, done.stdout + done.stderr
    (made["completion"],) = [
        p.parent for p in (tmp / "deferred").glob("*/*/statement.json") if p.parent != made["deferred"]
    ]
    return made


def payload(path: Path) -> dict[str, Any]:
    """The statement a DSSE file signs (the signature is checked where a test needs it)."""
    return json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))  # type: ignore[no-any-return]


def vsa(attempt: Path) -> dict[str, Any]:
    return payload(attempt / sign.VSA_FILE)


def result_statement(attempt: Path) -> dict[str, Any]:
    return payload(attempt / sign.TEST_RESULT_FILE)
