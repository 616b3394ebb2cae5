"""`imagegate run --here` for real: what runs inside a Pod, pointed at a real virtual environment
with real packages. The conflict is real for pip: a wheel built here (no network) whose metadata
requires `pip<1` and a distribution that is not installed."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import imagegate

DIST = "imagegate_conflict_demo"


def _wheel(folder: Path) -> Path:
    files = {
        f"{DIST}/__init__.py": b"VALUE = 1\n",
        f"{DIST}-1.0.dist-info/METADATA": (
            "Metadata-Version: 2.1\n"
            f"Name: {DIST}\n"
            "Version: 1.0\n"
            "Requires-Dist: pip<1\n"
            "Requires-Dist: imagegate-absent-dependency>=1\n"
        ).encode(),
        f"{DIST}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for name, data in files.items()
    )
    files[f"{DIST}-1.0.dist-info/RECORD"] = (record + f"{DIST}-1.0.dist-info/RECORD,,\n").encode()
    path = folder / f"{DIST}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    env = root / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, capture_output=True, timeout=300)
    return env


def _here(env: Path, out: Path, *extra: str) -> tuple[int, str]:
    res = imagegate(
        "run", "--here", "--python", str(env / "bin" / "python"), "-p", "python", "-o", str(out), *extra
    )
    return res.returncode, res.stdout + res.stderr


def test_run_here_names_a_real_pip_conflict_and_exits_1(venv: Path, tmp_path: Path) -> None:
    code, text = _here(venv, tmp_path / "clean", "-m", "json")
    assert code == 0, text  # a fresh venv: pip check passes, the module is found

    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-deps",
            "-q",
            str(_wheel(tmp_path)),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    check = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "check"], capture_output=True, text=True
    )
    assert check.returncode == 1 and "pip<1" in check.stdout  # pip itself calls it broken

    code, text = _here(venv, tmp_path / "broken", "-m", DIST)
    flat = " ".join(text.split())
    assert code == 1, text
    assert "PIP_CHECK_FAIL" in flat, text
    assert "pip<1" in flat and "imagegate-absent-dependency" in flat, text
    assert "verdict: FAIL" in flat
