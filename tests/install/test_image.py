"""The image of imagegate (image/Dockerfile, built by scripts/build-image.py FROM a Debian root
made with mmdebstrap) runs a real acceptance both ways its users run it: against the host's engine
through its socket, and with no engine at all (--driver rootfs, bubblewrap inside), where it needs
three `docker run` flags and, without them, refuses naming them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from imagegate.drivers.bwrap import CONTAINER_FLAGS

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
TAG = "imagegate-test/imagegate:latest"
SOCKET = "/var/run/docker.sock"
# What the image's header and the rootfs driver's refusal tell users to pass (CONTAINER_FLAGS).
ROOTFS_FLAGS = ["--security-opt", "seccomp=unconfined", "--security-opt", "systempaths=unconfined",
                "--security-opt", "apparmor=unconfined"]  # fmt: skip


def _build(tag: str, *args: str) -> str:
    built = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build-image.py"), "--tag", tag, *args],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    assert built.stdout.strip() == tag
    return tag


@pytest.fixture(scope="module")
def image(engine: str) -> str:
    return _build(TAG)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    tmp_path.chmod(0o777)  # the image's user (uid 10001) writes its evidence there
    return tmp_path


def _docker_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "run", "--rm", *args], capture_output=True, text=True, timeout=600)


def test_the_image_is_small_not_root_and_names_its_version(image: str) -> None:
    size = int(subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", image],
                              capture_output=True, text=True, check=True).stdout)  # fmt: skip
    assert size <= 400_000_000  # README: the base root, a Python venv, imagegate's dependencies
    uid = _docker_run("--entrypoint", "id", image, "-u")
    assert uid.stdout.strip() == "10001", uid.stderr
    version = _docker_run(image, "--version")
    assert version.returncode == 0 and version.stdout.startswith("imagegate "), version.stderr


def test_against_the_hosts_engine_through_its_socket(image: str, images: dict[str, str], work: Path) -> None:
    _accepts_and_rejects_through_the_socket(image, images, work)


def test_python_3_13_from_a_debian_13_root_accepts_and_rejects(
    engine: str, images: dict[str, str], work: Path
) -> None:
    """The Python versions claimed are the ones tested: 3.11 (Debian 12, this host's) and 3.13."""
    trixie = _build("imagegate-test/imagegate:trixie", "--suite", "trixie")
    python = _docker_run("--entrypoint", "python3", trixie, "--version")
    assert python.stdout.startswith("Python 3.13."), python.stdout + python.stderr
    _accepts_and_rejects_through_the_socket(trixie, images, work)


def _accepts_and_rejects_through_the_socket(image: str, images: dict[str, str], work: Path) -> None:
    engine = ["--network", "none", "-v", f"{SOCKET}:{SOCKET}", "--group-add", str(os.stat(SOCKET).st_gid),
              "-v", f"{work}:/work", image, "run", images["python"], "-p", "python", "--no-sign"]  # fmt: skip
    ok = _docker_run(*engine, "-m", "json")
    assert ok.returncode == 0 and "verdict: PASS" in ok.stdout, ok.stdout + ok.stderr
    bad = _docker_run(*engine, "-m", "no_such_module")
    assert bad.returncode == 1 and "verdict: FAIL" in bad.stdout, bad.stdout + bad.stderr
    # the evidence is where the user mounted it
    assert len(list(work.glob("imagegate-runs/sha256-*/*/run.json"))) == 2


@pytest.fixture
def archive(images: dict[str, str], work: Path) -> str:
    subprocess.run(["docker", "save", "-o", str(work / "image.tar"), images["python"]], check=True)
    (work / "image.tar").chmod(0o644)
    return "docker-archive:/work/image.tar"


def test_with_no_engine_under_the_flags_the_rootfs_driver_accepts(
    image: str, archive: str, work: Path
) -> None:
    assert all(f in CONTAINER_FLAGS for f in ROOTFS_FLAGS[1::2])
    done = _docker_run("--network", "none", *ROOTFS_FLAGS, "-v", f"{work}:/work", image,
                       "run", archive, "-p", "python", "-m", "json", "--driver", "rootfs", "--no-sign")  # fmt: skip
    assert done.returncode == 0 and "verdict: PASS" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("given", [[], ROOTFS_FLAGS[:2]], ids=["no flags", "seccomp only"])
def test_without_the_flags_the_rootfs_driver_refuses_naming_them(
    given: list[str], image: str, archive: str, work: Path
) -> None:
    done = _docker_run("--network", "none", *given, "-v", f"{work}:/work", image,
                       "run", archive, "-p", "python", "-m", "json", "--driver", "rootfs", "--no-sign")  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("imagegate: error:")]
    assert "the rootfs driver cannot sandbox on this host" in error
    assert all(f in error for f in ROOTFS_FLAGS[1::2]), error
    assert not list(work.glob("imagegate-runs/*/*/run.json"))  # refused before any attempt
