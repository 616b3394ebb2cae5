"""imagegate as a user installs it: the wheel built from this tree (`pip wheel`, the in-image
probes, pipelines and manifests inside it), installed into a fresh venv with no test or
development dependency, runs a real acceptance against the engine (a PASS and a FAIL), and
`pod render` needs the `kube` extra, saying so, until it is installed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import DOCKER_SOCK

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
MAX_VENV_MB = 140  # the base install: kubernetes-validate's ~100 MB of schemas is the kube extra


def _pip(*args: str, python: Path) -> None:
    p = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("install")
    _pip("wheel", "--no-deps", "-w", str(work / "dist"), str(ROOT), python=Path(sys.executable))
    (wheel,) = (work / "dist").glob("imagegate-*.whl")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(work / "venv")], check=True, timeout=300)
    _pip("install", str(wheel), python=work / "venv" / "bin" / "python")
    yield work / "venv"


def _imagegate(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(venv / "bin" / "imagegate"), *args],
        capture_output=True, text=True, timeout=600, cwd=cwd,
        env={**env, "DOCKER_HOST": DOCKER_SOCK},
    )  # fmt: skip


def _megabytes(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6


def test_the_base_install_is_small_and_accepts_and_rejects(
    venv: Path, images: dict[str, str], tmp_path: Path
) -> None:
    assert _megabytes(venv) <= MAX_VENV_MB
    for absent in ("pytest", "kubernetes_validate", "mypy", "jmespath"):
        assert not list((venv / "lib").glob(f"python3*/site-packages/{absent}")), absent
    ok = _imagegate(
        venv, "run", images["python"], "-p", "python", "-m", "json", "--no-sign", "-o", "runs", cwd=tmp_path
    )
    assert ok.returncode == 0 and "verdict: PASS" in ok.stdout, ok.stdout + ok.stderr
    bad = _imagegate(venv, "run", images["python"], "-p", "python", "-m", "no_such_module", "--no-sign", "-o", "runs", cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 1 and "verdict: FAIL" in bad.stdout, bad.stdout + bad.stderr


def test_pod_render_names_the_kube_extra_until_it_is_installed(venv: Path, tmp_path: Path) -> None:
    without = _imagegate(venv, "pod", "render", "example/app:1", cwd=tmp_path)
    assert without.returncode == 3, without.stdout + without.stderr
    assert "Traceback" not in without.stderr
    errors = [line for line in without.stderr.splitlines() if line.startswith("imagegate: error:")]
    assert len(errors) == 1 and "kube extra" in errors[0], without.stderr
    assert "pip install 'imagegate[kube]'" in without.stderr
    _pip("install", "kubernetes-validate>=1.30", python=venv / "bin" / "python")
    done = _imagegate(venv, "pod", "render", "example/app:1", cwd=tmp_path)
    assert done.returncode == 0 and "kind: Job" in done.stdout, done.stderr
