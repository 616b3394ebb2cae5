"""Fixtures for the attestation tests: keys, a real attempt folder made by `imagegate run --here`
(no engine needed), the CLI in a subprocess as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from imagegate.attest import keys, sign


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Result:
    p = subprocess.run(
        [sys.executable, "-c", "from imagegate.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        cwd=cwd,
        timeout=300,
    )
    return Result(p.returncode, p.stdout, p.stderr)


@pytest.fixture
def key() -> keys.SigningKey:
    return keys.generate()


@pytest.fixture
def keypair(tmp_path: Path) -> tuple[Path, Path]:
    priv, pub = keys.write_keypair(tmp_path / "keys" / "gate", keys.generate(), None)
    return priv, pub


def make_attempt(out: Path) -> Path:
    """A real attempt folder: the python pipeline run in this environment."""
    r = cli(
        "run",
        "--here",
        "--python",
        sys.executable,
        "-p",
        "python",
        "-m",
        "json",
        "-o",
        str(out),
        "-q",
        "--no-sign",
    )
    assert r.returncode == 0, r.stderr
    (attempt,) = [p.parent for p in out.glob("*/*/statement.json")]
    return attempt


@pytest.fixture(scope="session")
def pristine_attempt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_attempt(tmp_path_factory.mktemp("runs"))


@pytest.fixture
def attempt(pristine_attempt: Path, tmp_path: Path) -> Path:
    """A private copy of the real attempt, free to tamper with."""
    import shutil

    dst = tmp_path / "attempt"
    shutil.copytree(pristine_attempt, dst)
    return dst


def statement_of(attempt: Path) -> dict[str, Any]:
    return json.loads((attempt / "statement.json").read_text())


@pytest.fixture
def signed(attempt: Path, keypair: tuple[Path, Path]) -> sign.Signed:
    return sign.sign_attempt(attempt, statement_of(attempt), keys.load_signing_key(keypair[0]))
