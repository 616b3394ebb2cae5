"""The oldest Python the probes support, in a real image: Debian 11's Python 3.9 (no older CPython
is obtainable from the registries the set-up reaches), and Debian 11's Python 2.7 as the
interpreter that is too old and must be named as such."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from imagegate.drivers.loader import LOADER, TOO_OLD_EXIT
from tests.helpers import DOCKER_SOCK, imagegate

OLDEST = "3.9"


def test_every_probe_runs_on_the_oldest_supported_python(images: dict[str, str], tmp_path: Path) -> None:
    r = imagegate("run", images["oldest-vllm-like"], "-p", "vllm", "-o", str(tmp_path), "--no-sign")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verdict: CPU_PASS_GPU_CLI_DEFERRED" in r.stdout
    statement = json.loads(next(tmp_path.glob("*/*/statement.json")).read_text())
    assert statement["predicate"]["environment"]["python"].startswith(OLDEST + ".")
    got = {s["id"]: s["status"] for s in statement["predicate"]["stages"]}
    # every probe ran to a verdict of its own on that Python: none crashed, none went missing
    assert got == {
        "pip_check": "PASS",
        "find_spec": "PASS",
        "gpu_cli": "DEFERRED",
        "cli_cpu": "PASS",
        "av_roundtrip": "PASS",
        "layers": "PASS",  # and the image's layers, verified from the engine beside them
    }, got


def test_the_loader_names_a_too_old_interpreter(images: dict[str, str]) -> None:
    p = subprocess.run(
        ["docker", "-H", DOCKER_SOCK, "run", "--rm", "-i", "--network", "none",
         images["oldest"], "python2.7", "-c", LOADER, "0" * 64],
        input=b"", capture_output=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == TOO_OLD_EXIT, p.stderr
    assert p.stderr.decode().startswith("imagegate: too old: Python 2.7."), p.stderr


def test_a_run_on_a_too_old_interpreter_is_an_error_that_names_it(
    images: dict[str, str], tmp_path: Path
) -> None:
    pipe = tmp_path / "p.yaml"
    pipe.write_text(
        "apiVersion: imagegate/v1\nname: old\npython: python2.7\nstages:\n"
        "  - id: mods\n    probe: find_spec\n    with: {modules: [json]}\n"
    )
    r = imagegate("run", images["oldest"], "-p", str(pipe), "-o", str(tmp_path / "o"), "--no-sign")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    statement = json.loads(next((tmp_path / "o").glob("*/*/statement.json")).read_text())
    (mods,) = statement["predicate"]["stages"]
    assert mods["status"] == "ERROR"
    assert "python2.7: Python 2.7." in mods["detail"] and "the probes need Python" in mods["detail"], mods
