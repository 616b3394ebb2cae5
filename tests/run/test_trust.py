"""What a hostile image can and cannot do to the verdict (docs/how-it-works.md, "What an image can and cannot
do to the verdict"), with real hostile images (tests/images/hostile/README.md) in the real engine.

The hostile image has a real unmet requirement (pip check fails) and a package that, when the
`evil` stage imports it, tries every route to speak for the controller or another stage. Whatever
it does, the verdict stays FAIL and nothing signed says PASS for the stages it did not run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import imagegate, pipeline_file

PIPELINE = Path(__file__).parent / "data" / "hostile.yaml"


def attempt_of(out: Path) -> Path:
    (attempt,) = [p for p in out.glob("sha256-*/*") if p.is_dir()]
    return attempt


def statuses(statement: dict[str, Any]) -> dict[str, str]:
    return {s["id"]: s["status"] for s in statement["predicate"]["stages"]}


def test_a_package_cannot_forge_other_stages(images: dict[str, str], tmp_path: Path) -> None:
    # One controller (-j 1): the stages share a container, the hardest case for isolation.
    r = imagegate(
        "run", images["hostile"], "-p", str(PIPELINE), "-j", "1", "-o", str(tmp_path), "--format", "json"
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    statement = r.json()
    assert statement["predicate"]["verdict"] == "FAIL"
    seen = statuses(statement)
    # pip check really fails, `missing` really fails: the forged PASS events and the daemon that
    # rewrote every result file it found changed neither.
    assert seen["pip_check"] == "FAIL" and seen["missing"] == "FAIL", seen
    assert "event_integrity" not in seen  # nothing forged even reached the runner
    attempt = attempt_of(tmp_path)
    evil = (attempt / "stages/02-evil/stderr.txt").read_text()
    # Every route to the controller was tried and refused by the kernel.
    routes = [
        "write /proc/1/fd/1",
        "glue /proc/1/fd/1",
        "read /proc/1/environ",
        "read /proc/1/mem",
        "ptrace 1",
    ]
    for route in routes:
        assert f"evil: {route}: blocked" in evil, evil
    # ptrace was really called, and the kernel refused it (a non-dumpable process, no CAP_SYS_PTRACE)
    assert "evil: ptrace 1: blocked (Operation not permitted)" in evil, evil
    assert "evil: daemon left behind: DONE" in evil
    result = json.loads((attempt / "stages/02-evil/result.json").read_text())
    assert result["data"]["survivors_killed"] >= 1  # the daemon did not outlive its stage
    run = json.loads((attempt / "run.json").read_text())
    assert [c["events"]["violations"] for c in run["run"]["controllers"]] == [0]
    assert run["environment"]["controller"]["protection"] == {
        "non_dumpable": True,
        "subreaper": True,
        "isolated": True,
        "error": None,
    }
    # The site hook ran in the stages (they use the image's site) and printed its forgeries
    # there: kept as the stage's output, never taken for events.
    assert b'"detail": "forged"' in (attempt / "stages/01-pip_check/stdout.txt").read_bytes()


def test_a_forged_line_before_the_controller_is_named(images: dict[str, str], tmp_path: Path) -> None:
    # This image's python3 prints a forged, unterminated event line before the real interpreter.
    r = imagegate("run", images["hostile-wrapper"], "-p", str(PIPELINE), "-j", "1", "-o", str(tmp_path))
    assert r.returncode == 1, r.stderr
    statement = json.loads((attempt_of(tmp_path) / "statement.json").read_text())
    seen = statuses(statement)
    assert statement["predicate"]["verdict"] == "FAIL"
    assert seen["event_integrity"] == "ERROR" and seen["pip_check"] == "FAIL", seen
    integrity = next(s for s in statement["predicate"]["stages"] if s["id"] == "event_integrity")
    assert "fails authentication" in integrity["detail"], integrity
    # The controller's own first event was not glued to the fragment: every stage reported.
    assert seen["missing"] == "FAIL"


def test_a_healthy_image_is_not_fooled_by_a_forgery_either(images: dict[str, str], tmp_path: Path) -> None:
    """Forged events make a run ERROR even where every real stage passed: never a PASS."""
    stage = "{id: json, probe: find_spec, timeout: 2m, with: {modules: [json]}}"
    pipeline = pipeline_file(tmp_path / "p.yaml", "healthy", [stage])
    r = imagegate("run", images["hostile-wrapper"], "-p", str(pipeline), "-o", str(tmp_path / "o"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "verdict: ERROR" in r.stdout


# A small launcher forks the command and reports its ru_maxrss: Linux carries ru_maxrss over
# fork+exec, so a command forked straight from pytest would report pytest's own size.
_LAUNCHER = (
    "import os, subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "_, status, usage = os.wait4(p.pid, 0)\n"
    "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n"
)


def test_a_flood_on_stdout_changes_nothing(images: dict[str, str], tmp_path: Path) -> None:
    # This image's python3 writes 200 MB of lines and one unterminated 200 MB line to the
    # container's stdout before the real interpreter starts.
    cmd = [sys.executable, "-m", "imagegate", "run", images["flood"], "-p", "python", "-m", "json"]
    cmd += ["-o", str(tmp_path), "--no-sign"]
    out = subprocess.run([sys.executable, "-c", _LAUNCHER, *cmd], capture_output=True, text=True, check=True)
    code, peak_kib = (int(x) for x in out.stdout.split())
    assert code == 0
    attempt = attempt_of(tmp_path)
    statement = json.loads((attempt / "statement.json").read_text())
    assert statement["predicate"]["verdict"] == "PASS"
    run = json.loads((attempt / "run.json").read_text())
    # Each controller's container got the flood (its python3 printed it before starting).
    for c in run["run"]["controllers"]:
        assert c["events"]["other_output_bytes"] >= 400_000_000 and c["events"]["violations"] == 0
    assert peak_kib < 100 * 1024, f"runner peak RSS {peak_kib} KiB"
    # Only a bounded head of the noise is kept as evidence.
    for kept in attempt.glob("controller*.stdout.other.log"):
        assert kept.stat().st_size <= 1024 * 1024


@pytest.mark.parametrize("engine_name", ["docker", "podman"])
def test_the_controller_protects_itself_in_every_engine(
    images: dict[str, str], podman: str, engine: str, tmp_path: Path, engine_name: str
) -> None:
    host = podman if engine_name == "podman" else engine
    r = imagegate(
        "run", images["vllm-like"], "-p", "python", "-m", "json", "-o", str(tmp_path), "--no-sign",
        env={"DOCKER_HOST": host},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = json.loads((attempt_of(tmp_path) / "run.json").read_text())
    protection = run["environment"]["controller"]["protection"]
    assert protection["non_dumpable"] and protection["subreaper"] and protection["isolated"], protection
