"""Node packages the tests run as independent evaluators, installed from the npm registry by
.ci/run (into .cache/NAME, named by an environment variable) or, when missing, here. A test that
needs one fails, never skips, without it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def node_modules(package_json: Path, env: str, cache_name: str, marker: str) -> Path:
    """The node_modules folder holding `marker` (a package path), installed from `package_json`
    into $env, else .cache/`cache_name`, if it is not there yet."""
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.fail("node and npm are needed for the independent checks: apt-get install nodejs npm")
    folder = Path(os.environ.get(env) or ROOT / ".cache" / cache_name)
    modules = folder / "node_modules"
    if not (modules / marker).is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(package_json, folder / "package.json")
        p = subprocess.run(
            ["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(folder)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if p.returncode != 0 or not (modules / marker).is_dir():
            pytest.fail(f"npm could not install {package_json} into {folder}: {p.stderr[-2000:]}")
    return modules
