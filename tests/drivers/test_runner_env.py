"""The container drivers and the signing key: a probe in the image sees the image's environment,
never the runner's (its key's path, its passphrase, anything else it holds), and the statement
says how the probes were kept from the key (`keyIsolation`). `run --here`: tests/run/test_here_key.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import imagegate

# Prints the whole environment the probe's command gets.
SHOW_ENV = (
    "apiVersion: imagegate/v1\nname: env\nstages:\n  - id: env\n    probe: cli\n    with:\n"
    '      command: [python3, -c, "import os; print(sorted(os.environ.items()))"]\n'
)
CANARIES = {"IMAGEGATE_KEY_PASSWORD": "canary-passphrase-31c9", "RUNNER_ONLY_CANARY": "canary-value-52e1"}


@pytest.mark.parametrize(("driver", "method"), [("docker", "container"), ("rootfs", "bubblewrap")])
def test_the_probes_get_nothing_of_the_runners_environment(
    driver: str, method: str, images: dict[str, str], root_cache: dict[str, str], tmp_path: Path
) -> None:
    keygen = imagegate("keygen", "--out", str(tmp_path / "k"))
    assert keygen.returncode == 0, keygen.stderr
    key = tmp_path / "k.key"
    pipe = tmp_path / "env.yaml"
    pipe.write_text(SHOW_ENV)
    image = images["python"] if driver == "docker" else f"docker-daemon:{images['python']}"
    env = {**root_cache, **CANARIES, "IMAGEGATE_SIGNING_KEY": str(key)}
    r = imagegate(
        "run", image, "--driver", driver, "-p", str(pipe), "-o", str(tmp_path / "o"), "--format", "json",
        env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (attempt,) = (tmp_path / "o").glob("*/*/")
    seen = (attempt / "stages/01-env/stdout.txt").read_text()
    assert "'PATH'" in seen, seen  # the probe did print its environment
    for leak in ("IMAGEGATE_SIGNING_KEY", str(key), *CANARIES.values()):
        assert leak not in seen, (leak, seen)
    pred = r.json()["predicate"]
    assert pred["environment"]["keyIsolation"] == method
    recorded = json.loads((attempt / "run.json").read_text())["environment"]
    assert recorded["key_isolation"]["method"] == method
    if driver == "rootfs":  # the sandbox's seccomp filter, recorded in the evidence and the statement
        assert recorded["seccomp"]["seccomp"] is True and "ptrace" in recorded["seccomp"]["denied"]
        assert pred["environment"]["seccomp"]["bpf_sha256"] == recorded["seccomp"]["bpf_sha256"]
