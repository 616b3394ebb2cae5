"""`run --here --gpus`: the probes see exactly the GPUs asked for, and none without the option, as
the environment of the sandboxed command itself shows it (bubblewrap on this host, no engine).
CI has no GPU: what is checked is what CUDA and the NVIDIA runtime read (CUDA_VISIBLE_DEVICES,
NVIDIA_VISIBLE_DEVICES), and that the runner's own IMAGEGATE_* variables never reach the probes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from imagegate.domain.gpus import GpuRequest, parse
from imagegate.drivers import local

SHOW = "import json, os; print(json.dumps(dict(os.environ)))"


def seen(
    monkeypatch: pytest.MonkeyPatch, runner_env: dict[str, str], gpus: GpuRequest | None
) -> dict[str, str]:
    """The environment a probe's command gets from a LocalDriver started with `runner_env`."""
    for k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "OTHER_VISIBLE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in runner_env.items():
        monkeypatch.setenv(k, v)
    driver = local.LocalDriver(sys.executable, gpus=gpus, isolation=local.key_isolation(signing=False))
    assert driver.isolation.bwrap is not None, driver.isolation.reason
    env = driver.gpu_env()
    with driver.isolation.seccomp_fd() as fd:
        argv = driver.sandboxed([sys.executable, "-c", SHOW], env, seccomp_fd=fd)
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=60, pass_fds=() if fd is None else (fd,)
        )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


RUNNER = {
    "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    "NVIDIA_VISIBLE_DEVICES": "all",
    "IMAGEGATE_KEY_PASSWORD": "x",
    "VAULT_TOKEN": "hvs.whoever-holds-it-signs",  # a hashivault:// key's token
    "VAULT_ADDR": "http://127.0.0.1:8200",  # no secret: passed on as any variable
    "SIGSTORE_ID_TOKEN": "eyJ.whoever-holds-it-signs-keyless",  # an identity token
    "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "asks-github-for-one",  # GitHub's, with id-token: write
    "ACTIONS_ID_TOKEN_REQUEST_URL": "https://pipelines.example/token",
    "GITHUB_REPOSITORY": "org/repo",  # no secret: passed on
}
SECRETS = (
    "VAULT_TOKEN",
    "SIGSTORE_ID_TOKEN",
    "ACTIONS_ID_TOKEN_REQUEST_TOKEN",
    "ACTIONS_ID_TOKEN_REQUEST_URL",
)


def gpu_vars(env: dict[str, str]) -> tuple[str | None, str | None]:
    return env.get("CUDA_VISIBLE_DEVICES"), env.get("NVIDIA_VISIBLE_DEVICES")


@pytest.mark.parametrize(
    ("gpus", "cuda"),
    [
        ("1", "0"),
        ("2", "0,1"),
        ("device=2", "2"),
        ("1,3", "1,3"),
        ("GPU-aaaa1111", "GPU-aaaa1111"),
        ("all", "0,1,2,3"),
    ],
)
def test_here_gpus_gives_the_probes_exactly_those_gpus(
    monkeypatch: pytest.MonkeyPatch, gpus: str, cuda: str
) -> None:
    env = seen(monkeypatch, RUNNER, parse(gpus))
    assert gpu_vars(env) == (cuda, "all")  # `all`: the runner's own choice stands
    assert not [k for k in env if k.startswith("IMAGEGATE_")]
    assert not [k for k in SECRETS if k in env]
    assert (env["VAULT_ADDR"], env["GITHUB_REPOSITORY"]) == (RUNNER["VAULT_ADDR"], "org/repo")
    assert env["TMPDIR"] == "/tmp"  # the sandbox's own /tmp, the host's is read-only there


def test_here_without_gpus_hides_them_all(monkeypatch: pytest.MonkeyPatch) -> None:
    env = seen(monkeypatch, RUNNER, None)
    assert gpu_vars(env) == ("", "void")
    assert not [k for k in env if k.startswith("IMAGEGATE_")]


@pytest.mark.parametrize("hidden", ["", "void", "none"])
def test_here_gpus_all_undoes_a_runner_that_hides_its_gpus(
    monkeypatch: pytest.MonkeyPatch, hidden: str
) -> None:
    # A runner started with its GPUs hidden (a CI job's default): --gpus all shows them again.
    env = seen(monkeypatch, {"CUDA_VISIBLE_DEVICES": hidden, "NVIDIA_VISIBLE_DEVICES": hidden}, parse("all"))
    assert gpu_vars(env) == (None, None)
    # Only the hiding values go: other variables of the runner stay.
    env = seen(monkeypatch, {"CUDA_VISIBLE_DEVICES": hidden, "NVIDIA_VISIBLE_DEVICES": "0"}, parse("all"))
    assert gpu_vars(env) == (None, "0")
    env = seen(monkeypatch, {"CUDA_VISIBLE_DEVICES": "1", "OTHER_VISIBLE": hidden}, parse("all"))
    assert gpu_vars(env) == ("1", None) and env["OTHER_VISIBLE"] == hidden
