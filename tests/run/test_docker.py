"""`imagegate run` against real images in a real Docker engine (and Podman's Docker API)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import (
    PODMAN_SOCK,
    container_exists,
    containers_left,
    containers_of,
    imagegate,
    overall_deadline_s,
)

pytestmark = pytest.mark.engine


def attempts(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("*/*") if p.is_dir())


def stage(statement: dict, sid: str) -> dict:  # type: ignore[type-arg]
    return next(s for s in statement["predicate"]["stages"] if s["id"] == sid)


def only_attempt(out: Path) -> Path:
    found = attempts(out)
    assert len(found) == 1, found
    return found[0]


def test_clean_python_image_passes_with_its_evidence(images: dict[str, str], tmp_path: Path) -> None:
    # how fast is a benchmark's goal (benchmarks/), not a test's: a loaded machine is slower
    r = imagegate("run", images["python"], "-p", "python", "-m", "json", "-o", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "verdict: PASS" in r.stdout
    assert "PIP_CHECK_PASS" in r.stdout and "FIND_SPEC_PASS" in r.stdout
    att = only_attempt(tmp_path)
    statement = json.loads((att / "statement.json").read_text())
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicate"]["verdict"] == "PASS"
    config = statement["predicate"]["image"]["configDigest"]
    assert att.parent.name == config.replace(":", "-")
    # the image was never pushed: the subject is its config digest, and the predicate says so
    assert statement["subject"][0]["digest"] == {"sha256": config.split(":")[1]}
    assert statement["predicate"]["image"]["subjectDigest"] == "config"
    for f in (
        "plan.json",
        "bundle.pyz",
        "controller-1.events.log",
        "run.json",
        "stages/01-pip_check/stdout.txt",
    ):
        assert (att / f).is_file(), f
    assert "No broken requirements found." in (att / "stages/01-pip_check/stdout.txt").read_text()
    env = statement["predicate"]["environment"]
    assert env["engine"] == "docker" and env["engine_version"]
    assert env["gpu"]["present"] is False and env["gpu"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert not any(container_exists(c) for c in containers_of(att))


def test_pip_conflict_names_both_problems_exactly(images: dict[str, str], tmp_path: Path) -> None:
    r = imagegate("run", images["conflict"], "-p", "python", "-o", str(tmp_path))
    assert r.returncode == 1, r.stderr
    assert "verdict: FAIL" in r.stdout
    assert "nixl 1.2.0 requires nixl-cu12, which is not installed." in r.stdout
    assert "moviepy 2.2.1 has requirement pillow<12.0,>=9.2.0, but you have pillow 12.2.0." in r.stdout
    result = json.loads((only_attempt(tmp_path) / "stages/01-pip_check/result.json").read_text())
    problems = {(p["kind"], p["project"], p["requirement"]) for p in result["data"]["problems"]}
    assert ("missing", "nixl", "nixl-cu12") in problems
    assert ("conflict", "moviepy", "pillow<12.0,>=9.2.0") in problems


def test_vllm_like_image_is_cpu_pass_gpu_cli_deferred(images: dict[str, str], tmp_path: Path) -> None:
    r = imagegate("run", images["vllm-like"], "-p", "vllm", "-o", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verdict: CPU_PASS_GPU_CLI_DEFERRED" in r.stdout
    # progress while it ran: one line per finished stage on stderr (not a terminal here)
    assert "imagegate: [3/5] gpu_cli DEFERRED" in r.stderr
    assert "imagegate: [5/5] av_roundtrip PASS" in r.stderr
    att = only_attempt(tmp_path)
    # the raw failure without a GPU is kept as evidence
    raw = (att / "stages/03-gpu_cli/stderr.txt").read_text()
    assert "RuntimeError: Failed to infer device type" in raw
    gpu = json.loads((att / "stages/03-gpu_cli/result.json").read_text())
    assert gpu["status"] == "DEFERRED"
    assert gpu["data"]["ran_for_record"]["status"] == "FAIL"
    # the CPU-platform run parsed `vllm serve --help=all` (0.11 picks --help=all) and says how
    cpu = json.loads((att / "stages/04-cli_cpu/result.json").read_text())
    assert cpu["status"] == "PASS"
    assert cpu["data"]["argv"] == ["vllm", "serve", "--help=all"]
    assert cpu["data"]["version_choice"]["version"] == "0.11.0"
    assert (
        "platform override vllm-cpu applied: current_platform=CpuPlatform"
        in (att / "stages/04-cli_cpu/stderr.txt").read_text()
    )
    modules = {
        m["module"]: m
        for m in json.loads((att / "statement.json").read_text())["predicate"]["stages"][1]["facts"][
            "modules"
        ]
    }
    assert (modules["vllm"]["distribution"], modules["vllm"]["version"]) == ("vllm", "0.11.0")
    assert (modules["av"]["distribution"], modules["av"]["version"]) == ("av", "14.2.0")
    assert cpu["data"]["how"] == "entry point vllm.entrypoints.cli.main:main in-process"
    av = json.loads((att / "stages/05-av_roundtrip/result.json").read_text())
    assert av["status"] == "PASS" and av["detail"] == "frames=8"
    assert "AV_ROUNDTRIP_PASS" in r.stdout

    strict = imagegate("run", images["vllm-like"], "-p", "vllm", "-o", str(tmp_path), "--require-complete")
    assert strict.returncode == 1
    assert len(attempts(tmp_path)) == 2


def test_av_roundtrip_fails_without_pyav(images: dict[str, str], tmp_path: Path) -> None:
    pipeline = tmp_path / "av.yaml"
    pipeline.write_text(
        "apiVersion: imagegate/v1\nname: av\nstages:\n  - id: av_roundtrip\n    probe: av_roundtrip\n"
    )
    ok = imagegate("run", images["av"], "-p", str(pipeline), "-o", str(tmp_path / "a"))
    assert ok.returncode == 0 and "AV_ROUNDTRIP_PASS" in ok.stdout
    bad = imagegate("run", images["python"], "-p", str(pipeline), "-o", str(tmp_path / "b"))
    assert bad.returncode == 1
    assert "AV_ROUNDTRIP_FAIL" in bad.stdout and "the image lacks PyAV" in bad.stdout


def test_image_without_pip_is_error_not_pass(images: dict[str, str], tmp_path: Path) -> None:
    r = imagegate("run", images["nopip"], "-p", "python", "-o", str(tmp_path))
    assert r.returncode == 2
    assert "PIP_CHECK_ERROR" in r.stdout and "pip is not installed" in r.stdout
    assert "verdict: ERROR" in r.stdout


def test_image_without_python(images: dict[str, str], tmp_path: Path) -> None:
    r = imagegate("run", images["nopython"], "-p", "python", "-o", str(tmp_path))
    assert r.returncode == 2
    assert "no python interpreter in the image (tried python3, python)" in r.stdout
    assert containers_left(image=images["nopython"]) == []


@pytest.mark.parametrize("ref", ["imagegate-test/does-not-exist:1", "Bad Reference!!"])
def test_missing_or_malformed_reference_is_usage_error(engine: str, tmp_path: Path, ref: str) -> None:
    r = imagegate("run", ref, "-p", "python", "-o", str(tmp_path))
    assert r.returncode == 3, r.stderr
    assert "imagegate: error:" in r.stderr and ref in r.stderr
    assert "Traceback" not in r.stderr
    assert not attempts(tmp_path)  # nothing ran, nothing recorded


def write_pipeline(tmp_path: Path, body: str, name: str = "p.yaml") -> str:
    path = tmp_path / name
    path.write_text("apiVersion: imagegate/v1\nname: t\nstages:\n" + body)
    return str(path)


def test_every_status_needs_and_a_hanging_probe(images: dict[str, str], tmp_path: Path) -> None:
    body = """\
  - id: hang
    probe: cli
    timeout: 2s
    with: {command: [python3, -c, "import time; time.sleep(600)"]}
  - id: after_hang
    probe: cli
    needs: [hang]
    with: {command: [python3, -c, "print(1)"]}
  - id: fails
    probe: find_spec
    with: {modules: [no_such_module_anywhere]}
  - id: passes
    probe: cli
    with: {command: [python3, -c, "print('hello')"], stdout_regex: "^hello$"}
  - id: deferred
    probe: cli
    requires: [gpu]
    with: {command: [python3, -c, "print(1)"]}
"""
    r = imagegate("run", images["python"], "-p", write_pipeline(tmp_path, body), "-o", str(tmp_path / "o"))
    statement = json.loads((only_attempt(tmp_path / "o") / "statement.json").read_text())
    # cut at its own timeout, long before the 600 s sleep would have ended (the run's own clock)
    assert stage(statement, "hang")["durationSeconds"] < 60
    got = {s["id"]: s["status"] for s in statement["predicate"]["stages"]}
    assert got == {
        "hang": "ERROR",
        "after_hang": "SKIPPED",
        "fails": "FAIL",
        "passes": "PASS",
        "deferred": "DEFERRED",
    }
    assert "timed out after" in stage(statement, "hang")["detail"]
    assert "needs hang is ERROR" in stage(statement, "after_hang")["detail"]
    assert r.returncode == 1  # FAIL wins over ERROR
    assert not any(container_exists(c) for c in containers_of(only_attempt(tmp_path / "o")))


def test_overall_deadline_kills_and_removes_the_container(images: dict[str, str], tmp_path: Path) -> None:
    body = """\
  - id: slow
    probe: cli
    timeout: 300s
    with: {command: [python3, -c, "import time; time.sleep(600)"]}
"""
    # The deadline counts from the process's start: scaled from a run measured now, so that on a
    # loaded machine the stage still begins before it (a fixed 4 s turned CI red under load).
    limit = overall_deadline_s(images["python"], tmp_path.with_name(tmp_path.name + "-measured"))
    r = imagegate(
        "run",
        images["python"],
        "-p",
        write_pipeline(tmp_path, body),
        "-o",
        str(tmp_path),
        "--timeout",
        str(limit),
    )
    assert r.returncode == 2
    assert "SLOW_ERROR" in r.stdout and "verdict: ERROR" in r.stdout, r.stdout
    statement = json.loads((only_attempt(tmp_path) / "statement.json").read_text())
    assert stage(statement, "slow")["status"] == "ERROR"
    assert "overall deadline" in stage(statement, "slow")["detail"]
    # cut by the overall deadline, not by the stage's own 300 s timeout (the run's own clock)
    assert stage(statement, "slow")["durationSeconds"] < limit
    assert stage(statement, "slow")["durationSeconds"] > 1  # the time it really ran, not 0
    assert "it was running for" in stage(statement, "slow")["detail"]
    assert not any(container_exists(c) for c in containers_of(only_attempt(tmp_path)))


def test_flooding_probe_is_capped(images: dict[str, str], tmp_path: Path) -> None:
    body = """\
  - id: flood
    probe: cli
    timeout: 120s
    with: {command: [python3, -c, "import sys\\nfor _ in range(100): sys.stdout.write('x' * 1048576)"]}
"""
    r = imagegate("run", images["python"], "-p", write_pipeline(tmp_path, body), "-o", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    att = only_attempt(tmp_path)
    out = (att / "stages/01-flood/stdout.txt").read_bytes()
    assert len(out) < 2 * 1024 * 1024
    assert b"bytes omitted" in out
    result = json.loads((att / "stages/01-flood/result.json").read_text())
    assert result["data"]["command_stdout_bytes"] == 100 * 1048576


def test_sandbox_is_enforced(images: dict[str, str], tmp_path: Path) -> None:
    check = (
        "import os\n"
        "status = open('/proc/self/status').read()\n"
        "assert 'CapEff:\\t0000000000000000' in status, 'capabilities not dropped'\n"
        "assert 'NoNewPrivs:\\t1' in status, 'no-new-privileges not set'\n"
        "ifaces = [l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]]\n"
        "assert ifaces == ['lo'], ifaces\n"
        "assert os.environ['NVIDIA_VISIBLE_DEVICES'] == 'void' and os.environ['CUDA_VISIBLE_DEVICES'] == ''\n"
        "try:\n    open('/usr/imagegate-probe', 'w')\nexcept OSError:\n    pass\nelse:\n    raise SystemExit('root is writable')\n"
        "print('sandboxed')\n"
    )
    body = f"  - id: sandbox\n    probe: cli\n    with:\n      command: [python3, -c, {json.dumps(check)}]\n      stdout_regex: sandboxed\n"
    r = imagegate("run", images["python"], "-p", write_pipeline(tmp_path, body), "-o", str(tmp_path))
    assert r.returncode == 0, r.stdout + (only_attempt(tmp_path) / "stages/01-sandbox/stderr.txt").read_text()


def test_two_runs_two_attempts_and_an_appended_index(images: dict[str, str], tmp_path: Path) -> None:
    for _ in range(2):
        assert imagegate("run", images["python"], "-o", str(tmp_path)).returncode == 0
    found = attempts(tmp_path)
    assert len(found) == 2 and found[0] != found[1]
    index = (found[0].parent / "index.jsonl").read_text().splitlines()
    assert [json.loads(line)["attempt"] for line in index] == [p.name for p in found]


def test_format_json_prints_only_the_statement(images: dict[str, str], tmp_path: Path) -> None:
    r = imagegate("run", images["python"], "-o", str(tmp_path), "--format", "json")
    assert r.returncode == 0
    statement = r.json()
    assert statement["predicateType"] == "https://imagegate.dev/attestations/acceptance/v1"
    assert statement["predicate"]["verdict"] == "PASS"


def test_same_run_through_podman(podman: str, images: dict[str, str], tmp_path: Path) -> None:
    r = imagegate("run", images["vllm-like"], "-p", "vllm", "-o", str(tmp_path), env={"DOCKER_HOST": podman})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verdict: CPU_PASS_GPU_CLI_DEFERRED" in r.stdout
    statement = json.loads((only_attempt(tmp_path) / "statement.json").read_text())
    assert statement["predicate"]["environment"]["engine"] == "podman"
    assert not any(container_exists(c, PODMAN_SOCK) for c in containers_of(only_attempt(tmp_path)))


def test_image_for_another_architecture_is_error_with_the_reason(engine: str, tmp_path: Path) -> None:
    """An aarch64 interpreter on this engine: the kernel refuses it (exec format error)."""
    import io
    import struct
    import tarfile

    # a 64-byte ELF64 header for aarch64 (e_machine 183): what `python3` is in an arm64 image
    elf = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    elf += struct.pack("<HHIQQQIHHHHHH", 2, 183, 1, 0x400000, 64, 0, 0, 64, 56, 0, 64, 0, 0)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("usr/bin/python3")
        info.size, info.mode = len(elf), 0o755
        tf.addfile(info, io.BytesIO(elf))
    ref = "imagegate-test/foreign-arch:1"
    subprocess.run(["docker", "import", "-", ref], input=buf.getvalue(), check=True, capture_output=True)
    try:
        r = imagegate("run", ref, "-p", "python", "-o", str(tmp_path))
    finally:
        subprocess.run(["docker", "rmi", "-f", ref], capture_output=True)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cannot execute the image's python3 (exec format error" in r.stdout
    assert "Traceback" not in r.stderr
    assert not any(container_exists(c) for c in containers_of(only_attempt(tmp_path)))
