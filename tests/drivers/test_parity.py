"""Parity: for every image of the test set, `--driver rootfs` (no engine runs the probes: the image
is read through the docker-daemon: transport, verified while unpacked, run under bubblewrap) gives
the same stage statuses and verdict as the docker driver."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import imagegate

HOSTILE = Path(__file__).resolve().parents[1] / "run" / "data" / "hostile.yaml"

# image -> the pipeline options it is checked with (as tests/run does for the docker driver)
CASES = {
    "python": ["-p", "python", "-m", "json"],
    "conflict": ["-p", "python"],
    "av": ["-p", "python", "-m", "av"],
    "nopip": ["-p", "python"],
    "vllm-like": ["-p", "vllm"],  # with the outside layers stage
    "nopython": ["-p", "python"],
    "hostile": ["-p", str(HOSTILE), "-j", "1"],
}


# Stages whose own code may say what it likes about itself: the hostile image's `evil` stage
# leaves a daemon that rewrites result files, its own among them, and whether it lands a whole
# forged PASS or half a file (an ERROR) is a race of its own making. Another stage's status and
# the verdict are never its to decide: those are compared (tests/run/test_trust.py).
OWN_WORD = {"evil"}


def outcome(statement: dict) -> tuple[str, dict[str, str]]:  # type: ignore[type-arg]
    p = statement["predicate"]
    return p["verdict"], {s["id"]: s["status"] for s in p["stages"] if s["id"] not in OWN_WORD}


@pytest.mark.parametrize("name", list(CASES))
def test_rootfs_driver_agrees_with_docker(
    name: str, images: dict[str, str], root_cache: dict[str, str], tmp_path: Path
) -> None:
    common = [*CASES[name], "--no-sign", "--format", "json"]
    docker = imagegate("run", images[name], *common, "-o", str(tmp_path / "docker"))
    rootfs = imagegate(
        "run", f"docker-daemon:{images[name]}", "--driver", "rootfs", *common, "-o", str(tmp_path / "rootfs"),
        env=root_cache,
    )  # fmt: skip
    assert docker.stdout, docker.stderr
    assert rootfs.stdout, rootfs.stderr
    want, got = docker.json(), rootfs.json()
    assert outcome(got) == outcome(want)
    assert rootfs.returncode == docker.returncode
    env = got["predicate"]["environment"]
    assert env["driver"] == "rootfs" and env["engine"] is None
    assert got["predicate"]["image"]["configDigest"] == want["predicate"]["image"]["configDigest"]
