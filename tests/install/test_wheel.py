"""imagegate as a user installs it: the wheel built from this tree (`pip wheel`, the in-image
probes, pipelines, manifests and admission policies inside it), installed into a fresh venv with no test or
development dependency, runs a real acceptance against the engine (a PASS and a FAIL), and
`pod render` needs the `kube` extra, saying so, until it is installed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib

from imagegate.policies import NAMES
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
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("dist")
    _pip("wheel", "--no-deps", "-w", str(work), str(ROOT), python=Path(sys.executable))
    (built,) = work.glob("imagegate-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("install")
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


def test_the_installed_wheel_carries_the_policies_of_its_version(venv: Path, tmp_path: Path) -> None:
    """A user who installed the wheel gets the admission policies from it, filled in."""
    listed = _imagegate(venv, "policies", "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1 : 1 + len(NAMES)]] == list(NAMES)
    made = _imagegate(venv, "keygen", "--out", "gate", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    written = _imagegate(
        venv, "policies", "write", "--key", "gate.pub", "--image", "r.example/*", "--out", "p", cwd=tmp_path
    )
    assert written.returncode == 0, written.stderr
    version = _imagegate(venv, "--version", cwd=tmp_path).stdout.split()[1]
    for name in NAMES:
        assert (tmp_path / "p" / f"{name}.yaml").read_text().startswith(f"# written by imagegate {version} ")


def _head() -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


def test_version_names_the_commit_the_wheel_was_built_from(venv: Path, tmp_path: Path) -> None:
    said = _imagegate(venv, "--version", cwd=tmp_path)
    assert said.returncode == 0, said.stderr
    m = re.fullmatch(r"imagegate (\S+) \(commit ([0-9a-f]{7,})(, with uncommitted changes)?\)\n", said.stdout)
    assert m is not None, said.stdout
    assert _head().startswith(m.group(2))
    assert f"+g{m.group(2)}" in m.group(1)  # the version itself names the commit (setuptools-scm)


def test_a_source_tree_without_git_builds_the_fallback_version(tmp_path: Path) -> None:
    """An archive of the source (no .git): the version pyproject.toml names as the fallback."""
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
    (tmp_path / "src").mkdir()
    subprocess.run(["tar", "-x", "-C", str(tmp_path / "src")], input=archive, check=True)
    _pip(
        "wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(tmp_path / "src"), python=Path(sys.executable)
    )
    fallback = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["version"][
        "fallback-version"
    ]
    assert [w.name for w in (tmp_path / "dist").glob("*.whl")] == [f"imagegate-{fallback}-py3-none-any.whl"]


@pytest.mark.parametrize("tool", ["uv"])  # README's `pipx install .`: tests/install/test_first_screen.py
def test_pipx_and_uv_install_it_as_a_command(tool: str, wheel: Path, tmp_path: Path) -> None:
    """As users install command-line tools, each in its own venv with its command on PATH (the
    name is not published): `uv tool install FILE` from the built wheel (`pipx install .` from a
    clone, as README's first screen says it, is followed by its own test)."""
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"PIPX_HOME": str(tmp_path / "home"), "PIPX_BIN_DIR": str(tmp_path / "bin"),
            "UV_TOOL_DIR": str(tmp_path / "home"), "UV_TOOL_BIN_DIR": str(tmp_path / "bin"),
            "UV_PYTHON_DOWNLOADS": "never"}  # fmt: skip
    argv = [str(bin_dir / "pipx"), "install", str(ROOT)]
    if tool == "uv":
        argv = [str(bin_dir / "uv"), "tool", "install", "--python", sys.executable, str(wheel)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    said = subprocess.run(
        [str(tmp_path / "bin" / "imagegate"), "--version"], capture_output=True, text=True, env=env
    )
    assert said.returncode == 0 and said.stdout.startswith("imagegate ") and "(commit " in said.stdout, said
