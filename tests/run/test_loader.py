"""The docker driver's loader runs first in the image's python, whatever its version. Its
too-old message is tested on a real Python 2.7 image in tests/run/test_oldest_python.py."""

from __future__ import annotations

import hashlib
import shutil
import subprocess

from imagegate.drivers.loader import LOADER


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
