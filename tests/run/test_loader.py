"""The docker driver's loader runs first in the image's python, whatever its version: on an
interpreter older than 3.8 (Python 2 included) it must say so and exit 96, not crash."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import pytest

from imagegate.drivers.docker import LOADER, TOO_OLD_EXIT


def pyenv_python(prefix: str) -> str | None:
    if not shutil.which("pyenv"):
        return None
    versions = subprocess.run(["pyenv", "versions", "--bare"], capture_output=True, text=True).stdout.split()
    match = [v for v in versions if v.startswith(prefix)]
    if not match:
        return None
    env = dict(os.environ, PYENV_VERSION=match[0])
    p = subprocess.run(["pyenv", "which", "python"], capture_output=True, text=True, env=env)
    return p.stdout.strip() if p.returncode == 0 else None


@pytest.mark.parametrize("prefix", ["2.7", "3.6", "3.7"])
def test_old_interpreters_are_named(prefix: str) -> None:
    py = pyenv_python(prefix)
    if py is None:
        pytest.skip(f"no Python {prefix} on this machine")
    p = subprocess.run([py, "-c", LOADER, "0" * 64], input=b"", capture_output=True, timeout=30)
    assert p.returncode == TOO_OLD_EXIT
    assert p.stderr.decode().startswith(f"imagegate: too old: Python {prefix}")


def test_loader_checks_the_bundle_digest(tmp_path: object) -> None:
    data = b"not the bundle"
    wrong = hashlib.sha256(b"other").hexdigest()
    p = subprocess.run(
        [shutil.which("python3") or "python3", "-c", LOADER, wrong],
        input=b"%d\n" % len(data) + data,
        capture_output=True,
        timeout=30,
    )
    assert p.returncode == 97
    assert b"bundle transfer incomplete" in p.stderr
