"""GPU runs on a host without GPUs (CI has none): the node check is DEFERRED, GPUs stay hidden
unless asked for, device requests reach the real engine and its refusal is said clearly, and
`imagegate complete` links, refuses and verifies. No GPU is faked: nothing here passes a GPU stage."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest

from imagegate._support import resources
from imagegate.domain import protocol
from imagegate.domain.gpus import Grant
from imagegate.domain.plan import PlannedStage
from imagegate.domain.results import ImageFacts, StageResult, Status
from imagegate.drivers.interface import BundleRun
from imagegate.pipeline.params import CliParams
from imagegate.usecases import runner
from imagegate.usecases.runner import judging
from tests.helpers import imagegate

GPU_PIPELINE = """\
apiVersion: imagegate/v1
name: gpu-env
stages:
  - id: find_spec
    probe: find_spec
    with:
      modules: [json]
  - id: gpu_env
    probe: cli
    requires: [gpu]
    timeout: 60
    with:
      command: [{python}, -c, "import os; print('cvd=%r nvd=%r' % (os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('NVIDIA_VISIBLE_DEVICES')))"]
"""


def _pipeline(tmp_path: Path, python: str = sys.executable) -> Path:
    p = tmp_path / "gpu-env.yaml"
    p.write_text(GPU_PIPELINE.format(python=python))
    return p


def _key(tmp_path: Path) -> tuple[Path, Path]:
    r = imagegate("keygen", "--out", str(tmp_path / "k"))
    assert r.returncode == 0, r.stderr
    return tmp_path / "k.key", tmp_path / "k.pub"


def _attempts(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("*/*/") if p.is_dir())


def _statement(attempt: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((attempt / "statement.json").read_text())["predicate"]  # type: ignore[no-any-return]


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_node_check_is_deferred_without_gpus_and_the_run_records_the_request(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = imagegate("run", "--here", "-p", "gpu", "--gpus", "all", "-o", str(out), "--no-sign")
    # The node check alone, not run: nothing checked, no level, not accepted.
    assert r.returncode == 1, r.stderr
    assert "verdict: CPU_PASS_NODE_CHECK_DEFERRED → rejected: no level reached" in r.stdout
    pred = _statement(_attempts(out)[0])
    stage = pred["stages"][0]
    assert stage["probe"] == "gpu_preflight" and stage["status"] == "DEFERRED"
    assert pred["environment"]["gpus_requested"] == "all"
    assert pred["environment"]["gpuPresent"] is False
    # --gpus asked, no GPU node here: the runner saw none, so it granted none
    assert pred["environment"]["gpus_granted"] == {"via": "host_devices", "seen": [], "granted": False}
    assert pred["environment"]["gpuGranted"] is False and "gpuGranted" not in stage


def test_here_hides_this_hosts_gpus_unless_asked(tmp_path: Path) -> None:
    pipe = _pipeline(tmp_path)
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "NVIDIA_VISIBLE_DEVICES": "all"}
    hidden = imagegate("run", "--here", "-p", str(pipe), "-o", str(tmp_path / "a"), "--no-sign", env=env)
    assert hidden.returncode == 0, hidden.stderr
    att = _attempts(tmp_path / "a")[0]
    said = next(att.glob("stages/*-gpu_env/stdout.txt")).read_text()
    assert "cvd='' nvd='void'" in said
    assert _statement(att)["environment"]["gpu"]["present"] is False
    shown = imagegate(
        "run", "--here", "-p", str(pipe), "--gpus", "1", "-o", str(tmp_path / "b"), "--no-sign", env=env
    )
    att = _attempts(tmp_path / "b")[0]
    said = next(att.glob("stages/*-gpu_env/stdout.txt")).read_text()
    assert "cvd='0' nvd='all'" in said, shown.stderr
    # the GPU stage needs the node check, which cannot run without a GPU: both DEFERRED
    pred = _statement(att)
    assert [s["id"] for s in pred["stages"]] == ["node_check", "find_spec", "gpu_env"]
    assert pred["verdict"] == "CPU_PASS_NODE_CHECK_GPU_ENV_DEFERRED"


def test_gpus_option_refuses_junk() -> None:
    r = imagegate("run", "--here", "-p", "gpu", "--gpus", "two", "--no-sign")
    assert r.returncode == 3
    assert "--gpus 'two': not all, a count, or a list of GPU ids" in r.stderr
    r = imagegate("run", "--here", "-p", "gpu", "--gpus", "0", "--no-sign")
    assert r.returncode == 3 and "give 1 or more GPUs" in r.stderr


@pytest.mark.parametrize(
    ("gpus", "count", "ids"),
    [
        ("all", -1, []),
        ("2", 2, []),
        ("0,1", 0, ["0", "1"]),
        ("3,1", 0, ["3", "1"]),
        ("device=1", 0, ["1"]),
        ("GPU-3cf75db2-5cba-bdeb-063d-4cfc6e966eb1", 0, ["GPU-3cf75db2-5cba-bdeb-063d-4cfc6e966eb1"]),
    ],
)
def test_the_device_request_names_exactly_the_gpus_asked_for(gpus: str, count: int, ids: list[str]) -> None:
    """What the engine is asked for, as `docker run --gpus` asks: ids exactly as named (never a
    count, never all), a count as given, -1 only for all; nothing without --gpus."""
    from imagegate.domain.gpus import parse
    from imagegate.drivers.docker import device_requests

    assert device_requests(None) is None
    (req,) = device_requests(parse(gpus)) or []
    assert req["Count"] == count
    assert req["DeviceIDs"] == ids
    assert req["Capabilities"] == [["gpu"]]


def test_device_request_reaches_the_engine_and_its_refusal_is_clear(
    images: dict[str, str], tmp_path: Path
) -> None:
    """The engine here has no NVIDIA runtime: the request reaches it and is refused; the user is
    told what is missing and what to do, with the engine's own words, and no traceback."""
    r = imagegate("run", images["python"], "-p", "gpu", "--gpus", "all", "-o", str(tmp_path), "--no-sign")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--gpus all: the docker engine" in r.stderr and "cannot give containers GPUs" in r.stderr
    assert 'could not select device driver "" with capabilities: [[gpu]]' in r.stderr
    assert "NVIDIA Container Toolkit" in r.stderr
    assert "Traceback" not in r.stderr


def test_complete_links_verifies_and_tampering_with_either_link_fails(tmp_path: Path) -> None:
    key, pub = _key(tmp_path)
    out = tmp_path / "out"
    first = imagegate("run", "--here", "-p", str(_pipeline(tmp_path)), "-o", str(out), "--key", str(key))
    assert first.returncode == 0, first.stderr
    assert "verdict: CPU_PASS_GPU_ENV_DEFERRED" in first.stdout
    earlier = _attempts(out)[0]
    before = _digests(earlier)
    done = imagegate("complete", str(earlier / "attestation.dsse.json"), "--here", "--key", str(key))
    assert done.returncode == 0, done.stderr
    later = next(a for a in _attempts(out) if a != earlier)
    assert _digests(earlier) == before  # the earlier attempt is never touched
    pred = _statement(later)
    schema = json.loads((resources.manifests_dir() / "acceptance-v1.schema.json").read_text())
    jsonschema.validate(json.loads((later / "statement.json").read_text()), schema)
    link = pred["completes"]
    assert link["attempt"] == earlier.name and link["stages"] == ["gpu_env"]
    assert (
        link["envelopeSha256"] == hashlib.sha256((earlier / "attestation.dsse.json").read_bytes()).hexdigest()
    )
    by_id = {s["id"]: s for s in pred["stages"]}
    assert by_id["find_spec"]["status"] == "PASS" and by_id["find_spec"]["fromAttempt"] == earlier.name
    assert by_id["gpu_env"]["status"] == "DEFERRED" and "fromAttempt" not in by_id["gpu_env"]
    assert pred["verdict"] == "CPU_PASS_GPU_ENV_DEFERRED"  # still no GPU here: nothing claims a pass
    chain = f"completes attempt {earlier.name} (verdict CPU_PASS_GPU_ENV_DEFERRED, envelope sha256 "
    assert (
        chain in done.stdout and "run now: gpu_env; results of the earlier attempt: find_spec" in done.stdout
    )
    page = tmp_path / "page.html"
    assert imagegate("report", str(later), "-f", "html", "-o", str(page)).returncode == 0
    assert '<p id="chain"><strong>Chain:</strong> ' + chain in page.read_text()
    md = imagegate("report", str(later), "-f", "markdown")
    assert "**Chain:** " + chain in md.stdout
    ok = imagegate("verify", str(later / "attestation.dsse.json"), "--key", str(pub))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"ok      link: completes attempt {earlier.name}" in ok.stdout

    # the earlier envelope changed after the completion was signed: the link fails, named
    env = earlier / "attestation.dsse.json"
    original = env.read_bytes()
    env.write_bytes(original.replace(b'"payload"', b'"payload" ', 1))
    bad = imagegate("verify", str(later / "attestation.dsse.json"), "--key", str(pub))
    assert bad.returncode == 1
    assert (
        f"link: completes attempt {earlier.name}" in bad.stdout
        and "changed after the completion" in bad.stdout
    )
    env.write_bytes(original)
    # the copy the completion keeps changed (the folder beside intact): the link fails as well
    copy = later / "completes" / "attestation.dsse.json"
    assert copy.read_bytes() == original
    copy.write_bytes(original.replace(b'"payload"', b'"payload" ', 1))
    bad = imagegate("verify", str(later / "attestation.dsse.json"), "--key", str(pub))
    assert bad.returncode == 1
    assert f"{copy} has sha256" in bad.stdout and "changed after the completion" in bad.stdout, bad.stdout
    copy.write_bytes(original)
    # the completion's own envelope changed (it now claims PASS): its signature fails
    mine = later / "attestation.dsse.json"
    doc = json.loads(mine.read_bytes())
    statement = json.loads(base64.b64decode(doc["payload"]))
    statement["predicate"]["verdict"] = "PASS"
    doc["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    mine.write_text(json.dumps(doc))
    bad = imagegate("verify", str(mine), "--key", str(pub))
    assert bad.returncode == 1
    assert "FAILED  signature: no signature verifies" in bad.stdout, bad.stdout


def test_complete_refuses_another_environment_and_an_undeferred_attempt(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = imagegate("run", "--here", "-p", str(_pipeline(tmp_path)), "-o", str(out))
    assert first.returncode == 0, first.stderr
    earlier = _attempts(out)[0]
    then = _statement(earlier)["environment"]["fingerprint"]["sha256"]
    # A second interpreter made here: a venv of the same python, without imagegate's packages.
    other = tmp_path / "other-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True)
    r = imagegate("complete", str(earlier), "--here", "--python", str(other / "bin" / "python"))
    assert r.returncode == 3
    assert f"(fingerprint sha256:{then})" in r.stderr and "is not the one attempt" in r.stderr
    assert len(_attempts(out)) == 1  # refused before anything was written
    plain = tmp_path / "plain.yaml"
    plain.write_text(
        "apiVersion: imagegate/v1\nname: plain\nstages:\n  - id: pip_check\n    probe: pip_check\n"
    )
    r = imagegate("run", "--here", "-p", str(plain), "-o", str(tmp_path / "p"))
    r = imagegate("complete", str(_attempts(tmp_path / "p")[0]), "--here")
    assert r.returncode == 3 and "deferred nothing" in r.stderr


def test_complete_refuses_another_image_naming_both(images: dict[str, str], tmp_path: Path) -> None:
    tag = f"imagegate-gpu-test:{secrets.token_hex(4)}"
    subprocess.run(["docker", "tag", images["python"], tag], check=True)
    try:
        pipe = _pipeline(tmp_path, python="python3")
        first = imagegate("run", tag, "-p", str(pipe), "-o", str(tmp_path / "out"))
        assert first.returncode == 0, first.stderr
        earlier = _attempts(tmp_path / "out")[0]
        then = _statement(earlier)["image"]["configDigest"]
        subprocess.run(["docker", "tag", images["av"], tag], check=True)  # the tag now names another build
        now = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Id}}", tag], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert now != then
        r = imagegate("complete", str(earlier))
        assert r.returncode == 3, r.stderr
        assert f"image ID {now} is not the image ID {then}" in r.stderr
        assert len(_attempts(tmp_path / "out")) == 1
    finally:
        subprocess.run(["docker", "rmi", tag], capture_output=True)


def test_complete_runs_what_waited_on_a_deferred_or_skipped_stage(tmp_path: Path) -> None:
    """A stage that needs a deferred one never ran; one left out with --skip neither: `complete`
    runs them all, never carries them over as if their earlier result stood."""
    key, _ = _key(tmp_path)
    pipe = tmp_path / "chain.yaml"
    pipe.write_text(
        GPU_PIPELINE.format(python=sys.executable)
        + "  - id: after_gpu\n    probe: find_spec\n    needs: [gpu_env]\n    with:\n      modules: [json]\n"
    )
    out = tmp_path / "out"
    first = imagegate(
        "run", "--here", "-p", str(pipe), "-o", str(out), "--key", str(key), "--skip", "find_spec"
    )
    assert first.returncode == 1, first.stderr  # its one CPU stage left out: no level
    earlier = _attempts(out)[0]
    stages = {s["id"]: s["status"] for s in _statement(earlier)["stages"]}
    assert stages == {"find_spec": "DEFERRED", "gpu_env": "DEFERRED", "after_gpu": "SKIPPED"}
    assert _statement(earlier)["verdict"] == "CPU_PASS_FIND_SPEC_GPU_ENV_DEFERRED"
    done = imagegate("complete", str(earlier), "--here", "--key", str(key))
    assert done.returncode == 0, done.stderr
    later = next(a for a in _attempts(out) if a != earlier)
    pred = _statement(later)
    assert pred["completes"]["stages"] == ["find_spec", "gpu_env", "after_gpu"]
    got = {s["id"]: (s["status"], "fromAttempt" in s) for s in pred["stages"]}
    # find_spec ran now; the GPU stage is deferred again (no GPU here) and what needs it waits again.
    assert got == {
        "find_spec": ("PASS", False),
        "gpu_env": ("DEFERRED", False),
        "after_gpu": ("SKIPPED", False),
    }


def test_the_engines_record_of_a_container_says_which_gpus_it_was_given() -> None:
    """A container's HostConfig as the engine's inspect gives it (Docker's --gpus device requests,
    CDI devices by name, a GPU's node by path): the runner's own fact, never the image's."""
    from imagegate.drivers.docker import engine_grant

    docker_all = {
        "DeviceRequests": [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]]}]
    }
    assert engine_grant(docker_all).seen == ("count=-1",)
    two = {
        "DeviceRequests": [{"Count": 0, "DeviceIDs": ["0", "GPU-aa"], "Capabilities": [["utility", "gpu"]]}]
    }
    assert engine_grant(two).seen == ("ids=0,GPU-aa",)
    cdi_named = {"Devices": [{"PathOnHost": "nvidia.com/gpu=all"}, {"PathOnHost": "/dev/nvidia1"}]}
    assert engine_grant(cdi_named).seen == ("nvidia.com/gpu=all", "/dev/nvidia1")
    assert engine_grant(cdi_named).granted and engine_grant(cdi_named).via == "device_requests"
    for nothing in (
        {},
        {"DeviceRequests": None, "Devices": None},
        {"DeviceRequests": [{"Count": -1, "Capabilities": [["compute"]]}, "junk", {"Capabilities": "gpu"}]},
        {"Devices": [{"PathOnHost": "/dev/nvidiactl"}, {"PathOnHost": "/dev/fuse"}, "junk"]},
    ):
        assert not engine_grant(nothing).granted, nothing


def _controller(grant: Grant | None, gpu_present: bool) -> runner.ControllerRun:
    events = protocol.Events()
    events.start = {"event": "start", "gpu": {"present": gpu_present}}
    return runner.ControllerRun(["s"], BundleRun(b"", b"", 0, gpus=grant), events)


def test_a_gpu_counts_where_the_runner_granted_and_saw_it_never_on_the_images_word() -> None:
    seen, unseen = Grant("cdi", ("/dev/nvidia0",)), Grant("host_devices", ())
    assert runner.gpu_granted(_controller(seen, True)) and not runner.gpu_granted(_controller(unseen, True))
    assert not runner.gpu_granted(_controller(None, True)) and not runner.gpu_granted(None)
    start = {"gpu": {"present": True}}
    assert runner.Capabilities.reported(start, granted=True).gpu
    assert not runner.Capabilities.reported(start, granted=False).gpu  # the image's word alone
    assert not runner.Capabilities.reported({"gpu": {"present": "yes"}}, granted=True).gpu
    assert not runner.Capabilities.reported({"gpu": {"present": 1}}, granted=True).gpu  # true only
    assert not runner.Capabilities.reported(None, granted=True).gpu
    obs = runner.Observation(ImageFacts("x", None), {}, [_controller(unseen, True)], "", "docker")
    assert not obs.capabilities.gpu
    obs.runs = [_controller(seen, True)]
    assert obs.capabilities.gpu


@pytest.mark.parametrize("status", [Status.PASS, Status.FAIL, Status.ERROR])
def test_a_gpu_stage_run_where_no_gpu_was_granted_is_deferred_for_the_record(status: Status) -> None:
    gpu_stage = PlannedStage("g", "cli", "inside", CliParams(command=["x"]), 60.0, requires=("gpu",))
    said = StageResult("g", "cli", "inside", status, "it said so", data={"argv": ["x"]})
    res = judging._on_gpu(gpu_stage, said, granted=False)
    assert (res.status, res.on_gpu) == (Status.DEFERRED, False)
    assert res.detail == "requires gpu, and the runner granted none; ran for the record: it said so"
    assert res.data == {"argv": ["x"], "ran_for_record": {"status": status.value, "detail": "it said so"}}
    assert judging._on_gpu(gpu_stage, replace(said, detail=""), granted=False).detail.endswith(
        f"ran for the record: {status.value}"
    )
    granted = judging._on_gpu(gpu_stage, said, granted=True)
    assert (granted.status, granted.on_gpu, granted.detail) == (status, True, "it said so")
    cpu_stage = replace(gpu_stage, requires=())
    assert judging._on_gpu(cpu_stage, said, granted=False) == said  # no GPU needed: as it said
    assert judging._on_gpu(cpu_stage, said, granted=True) == replace(said, on_gpu=True)


@pytest.mark.parametrize("status", [Status.DEFERRED, Status.SKIPPED])
def test_a_gpu_stage_that_did_not_run_stays_as_the_controller_said(status: Status) -> None:
    gpu_stage = PlannedStage("g", "cli", "inside", CliParams(command=["x"]), 60.0, requires=("gpu",))
    said = StageResult("g", "cli", "inside", status, "no GPU here")
    assert judging._on_gpu(gpu_stage, said, granted=False) == said
