"""Independent in-image stages run at once, a container each (--jobs), and outside stages run
beside them; the table, the statement and the progress keep plan order, a stage waits for
what it `needs`, and every container is removed."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import cli_stage, container_exists, containers_of, imagegate, pipeline_file

SLEEP = "import time; time.sleep(3); print('slept')"


def pipeline(tmp: Path) -> Path:
    stages = [
        cli_stage("slow_a", SLEEP),
        cli_stage("slow_b", SLEEP),
        "{id: after_a, probe: find_spec, timeout: 2m, needs: [slow_a], with: {modules: [json]}}",
        "{id: json, probe: find_spec, timeout: 2m, with: {modules: [json]}}",
    ]
    return pipeline_file(tmp / "parallel.yaml", "parallel", stages)


def test_groups_run_at_once_in_their_own_containers(images: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "o"
    r = imagegate(
        "run", images["python"], "-p", str(pipeline(tmp_path)), "-j", "2", "-o", str(out), "--no-sign"
    )
    assert r.returncode == 0, r.stderr
    (attempt,) = [p for p in out.glob("sha256-*/*") if p.is_dir()]
    run = json.loads((attempt / "run.json").read_text())["run"]
    controllers = run["controllers"]
    assert len(controllers) == 2
    groups = [c["stages"] for c in controllers]
    # slow_a and after_a (which needs it) share a controller; the two slow stages do not.
    assert any({"slow_a", "after_a"} <= set(g) for g in groups)
    assert not any({"slow_a", "slow_b"} <= set(g) for g in groups)
    # The two containers' runs overlapped in time (ISO timestamps compare as strings).
    (a0, a1), (b0, b1) = ((c["started"], c["finished"]) for c in controllers)
    assert a0 < b1 and b0 < a1, controllers
    assert len({c["container_id"] for c in controllers}) == 2
    assert not any(container_exists(c) for c in containers_of(attempt))
    statement = json.loads((attempt / "statement.json").read_text())
    assert [s["id"] for s in statement["predicate"]["stages"]] == ["slow_a", "slow_b", "after_a", "json"]
    # Live progress lines come in plan order too.
    lines = [ln for ln in r.stderr.splitlines() if "] " in ln and ("PASS" in ln or "FAIL" in ln)]
    assert [ln.split("] ")[1].split()[0] for ln in lines] == ["slow_a", "slow_b", "after_a", "json"], r.stderr


def test_one_job_is_one_controller(images: dict[str, str], tmp_path: Path) -> None:
    r = imagegate(
        "run", images["python"], "-p", "python", "-m", "json", "-j", "1", "-o", str(tmp_path), "--no-sign"
    )
    assert r.returncode == 0, r.stderr
    (attempt,) = [p for p in tmp_path.glob("sha256-*/*") if p.is_dir()]
    assert len(json.loads((attempt / "run.json").read_text())["run"]["controllers"]) == 1
    assert (attempt / "controller.events.log").is_file()


def test_skip_leaves_a_stage_and_its_dependents_out(images: dict[str, str], tmp_path: Path) -> None:
    r = imagegate(
        "run", images["python"], "-p", str(pipeline(tmp_path)), "--skip", "slow_a", "--skip", "slow_b",
        "-o", str(tmp_path / "o"), "--no-sign", "--format", "json",
    )  # fmt: skip
    # Two of its checks left out and one waiting on them: no level reached, so not accepted.
    assert r.returncode == 1, r.stderr
    assert (
        "imagegate: verdict CPU_PASS_SLOW_A_SLOW_B_DEFERRED rejected: no level reached (not run or not "
        "passed: slow_a DEFERRED, slow_b DEFERRED, after_a SKIPPED)"
    ) in r.stderr, r.stderr
    pred = r.json()["predicate"]
    stages = {s["id"]: (s["status"], s["detail"]) for s in pred["stages"]}
    # Left out, so not run: DEFERRED (never PASS), for `complete` to run; what needs it waits.
    assert stages["slow_a"] == (
        "DEFERRED",
        "not run: left out with --skip slow_a; `imagegate complete` runs it",
    )
    assert stages["after_a"][0] == "SKIPPED" and "slow_a" in stages["after_a"][1]
    assert stages["json"][0] == "PASS"
    assert pred["verdict"] == "CPU_PASS_SLOW_A_SLOW_B_DEFERRED"
    bad = imagegate("run", images["python"], "-p", "python", "--skip", "nope", "-o", str(tmp_path / "b"))
    assert bad.returncode == 3 and "--skip nope: no such stage" in bad.stderr
