"""`run --driver`: the names, their contradictions, and what a missing engine says."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.drivers.test_sandbox import DAEMON, alive_with
from tests.helpers import PODMAN_SOCK, default_signals, imagegate


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--driver", "lxc"], "--driver 'lxc': unknown driver"),
        (["--here", "--driver", "rootfs"], "--here and --driver rootfs contradict each other"),
        (["--driver", "rootfs", "--gpus", "all"], "--gpus all: no NVIDIA GPU on this host (generated from"),
        (["--driver", "rootfs", "--pull", "never"], "--pull never: the rootfs driver has no engine to pull"),
        (["--driver", "docker", "--python", "python3"], "--python goes with --here"),
    ],
)
def test_contradicting_options_are_usage_errors(args: list[str], message: str, tmp_path: Path) -> None:
    r = imagegate("run", "imagegate-test/python", *args, "--no-sign", "-o", str(tmp_path))
    assert r.returncode == 3, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_no_engine_says_that_rootfs_exists(tmp_path: Path) -> None:
    r = imagegate("run", "imagegate-test/python", "--no-sign", "-o", str(tmp_path),
                  env={"DOCKER_HOST": "unix:///nonexistent"})  # fmt: skip
    assert r.returncode == 2
    assert "container engine at unix:///nonexistent: not reachable" in r.stderr
    assert "--driver rootfs" in r.stderr


def test_podman_driver_runs_in_podman_and_refuses_docker(
    podman: str, images: dict[str, str], tmp_path: Path
) -> None:
    r = imagegate("run", images["vllm-like"], "--driver", "podman", "-p", "python", "--no-sign", "--format", "json",
                  "-o", str(tmp_path / "p"), env={"DOCKER_HOST": PODMAN_SOCK})  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.json()["predicate"]["environment"]["engine"] == "podman"
    wrong = imagegate("run", images["vllm-like"], "--driver", "podman", "--no-sign", "-o", str(tmp_path / "d"),
                      env={"DOCKER_HOST": "unix:///var/run/docker.sock"})  # fmt: skip
    assert wrong.returncode == 3
    assert "--driver podman: the engine at unix:///var/run/docker.sock is docker, not Podman" in wrong.stderr


def test_here_is_driver_here(tmp_path: Path) -> None:
    r = imagegate("run", "--driver", "here", "-p", "python", "-m", "json", "--python", sys.executable,
                  "--no-sign", "--format", "json", "-o", str(tmp_path))  # fmt: skip
    # This environment's own `pip check` decides: the verdict is its, and so is the exit code.
    broken = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True).returncode != 0
    assert (r.returncode, r.json()["predicate"]["verdict"]) == ((1, "FAIL") if broken else (0, "PASS")), (
        r.stderr
    )
    assert r.json()["predicate"]["environment"]["driver"] == "local"


def test_unprivileged_user_runs_a_registry_image(pushed_vllm: str, tmp_path: Path) -> None:
    # As nobody, no engine: unpacking keeps nobody's ownership (said in the evidence), the sandbox
    # runs in nobody's user namespace.
    home = Path(tempfile.mkdtemp(prefix="imagegate-nobody-"))
    os.chmod(home, 0o777)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_CACHE_HOME": str(home / "cache"),
           "XDG_CONFIG_HOME": str(home / "config"), "DOCKER_HOST": "unix:///nonexistent"}  # fmt: skip
    p = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m", "imagegate", "run",
         f"docker://{pushed_vllm}", "-p", "python", "-m", "av", "--driver", "rootfs", "--no-sign",
         "--format", "json", "-o", str(home / "out")],
        capture_output=True, text=True, env=env, timeout=600, cwd="/",
    )  # fmt: skip
    subprocess.run(["rm", "-rf", str(home)], check=False)
    assert p.returncode == 0, p.stderr
    predicate = json.loads(p.stdout)["predicate"]
    assert predicate["verdict"] == "PASS"
    assert any("ownership" in n for n in predicate["environment"]["image_source"]["not_applied"])


@pytest.mark.signals
def test_ctrl_c_during_a_rootfs_run_leaves_nothing(
    pushed_vllm: str, root_cache: dict[str, str], tmp_path: Path
) -> None:
    mark = f"imagegate-mark-{uuid.uuid4().hex}"
    pipeline = tmp_path / "daemon.yaml"
    pipeline.write_text(
        "apiVersion: imagegate/v1\nname: daemon\nstages:\n  - id: daemon\n    probe: cli\n    timeout: 10m\n"
        f"    with:\n      command: [python3]\n      args: [-c, {json.dumps(DAEMON)}, {mark}, '600']\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-m", "imagegate", "run", f"docker://{pushed_vllm}", "--driver", "rootfs", "-p",
         str(pipeline), "--no-sign", "-o", str(tmp_path / "out")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, **root_cache},
        preexec_fn=default_signals,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not alive_with(mark):
        assert p.poll() is None and time.monotonic() < deadline, "the stage's daemon never started"
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "nothing was left running" in err
    assert alive_with(mark) == []
