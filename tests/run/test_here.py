"""`run --here` (the local driver) and find_spec's traps, with a real interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import imagegate


def run_here(tmp_path: Path, *modules: str, pythonpath: Path) -> dict:  # type: ignore[type-arg]
    args = ["run", "--here", "--python", sys.executable, "-p", "python", "-o", str(tmp_path / "out")]
    for m in modules:
        args += ["-m", m]
    r = imagegate(*args, "--format", "json", env={"PYTHONPATH": str(pythonpath)}, cwd=tmp_path)
    assert r.returncode == 1, r.stderr  # every call names a missing module: find_spec FAILs
    att = next((tmp_path / "out").glob("*/*/"))
    return json.loads((att / "stages/02-find_spec/result.json").read_text())


def test_find_spec_reports_namespace_hits_parent_errors_and_missing(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    (lib / "stray_folder").mkdir(parents=True)  # no __init__.py: a namespace package
    (lib / "boom").mkdir()
    (lib / "boom" / "__init__.py").write_text("raise RuntimeError('CUDA driver too old')\n")
    (lib / "okpkg").mkdir()
    (lib / "okpkg" / "__init__.py").write_text("")
    (lib / "okpkg" / "sub.py").write_text("")
    # a folder in the working directory must not satisfy anything: the probe runs elsewhere
    (tmp_path / "cwd_only").mkdir()
    result = run_here(
        tmp_path, "okpkg.sub", "stray_folder", "boom.sub", "nothere.sub", "cwd_only", "json", pythonpath=lib
    )
    assert result["status"] == "FAIL"
    recs = {r["module"]: r for r in result["data"]["modules"]}
    assert recs["okpkg.sub"]["found"] and recs["okpkg.sub"]["origin"].endswith("okpkg/sub.py")
    assert recs["stray_folder"]["namespace"] is True
    assert "only a namespace package" in recs["stray_folder"]["reason"]
    assert recs["boom.sub"]["error"] == {"type": "RuntimeError", "message": "CUDA driver too old"}
    assert recs["nothere.sub"]["reason"] == "parent package nothere is not installed"
    assert recs["cwd_only"]["found"] is False
    assert recs["json"]["found"] is True
    detail = result["detail"]
    for name in ("stray_folder", "boom.sub", "nothere.sub", "cwd_only"):
        assert name in detail
    assert "okpkg.sub:" not in detail


def test_namespace_allowed_by_the_pipeline(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    (lib / "nvidia").mkdir(parents=True)
    pipe = tmp_path / "p.yaml"
    pipe.write_text(
        "apiVersion: imagegate/v1\nname: ns\nstages:\n  - id: mods\n    probe: find_spec\n"
        "    with: {modules: [nvidia], allow_namespace: [nvidia]}\n"
    )
    r = imagegate(
        "run",
        "--here",
        "--python",
        sys.executable,
        "-p",
        str(pipe),
        "-o",
        str(tmp_path / "o"),
        env={"PYTHONPATH": str(lib)},
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_here_uses_the_activated_environment(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {"VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    r = imagegate("run", "--here", "-p", "python", "-o", str(tmp_path / "o"), "--format", "json", env=env)
    assert r.returncode == 0, r.stderr
    executable = r.json()["predicate"]["environment"]["in_image"]["executable"]
    assert executable.startswith(str(venv)), executable


def test_no_place_for_a_default_key_runs_unsigned_and_says_so(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")  # the config folder would have to be inside a file: cannot be created
    env = {"XDG_CONFIG_HOME": str(blocker / "config"), "IMAGEGATE_SIGNING_KEY": ""}
    r = imagegate(
        "run",
        "--here",
        "--python",
        sys.executable,
        "-p",
        "python",
        "-m",
        "json",
        "-o",
        str(tmp_path / "o"),
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "the attempt will not be signed" in r.stderr
    attempt = next((tmp_path / "o").glob("*/*/"))
    assert (attempt / "statement.json").is_file()
    assert not (attempt / "attestation.dsse.json").exists()


def test_an_existing_config_folder_that_cannot_be_written_runs_unsigned_and_says_so(tmp_path: Path) -> None:
    """The folder is there (made by an earlier `sudo imagegate`, or a home mounted read-only in a
    container) but no key can be created in it: the run goes on unsigned and says so."""
    config = tmp_path / "config"
    folder = config / "imagegate"
    folder.mkdir(parents=True)
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "imagegate", "run", "--here", "--python", sys.executable]
    cmd += ["-p", "python", "-m", "json", "-o", str(out)]
    if os.geteuid() == 0:
        # Permissions do not bind root: mount the folder read-only in a private mount namespace,
        # as a read-only home in a container is.
        remount = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", remount, "sh", str(folder), *cmd]
    else:
        folder.chmod(0o555)
    env = dict(os.environ, XDG_CONFIG_HOME=str(config), IMAGEGATE_SIGNING_KEY="")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    finally:
        folder.chmod(0o755)
    assert r.returncode == 0, r.stderr
    assert "the attempt will not be signed" in r.stderr and str(folder) in r.stderr, r.stderr
    attempt = next(out.glob("*/*/"))
    assert (attempt / "statement.json").is_file()
    assert not (attempt / "attestation.dsse.json").exists()
    assert list(folder.iterdir()) == []


def test_av_roundtrip_with_this_environments_pyav(tmp_path: Path) -> None:
    """The image tests use PyAV 14; the test environment has a current PyAV: both must work."""
    # PyAV is a test dependency (pyproject.toml [test]): never skipped
    pipe = tmp_path / "av.yaml"
    pipe.write_text(
        "apiVersion: imagegate/v1\nname: av\nstages:\n  - id: av_roundtrip\n    probe: av_roundtrip\n"
    )
    r = imagegate(
        "run", "--here", "--python", sys.executable, "-p", str(pipe), "-o", str(tmp_path / "o"), "--no-sign"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "AV_ROUNDTRIP_PASS" in r.stdout and "frames=8" in r.stdout
