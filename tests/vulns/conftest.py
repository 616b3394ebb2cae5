"""The real advisory data (a subset of a PyPA advisory database snapshot, kept in the repository:
tests/vulns/data/advisory-db, with its licence and source) and the test images with
known-vulnerable and current releases."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADVISORY_DB = ROOT / "tests" / "vulns" / "data" / "advisory-db"


@pytest.fixture(scope="session")
def advisory_db() -> Path:
    assert (ADVISORY_DB / "vulns").is_dir(), f"the advisory data is part of the repository: {ADVISORY_DB}"
    return ADVISORY_DB


@pytest.fixture(scope="session")
def vuln_images() -> dict[str, str]:
    """Builds (or finds, by recipe hash) the images these tests use."""
    sys.path.insert(0, str(ROOT / "tests" / "images"))
    import build  # type: ignore[import-not-found]

    names = ("python", "vulnerable", "clean-current")
    for name in names:
        build.build(name)
    return {n: f"imagegate-test/{n}:latest" for n in names}


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def imagegate(*args: str, cwd: Path | None = None) -> Ran:
    """The installed CLI in a subprocess, as a user runs it."""
    exe = Path(sys.executable).parent / "imagegate"
    p = subprocess.run(
        [str(exe), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        env=dict(os.environ, COLUMNS="200"),
    )
    return Ran(p.returncode, p.stdout, p.stderr)
