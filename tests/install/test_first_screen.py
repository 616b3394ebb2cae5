"""README's first screen, followed as written: its commands are read from README.md (so the page
and the test cannot drift) and run in a fresh home folder by a user who is not root but may use
the Docker engine (the `docker` group): clone, the one root step (`sudo apt install pipx`, run
here as root, or found done), `pipx install .`, one run on a small image, and the `verify`
command that run printed. No public image can be pulled here: the page's example image is
replaced by a small one pushed to a registry on 127.0.0.1 (and untagged, so the run pulls it).
The clone is of the commit checked out. With IMAGEGATE_FIRST_SCREEN_RECORD=FILE it writes what
each command printed, and how long it took, as a record (benchmarks/records)."""

from __future__ import annotations

import grp
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.oci.infra import Registry, sh, start_registry

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
FIRST_SCREEN_S = 300  # README: a verified PASS within five minutes of starting
URL = "<this repository's URL>"
EXAMPLE_IMAGE = "python:3.12-slim"
NOBODY = 65534  # a user with no home and no rights of its own
ATTEMPT = re.compile(r"imagegate-runs/\S+/attestation\.dsse\.json")


def first_screen() -> list[str]:
    """The commands (`$ ` lines) of README's first console block, which comes right after the
    page's first paragraph and its heading: the first screen."""
    text = (ROOT / "README.md").read_text()
    head, block = text.split("```console\n", 1)
    assert head.count("\n## ") == 1, "the first screen's block is the first thing after the first paragraph"
    return [line[2:] for line in block.split("```", 1)[0].splitlines() if line.startswith("$ ")]


def test_the_first_screen_is_clone_install_run_verify_with_one_root_step() -> None:
    steps = first_screen()
    assert [s.split()[0] for s in steps] == ["git", "sudo", "pipx", "imagegate", "imagegate"], steps
    assert steps[0] == f"git clone {URL} imagegate && cd imagegate"
    assert steps[1] == "sudo apt install pipx"  # the one root step, one package
    assert sum("sudo" in s for s in steps) == 1
    assert steps[3].startswith(f"imagegate run {EXAMPLE_IMAGE} ")
    assert steps[4].startswith("imagegate verify ")


@pytest.fixture
def home() -> Iterator[Path]:
    """A fresh home folder the user owns, outside pytest's (root-only) temporary folders."""
    folder = Path(tempfile.mkdtemp(prefix="imagegate-first-home-"))
    os.chown(folder, NOBODY, NOBODY)
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def small_image(images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A small image with Python, in a registry on 127.0.0.1, as the engine would pull it."""
    registry: Registry = start_registry(tmp_path_factory.mktemp("first-registry"))
    ref = f"{registry.host}/library/{EXAMPLE_IMAGE}"
    try:
        sh("docker", "tag", images["python"], ref)
        sh("docker", "push", "-q", ref, timeout=600)
        sh("docker", "rmi", ref)
        yield ref
    finally:
        subprocess.run(["docker", "rmi", ref], capture_output=True)
        registry.stop()


def _as_user(command: str, home: Path, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """`command` in bash as the user: NOBODY with the docker group, a fresh HOME, the PATH a
    login shell gives once ~/.local/bin exists (`pipx ensurepath`)."""
    docker_gid = (
        grp.getgrnam("docker").gr_gid if _has_group("docker") else os.stat("/var/run/docker.sock").st_gid
    )
    env = {"HOME": str(home), "USER": "nobody", "LANG": "C.UTF-8", "PATH": f"{home}/.local/bin:/usr/bin:/bin"}
    env |= {k: v for k, v in os.environ.items() if k in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_INDEX_URL")}
    user = [f"--reuid={NOBODY}", f"--regid={NOBODY}", f"--groups={docker_gid}"]
    t0 = time.monotonic()
    done = subprocess.run(
        ["setpriv", *user, "--", "bash", "-c", command],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=FIRST_SCREEN_S * 2,
    )  # fmt: skip
    return done, time.monotonic() - t0


def _has_group(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def _root_step(step: str) -> tuple[str, float]:
    """`sudo apt install pipx`, run as root (here already) unless the package is installed."""
    package = step.split()[-1]
    t0 = time.monotonic()
    if subprocess.run(["dpkg", "-s", package], capture_output=True).returncode != 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        done = subprocess.run(
            ["apt-get", "install", "-y", "-q", package], capture_output=True, text=True, env=env, timeout=600
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done.stdout, time.monotonic() - t0
    return f"({package} is installed already)\n", 0.0


def _source(home: Path) -> str:
    """What the user clones: this checkout's commit, in a repository the user may read."""
    bare = home / "origin.git"
    sh("git", "clone", "-q", "--bare", "--no-local", str(ROOT), str(bare))
    sh("chown", "-R", f"{NOBODY}:{NOBODY}", str(bare))
    return str(bare)


def test_the_first_screen_reaches_a_verified_pass_in_five_minutes(home: Path, small_image: str) -> None:
    clone, root_step, install, run, verify = first_screen()
    origin = _source(home)
    said: list[tuple[str, str, float]] = []
    started = time.monotonic()

    done, took = _as_user(clone.replace(URL, origin), home, home)
    assert done.returncode == 0, done.stderr
    said.append((clone, done.stdout + done.stderr, took))
    checkout = home / "imagegate"
    output, took = _root_step(root_step)
    said.append((root_step, output, took))
    for step in (install, run.replace(EXAMPLE_IMAGE, small_image)):
        done, took = _as_user(step, home, checkout)
        assert done.returncode == 0, (step, done.stdout[-3000:], done.stderr[-3000:])
        said.append((step, done.stdout, took))  # the progress on stderr is not the page's
    commit = sh("git", "-C", str(ROOT), "rev-parse", "--short=7", "HEAD").strip()  # what was cloned
    # the version names the commit it was built from (hatch-vcs: the clone's git metadata)
    assert re.search(rf"installed package imagegate \S+\+g{commit}", said[2][1]), said[2][1]
    printed = done.stdout.rstrip().splitlines()
    assert "verdict: PASS" in printed, done.stdout
    assert printed[-2] == "public key: ~/.config/imagegate/signing.pub", done.stdout
    command = printed[-1].removeprefix("to verify: ")
    # the page's verify line is the one a run prints, but for the attempt's folder
    assert ATTEMPT.search(verify) and ATTEMPT.sub("…", verify) == ATTEMPT.sub("…", command), command
    done, took = _as_user(command, home, checkout)
    assert done.returncode == 0 and "verified: verdict PASS, accepted" in done.stdout, done
    said.append((command, done.stdout, took))
    elapsed = time.monotonic() - started
    _record(said, elapsed)
    assert elapsed <= FIRST_SCREEN_S, f"the first screen took {elapsed:.0f} s"


def _record(said: list[tuple[str, str, float]], elapsed: float) -> None:
    out = os.environ.get("IMAGEGATE_FIRST_SCREEN_RECORD")
    if not out:
        return
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    load = os.getloadavg()
    lines = [
        "# README's first screen, followed as written",
        "",
        "Command: `IMAGEGATE_FIRST_SCREEN_RECORD=FILE pytest tests/install/test_first_screen.py`",
        "",
        f"Commit: {commit.strip()} (tree {'dirty' if dirty else 'clean'}); {os.cpu_count()} cores, "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end; "
        f"clone to verified PASS: {elapsed:.0f} s",
        "",
        "```console",
    ]
    for command, output, took in said:
        lines += [f"$ {command}", *output.rstrip("\n").splitlines(), f"# ({took:.0f} s)"]
    Path(out).write_text("\n".join([*lines, "```", ""]))
