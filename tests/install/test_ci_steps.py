"""The ready CI steps, executed as their runners execute them (tests/install/ci_runners.py) against
the real engine and the test images: the GitHub Action (action.yml), the GitLab CI template
(ci/gitlab/imagegate.gitlab-ci.yml) and the Tekton Task (ci/tekton/imagegate-task.yaml) give the
verdict as outputs or results, the JUnit file and the summary; a rejected image fails the step
unless fail-on says otherwise; bad input is refused with exit 3. Their YAML validates against what
each platform publishes: GitHub's and GitLab's schemas as check-jsonschema vendors them, the Task
against Tekton's own CRD schema (tests/install/data/tekton)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.helpers import DOCKER_SOCK
from tests.install.ci_runners import (
    ActionRun,
    GitLabJob,
    github_expression,
    resolve_job,
    run_action,
    run_gitlab_job,
    run_tekton_step,
    task_references,
)

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / "action.yml"
GITLAB = ROOT / "ci" / "gitlab" / "imagegate.gitlab-ci.yml"
RELEASE = ROOT / ".github" / "workflows" / "release.yml"
TEKTON = ROOT / "ci" / "tekton" / "imagegate-task.yaml"
TEKTON_SCHEMA = Path(__file__).parent / "data" / "tekton" / "task-v1.schema.json"
# The imagegate these tests run with: the steps' install is skipped by pointing at it, but once.
IMAGEGATE = Path(sys.executable).parent / "imagegate"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "GITHUB_ACTIONS")}
    return {**env, "DOCKER_HOST": DOCKER_SOCK}


def _junit(path: Path) -> dict[str, str]:
    """stage -> PASS or FAIL, from a JUnit file that must parse."""
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    return {
        c.get("name", ""): "FAIL" if c.find("failure") is not None else "PASS" for c in suite.iter("testcase")
    }


# ---- the YAML against each platform's schema -------------------------------------------------


def _check_jsonschema(schema: str, path: Path) -> subprocess.CompletedProcess[str]:
    tool = Path(sys.executable).parent / "check-jsonschema"
    return subprocess.run(
        [str(tool), "--builtin-schema", schema, str(path)], capture_output=True, text=True, timeout=120
    )


def _with_a_job(template: dict[str, Any]) -> dict[str, Any]:
    """The template with a job that extends its hidden job, as GitLab resolves it: the schema
    leaves hidden keys (`.imagegate`) unchecked, so the job a user gets is what is checked."""
    job = resolve_job(GITLAB, {"extends": ".imagegate", "variables": {"IMAGEGATE_IMAGE": "app:1"}})
    return {**template, "gate-image": job}


@pytest.mark.parametrize(
    ("schema", "path", "complete", "break_it"),
    [
        ("vendor.github-actions", ACTION, lambda d: d, lambda d: d["runs"].update(using="compost")),
        (
            "vendor.github-workflows",
            RELEASE,
            lambda d: {("on" if k is True else k): v for k, v in d.items()},  # YAML 1.1 reads `on` as true
            lambda d: d["jobs"]["publish"]["permissions"].update({"id-token": "sometimes"}),
        ),
        (
            "vendor.gitlab-ci",
            GITLAB,
            _with_a_job,
            lambda d: d["gate-image"]["artifacts"].update(when="sometimes"),
        ),
    ],
)
def test_the_yaml_validates_against_the_platform_schema(
    schema: str, path: Path, complete: Any, break_it: Any, tmp_path: Path
) -> None:
    ok = _check_jsonschema(schema, path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    document = complete(yaml.safe_load(path.read_text()))
    (tmp_path / "ok.yml").write_text(yaml.safe_dump(document))
    ok = _check_jsonschema(schema, tmp_path / "ok.yml")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # The same check refuses a copy with one value no runner takes: the schema really is applied.
    break_it(document)
    (tmp_path / "broken.yml").write_text(yaml.safe_dump(document))
    bad = _check_jsonschema(schema, tmp_path / "broken.yml")
    assert bad.returncode == 1, bad.stdout + bad.stderr


def _closed(schema: Any) -> Any:
    """Tekton's schema with every object that lists its properties closed to others: the API
    server's strict field validation (kubectl's default) refuses an unknown field, where plain
    JSON Schema would let it through; objects marked x-kubernetes-preserve-unknown-fields stay open."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def test_the_tekton_task_validates_against_tektons_crd_schema() -> None:
    validator = jsonschema.Draft7Validator(_closed(json.loads(TEKTON_SCHEMA.read_text())))
    task = yaml.safe_load(TEKTON.read_text())
    assert (task["apiVersion"], task["kind"]) == ("tekton.dev/v1", "Task")
    assert [e.message for e in validator.iter_errors(task)] == []
    assert task_references(task) == []
    misspelt = copy.deepcopy(task)
    misspelt["spec"]["steps"][0]["workingdir"] = misspelt["spec"]["steps"][0].pop("workingDir")
    assert any("workingdir" in e.message for e in validator.iter_errors(misspelt))
    undeclared = copy.deepcopy(task)
    undeclared["spec"]["steps"][0]["script"] += "echo $(params.nope)\n"
    assert task_references(undeclared) == ["$(params.nope)"]


def test_the_expression_stand_in_reads_what_the_action_writes() -> None:
    context = {
        "inputs": {"upload": "true", "fail-on": "never"},
        "steps": {"run": {"outputs": {"verdict": "PASS"}}},
    }
    assert github_expression("!cancelled() && inputs.upload == 'true'", context, "failure") is True
    assert github_expression("!cancelled() && inputs.upload == 'true'", context, "cancelled") is False
    assert github_expression("inputs.upload == 'false' || inputs.fail-on == 'NEVER'", context) is True
    assert github_expression("steps.run.outputs.verdict", context) == "PASS"
    assert github_expression("steps.missing.outputs.verdict", context) == ""


# ---- the GitHub Action ------------------------------------------------------------------------


def _action(tmp_path: Path, **inputs: str) -> tuple[ActionRun, Path]:
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    return run_action(ACTION, inputs, workspace, _env()), workspace


def _uploaded(run: ActionRun, workspace: Path) -> list[Path]:
    (upload,) = run.uses
    assert upload["uses"].startswith("actions/upload-artifact@") and upload["with"]["name"] == "imagegate"
    paths = [workspace / p for p in upload["with"]["path"].split()]
    assert paths and all(p.is_dir() and any(p.iterdir()) for p in paths), paths
    return paths


@pytest.mark.engine
def test_the_action_installs_imagegate_and_accepts_an_image(images: dict[str, str], tmp_path: Path) -> None:
    """The real install step: the action's checkout pip-installed into a fresh venv."""
    run, workspace = _action(tmp_path, image=images["python"], pipeline="python")
    assert run.outcome == "success", run.log
    assert run.steps["install"]["outputs"]["bin"].endswith("/imagegate-venv/bin/imagegate")
    assert run.outputs["verdict"] == "PASS" and run.outputs["exit-code"] == "0", run.outputs
    assert (workspace / run.outputs["attempt"] / "attestation.dsse.json").is_file()
    assert _junit(workspace / run.outputs["junit"]) == {"pip_check": "PASS", "find_spec": "PASS"}
    assert (workspace / run.outputs["html"]).is_file() and (workspace / run.outputs["sarif"]).is_file()
    assert "imagegate: PASS" in run.summary and "`PIP_CHECK_PASS`" in run.summary
    assert "verdict `PASS`, exit code 0, fail-on `rejected`: the step passes." in run.summary
    _uploaded(run, workspace)


@pytest.mark.engine
def test_a_rejected_image_fails_the_action_and_its_reports_are_kept(
    images: dict[str, str], tmp_path: Path
) -> None:
    run, workspace = _action(tmp_path, image=images["conflict"], imagegate=str(IMAGEGATE))
    assert run.outcome == "failure" and run.steps["run"]["returncode"] == 1, run.log
    assert run.outputs["verdict"] == "FAIL" and run.outputs["exit-code"] == "1", run.outputs
    assert _junit(workspace / run.outputs["junit"])["pip_check"] == "FAIL"
    assert "::error title=imagegate PIP_CHECK_FAIL" in run.steps["run"]["stderr"]
    assert "imagegate: FAIL" in run.summary and "the step fails." in run.summary
    assert (workspace / run.outputs["attempt"]).is_dir()
    _uploaded(run, workspace)  # the upload step runs after the failed one (!cancelled())


@pytest.mark.engine
def test_fail_on_never_keeps_the_step_green_with_the_verdict_in_its_outputs(
    images: dict[str, str], tmp_path: Path
) -> None:
    run, _ = _action(
        tmp_path, image=images["conflict"], imagegate=str(IMAGEGATE), args="-m json --skip 'pip_check'", **{"fail-on": "never"}
    )  # fmt: skip
    # pip_check left out by the extra arguments: DEFERRED, so the verdict is a deferred one.
    assert run.outcome == "success", run.log
    assert run.outputs["verdict"] == "CPU_PASS_PIP_CHECK_DEFERRED" and run.outputs["exit-code"] == "0"
    run, _ = _action(tmp_path, image=images["conflict"], imagegate=str(IMAGEGATE), **{"fail-on": "never"})
    assert run.outcome == "success", run.log
    assert run.outputs["verdict"] == "FAIL" and run.outputs["exit-code"] == "1", run.outputs
    assert "fail-on `never`: the step passes." in run.summary


def test_the_action_refuses_bad_inputs_and_runs_nothing_from_them(tmp_path: Path) -> None:
    run, workspace = _action(
        tmp_path, image="x; touch injected", imagegate=str(IMAGEGATE), **{"fail-on": "never"}
    )
    # No verdict at all (a usage error) fails the step even under fail-on never.
    assert run.outcome == "failure" and run.steps["run"]["returncode"] == 3, run.log
    assert run.outputs["exit-code"] == "3" and run.outputs["verdict"] == ""
    assert not list(workspace.rglob("injected")) and "no verdict" in run.summary
    run, _ = _action(tmp_path, image="app:1", imagegate=str(IMAGEGATE), **{"fail-on": "sometimes"})
    assert run.steps["run"]["returncode"] == 3
    assert (
        "::error title=imagegate action::input fail-on: 'sometimes' is not one of"
        in run.steps["run"]["stdout"]
    )
    run, _ = _action(tmp_path, image="app:1", imagegate=str(IMAGEGATE), args="-m 'json")
    assert run.steps["run"]["returncode"] == 3 and "input args: not shell words" in run.steps["run"]["stdout"]


# ---- the GitLab CI template -------------------------------------------------------------------


def _gitlab(tmp_path: Path, **variables: str) -> tuple[GitLabJob, Path]:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    # A runner with the host's engine, not Docker in Docker: the job sets DOCKER_HOST, as its user would.
    job = {"extends": ".imagegate", "variables": {"DOCKER_HOST": DOCKER_SOCK, **variables}}
    return run_gitlab_job(GITLAB, job, project, _env()), project


def _dotenv(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def _gitlab_artifacts(job: GitLabJob, project: Path) -> None:
    artifacts = job.job["artifacts"]
    assert artifacts["when"] == "always"
    assert all((project / p).is_dir() for p in artifacts["paths"]), artifacts
    assert all((project / p).is_file() for p in artifacts["reports"].values()), artifacts


@pytest.mark.engine
def test_the_gitlab_job_accepts_and_reports(images: dict[str, str], tmp_path: Path) -> None:
    job, project = _gitlab(tmp_path, IMAGEGATE_IMAGE=images["python"], IMAGEGATE_BIN=str(IMAGEGATE))
    assert job.returncode == 0, job.output
    env = _dotenv(project / job.job["artifacts"]["reports"]["dotenv"])
    assert env["IMAGEGATE_VERDICT"] == "PASS" and env["IMAGEGATE_EXIT_CODE"] == "0", env
    assert (project / env["IMAGEGATE_ATTEMPT"] / "statement.json").is_file()
    assert _junit(project / job.job["artifacts"]["reports"]["junit"]) == {
        "pip_check": "PASS",
        "find_spec": "PASS",
    }
    _gitlab_artifacts(job, project)


@pytest.mark.engine
def test_a_rejected_image_fails_the_gitlab_job(images: dict[str, str], tmp_path: Path) -> None:
    job, project = _gitlab(tmp_path, IMAGEGATE_IMAGE=images["conflict"], IMAGEGATE_BIN=str(IMAGEGATE))
    assert job.returncode == 1, job.output
    env = _dotenv(project / "imagegate.env")
    assert env["IMAGEGATE_VERDICT"] == "FAIL" and env["IMAGEGATE_EXIT_CODE"] == "1", env
    assert _junit(project / "imagegate-reports" / "junit.xml")["pip_check"] == "FAIL"
    assert "imagegate job: verdict FAIL, exit code 1" in job.output
    _gitlab_artifacts(job, project)


def test_the_gitlab_job_names_what_is_missing(tmp_path: Path) -> None:
    job, project = _gitlab(tmp_path, IMAGEGATE_IMAGE="app:1")
    assert job.returncode == 3 and "IMAGEGATE_INSTALL is empty" in job.output, job.output
    job, project = _gitlab(
        tmp_path, IMAGEGATE_IMAGE="app:1", IMAGEGATE_BIN=str(IMAGEGATE), IMAGEGATE_FAIL_ON="no"
    )
    assert job.returncode == 3 and "IMAGEGATE_FAIL_ON 'no' is not one of" in job.output, job.output
    assert _dotenv(project / "imagegate.env") == {"IMAGEGATE_EXIT_CODE": "3"}


# ---- the Tekton Task --------------------------------------------------------------------------


def _tekton(tmp_path: Path, **params: str) -> tuple[Any, Path]:
    evidence = tmp_path / "evidence"
    evidence.mkdir(parents=True, exist_ok=True)
    step = run_tekton_step(
        TEKTON, {"docker-host": DOCKER_SOCK, **params}, {"evidence": evidence, "source": None}, tmp_path / "tekton", _env()
    )  # fmt: skip
    return step, evidence


@pytest.mark.engine
def test_the_tekton_task_accepts_and_sets_its_results(images: dict[str, str], tmp_path: Path) -> None:
    step, evidence = _tekton(tmp_path, image=images["python"], imagegate=str(IMAGEGATE))
    assert step.returncode == 0, step.output
    assert step.results["verdict"] == "PASS" and step.results["exit-code"] == "0", step.results
    assert (evidence / step.results["attempt"] / "statement.json").is_file()
    assert _junit(evidence / "imagegate-reports" / "junit.xml") == {"pip_check": "PASS", "find_spec": "PASS"}


@pytest.mark.engine
def test_the_tekton_task_fails_a_rejected_image_unless_fail_on_never(
    images: dict[str, str], tmp_path: Path
) -> None:
    for fail_on, returncode in (("rejected", 1), ("never", 0)):
        step, evidence = _tekton(
            tmp_path / fail_on, image=images["conflict"], imagegate=str(IMAGEGATE), **{"fail-on": fail_on}
        )
        assert step.returncode == returncode, step.output
        # The results are written whatever the step's exit: a Pipeline reads them either way.
        assert step.results["verdict"] == "FAIL" and step.results["exit-code"] == "1", step.results
        assert _junit(evidence / "imagegate-reports" / "junit.xml")["pip_check"] == "FAIL"


def test_the_tekton_task_names_the_missing_source_workspace(tmp_path: Path) -> None:
    step, _ = _tekton(tmp_path, image="app:1")
    assert step.returncode == 3 and "no source workspace" in step.output, step.output
    assert step.results["exit-code"] == "3"


def test_the_release_workflow_publishes_a_tag_by_trusted_publishing_alone() -> None:
    """What PyPI's trusted publishing needs and what keeps it narrow: run on a version tag only;
    the build job reads the whole history (the version is the tag's) and holds no token; only the
    publish job, in its environment, may ask for the OIDC token; no stored secret anywhere."""
    text = RELEASE.read_text()
    doc = yaml.safe_load(text)
    on = doc[True]  # YAML 1.1 reads the key `on` as true
    assert on == {"push": {"tags": ["v*"]}}
    assert doc["permissions"] == {}
    build, publish = doc["jobs"]["build"], doc["jobs"]["publish"]
    assert build["permissions"] == {"contents": "read"}
    checkout = next(s for s in build["steps"] if str(s.get("uses", "")).startswith("actions/checkout@"))
    assert checkout["with"]["fetch-depth"] == 0
    assert publish["needs"] == "build" and publish["environment"] == "pypi"
    assert publish["permissions"] == {"id-token": "write"}
    assert publish["steps"][-1]["uses"].startswith("pypa/gh-action-pypi-publish@")
    assert "secrets." not in text and "password" not in text
