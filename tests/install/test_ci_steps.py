"""The ready CI steps, executed as their runners execute them (tests/install/ci_runners.py) against
the real engine and the test images: the GitHub Action (action.yml), the GitLab CI template
(ci/gitlab/imagegate.gitlab-ci.yml) and the Tekton Task (ci/tekton/imagegate-task.yaml) give the
verdict as outputs or results, the JUnit file and the summary; a rejected image fails the step
unless fail-on says otherwise; bad input is refused with exit 3. Each refuses to sign without a
key (exit 3, before anything runs), signs with the one given (the signature verified with its
public half), says when a run was unsigned, logs in to the registry with the CI's own
credentials, and runs only images pinned by digest, with no engine exposed without TLS. The
Action also runs through nektos/act; the GitLab job and the Tekton step also run in a Debian root
standing in for their image. Their YAML validates against what each platform publishes: GitHub's
and GitLab's schemas as check-jsonschema vendors them, the Task against Tekton's own CRD schema
(tests/install/data/tekton)."""

from __future__ import annotations

import base64
import copy
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers import DOCKER_SOCK, go_tools
from tests.install.ci_runners import (
    ActionRun,
    Container,
    GitLabJob,
    github_expression,
    resolve_job,
    run_act,
    run_action,
    run_gitlab_job,
    run_tekton_step,
    task_references,
)
from tests.oci.infra import free_port, sh, skopeo, start_registry, wait_for

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / "action.yml"
GITLAB = ROOT / "ci" / "gitlab" / "imagegate.gitlab-ci.yml"
RELEASE = ROOT / ".github" / "workflows" / "release.yml"
TEKTON = ROOT / "ci" / "tekton" / "imagegate-task.yaml"
TEKTON_SCHEMA = Path(__file__).parent / "data" / "tekton" / "task-v1.schema.json"
CONSTRAINTS = ROOT / "ci" / "constraints.txt"
UPLOAD_STAND_IN = Path(__file__).parent / "data" / "upload-artifact-stand-in"
# The imagegate these tests run with: the steps' install is skipped by pointing at it, but once.
IMAGEGATE = Path(sys.executable).parent / "imagegate"
NO_KEY = "no signing key"  # what each step's refusal to sign without a key says


@dataclass(frozen=True)
class KeyPair:
    key: Path
    pub: Path


def _keygen(prefix: Path, password: str = "") -> KeyPair:
    env = {**os.environ, "IMAGEGATE_KEY_PASSWORD": password}
    made = subprocess.run(
        [str(IMAGEGATE), "keygen", "--out", str(prefix)], capture_output=True, text=True, env=env
    )
    assert made.returncode == 0, made.stderr
    return KeyPair(prefix.with_suffix(".key"), prefix.with_suffix(".pub"))


@pytest.fixture(scope="module")
def ci_key(tmp_path_factory: pytest.TempPathFactory) -> KeyPair:
    """The CI's signing key, made as its user makes it (imagegate keygen)."""
    return _keygen(tmp_path_factory.mktemp("ci-key") / "ci")


@dataclass(frozen=True)
class AuthImage:
    ref: str  # in a registry on 127.0.0.1 with Basic auth
    user: str
    password: str

    def docker_config(self) -> str:
        """The config.json `docker login` would write for it."""
        auth = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        return json.dumps({"auths": {self.ref.split("/")[0]: {"auth": auth}}})


@pytest.fixture(scope="module")
def auth_image(images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthImage]:
    """The python test image in a registry that wants a password (docker-registry, htpasswd)."""
    d = tmp_path_factory.mktemp("auth-registry")
    user, password = "ci-user", "ci-token-Secret-1"
    (d / "htpasswd").write_text(sh("htpasswd", "-Bbn", user, password))
    registry = start_registry(d, htpasswd=d / "htpasswd")
    ref = f"{registry.host}/team/python:1"
    skopeo("copy", "-q", "--dest-tls-verify=false", "--dest-creds", f"{user}:{password}",
           f"docker-daemon:{images['python']}", f"docker://{ref}")  # fmt: skip
    yield AuthImage(ref, user, password)
    registry.stop()


@pytest.fixture(scope="session")
def act() -> str:
    """nektos/act, built from the Go module proxy at tests/consumers/act/go.mod's version and
    cached outside the clone (scripts/consumers.py); a cached build takes no time."""
    script = go_tools("act")
    return str(script.exe(script.ACT))


def _verifies(attempt: Path, pub: Path, verdict: str = "PASS") -> None:
    """The attempt's attestation verifies with the CI key's public half (imagegate verify)."""
    v = subprocess.run(
        [str(IMAGEGATE), "verify", str(attempt / "attestation.dsse.json"), "--key", str(pub),
         "--expect-verdict", verdict],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert v.returncode == 0 and "signature: verified" in v.stdout, v.stdout + v.stderr


def _no_key_made(config: Path) -> None:
    """imagegate never ran to make a key of its own in the job's home (its default key)."""
    assert not list(config.rglob("*.key")), list(config.rglob("*"))


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
    """The template with a job that extends each hidden job, as GitLab resolves it: the schema
    leaves hidden keys (`.imagegate`) unchecked, so the jobs a user gets are what is checked."""
    job = resolve_job(GITLAB, {"extends": ".imagegate", "variables": {"IMAGEGATE_IMAGE": "app:1"}})
    dind = resolve_job(GITLAB, {"extends": ".imagegate-dind", "variables": {"IMAGEGATE_IMAGE": "app:1"}})
    return {**template, "gate-image": job, "gate-image-dind": dind}


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
            lambda d: d["gate-image-dind"]["services"][0].update(alias=["docker"]),
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


def _action(tmp_path: Path, env: dict[str, str] | None = None, **inputs: str) -> tuple[ActionRun, Path]:
    workspace = tmp_path / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    return run_action(ACTION, inputs, workspace, env or _env()), workspace


def _uploaded(run: ActionRun, workspace: Path) -> list[Path]:
    (upload,) = run.uses
    assert upload["uses"].startswith("actions/upload-artifact@") and upload["with"]["name"] == "imagegate"
    paths = [workspace / p for p in upload["with"]["path"].split()]
    assert paths and all(p.is_dir() and any(p.iterdir()) for p in paths), paths
    return paths


@pytest.mark.engine
def test_the_action_installs_imagegate_and_accepts_an_image(
    images: dict[str, str], ci_key: KeyPair, tmp_path: Path
) -> None:
    """The real install step: the action's checkout pip-installed into a fresh venv, its
    dependencies at ci/constraints.txt's versions; the attestation signed with the key given."""
    run, workspace = _action(
        tmp_path, image=images["python"], pipeline="python", **{"signing-key": ci_key.key.read_text()}
    )
    assert run.outcome == "success", run.log
    assert run.steps["install"]["outputs"]["bin"].endswith("/imagegate-venv/bin/imagegate")
    assert run.outputs["verdict"] == "PASS" and run.outputs["exit-code"] == "0", run.outputs
    assert run.outputs["signed"] == "true"
    _verifies(workspace / run.outputs["attempt"], ci_key.pub)
    assert _junit(workspace / run.outputs["junit"]) == {"pip_check": "PASS", "find_spec": "PASS"}
    assert (workspace / run.outputs["html"]).is_file() and (workspace / run.outputs["sarif"]).is_file()
    assert "imagegate: PASS" in run.summary and "`PIP_CHECK_PASS`" in run.summary
    assert "verdict `PASS`, signed, exit code 0, fail-on `rejected`: the step passes." in run.summary
    # The key's file lived in the runner's temporary folder for the run alone.
    assert not (workspace.parent / f"{workspace.name}-runner-temp" / "imagegate-secrets").exists()
    _uploaded(run, workspace)


@pytest.mark.engine
def test_a_rejected_image_fails_the_action_and_its_reports_are_kept(
    images: dict[str, str], ci_key: KeyPair, tmp_path: Path
) -> None:
    env = {**_env(), "IMAGEGATE_SIGNING_KEY": str(ci_key.key)}  # the key's path, from the job's env
    run, workspace = _action(tmp_path, env, image=images["conflict"], imagegate=str(IMAGEGATE))
    assert run.outcome == "failure" and run.steps["run"]["returncode"] == 1, run.log
    assert run.outputs["verdict"] == "FAIL" and run.outputs["exit-code"] == "1", run.outputs
    assert _junit(workspace / run.outputs["junit"])["pip_check"] == "FAIL"
    assert "::error title=imagegate PIP_CHECK_FAIL" in run.steps["run"]["stderr"]
    assert "imagegate: FAIL" in run.summary and "the step fails." in run.summary
    assert (workspace / run.outputs["attempt"]).is_dir()
    _verifies(workspace / run.outputs["attempt"], ci_key.pub, "FAIL")
    _uploaded(run, workspace)  # the upload step runs after the failed one (!cancelled())


@pytest.mark.engine
def test_fail_on_never_keeps_the_step_green_with_the_verdict_in_its_outputs(
    images: dict[str, str], tmp_path: Path
) -> None:
    run, _ = _action(
        tmp_path, image=images["conflict"], imagegate=str(IMAGEGATE), args="-m json --skip 'pip_check'",
        sign="false", **{"fail-on": "never"},
    )  # fmt: skip
    # pip_check left out by the extra arguments: DEFERRED, so the verdict is a deferred one, and
    # with a CPU stage not run it reaches no level: rejected (exit 1), the step green all the same.
    assert run.outcome == "success", run.log
    assert run.outputs["verdict"] == "CPU_PASS_PIP_CHECK_DEFERRED" and run.outputs["exit-code"] == "1"
    run, _ = _action(
        tmp_path, image=images["conflict"], imagegate=str(IMAGEGATE), sign="false", **{"fail-on": "never"}
    )
    assert run.outcome == "success", run.log
    assert run.outputs["verdict"] == "FAIL" and run.outputs["exit-code"] == "1", run.outputs
    # An unsigned run, asked for, is said to be one.
    assert run.outputs["signed"] == "false" and "verdict `FAIL`, **unsigned**" in run.summary
    assert "fail-on `never`: the step passes." in run.summary


def test_the_action_refuses_to_sign_without_a_key_before_anything_runs(tmp_path: Path) -> None:
    config = tmp_path / "config"
    env = {**_env(), "XDG_CONFIG_HOME": str(config)}
    run, workspace = _action(tmp_path, env, image="app:1", imagegate=str(IMAGEGATE))
    assert run.outcome == "failure" and run.steps["check"]["returncode"] == 3, run.log
    assert (
        f"::error title=imagegate action::sign is true but there is {NO_KEY}" in run.steps["check"]["stdout"]
    )
    assert run.steps["install"]["outcome"] == run.steps["run"]["outcome"] == "skipped"
    assert run.outputs["exit-code"] == "3" and run.outputs["verdict"] == ""
    assert not (workspace / "imagegate-runs").exists()
    _no_key_made(config)
    # A key named by the environment that is not there is refused the same way.
    env["IMAGEGATE_SIGNING_KEY"] = str(tmp_path / "gone.key")
    run, _ = _action(tmp_path, env, image="app:1", imagegate=str(IMAGEGATE))
    assert run.steps["check"]["returncode"] == 3 and "IMAGEGATE_SIGNING_KEY names no file" in run.log
    _no_key_made(config)


def test_the_action_refuses_bad_inputs_and_runs_nothing_from_them(tmp_path: Path) -> None:
    run, workspace = _action(
        tmp_path, image="x; touch injected", imagegate=str(IMAGEGATE), sign="false", **{"fail-on": "never"}
    )
    # No verdict at all (a usage error) fails the step even under fail-on never.
    assert run.outcome == "failure" and run.steps["run"]["returncode"] == 3, run.log
    assert run.outputs["exit-code"] == "3" and run.outputs["verdict"] == ""
    assert not list(workspace.rglob("injected")) and "no verdict" in run.summary
    run, _ = _action(tmp_path, image="app:1", imagegate=str(IMAGEGATE), **{"fail-on": "sometimes"})
    assert run.steps["check"]["returncode"] == 3
    assert (
        "::error title=imagegate action::input fail-on: 'sometimes' is not one of"
        in run.steps["check"]["stdout"]
    )
    run, _ = _action(tmp_path, image="app:1", imagegate=str(IMAGEGATE), sign="false", args="-m 'json")
    assert run.steps["run"]["returncode"] == 3 and "input args: not shell words" in run.steps["run"]["stdout"]


@pytest.mark.engine
def test_the_action_logs_in_to_the_registry_with_the_token_given(
    auth_image: AuthImage, tmp_path: Path
) -> None:
    """The rootfs driver pulls from a registry with Basic auth: with registry-username and
    registry-password (a token) the Action writes a Docker config.json imagegate reads; without,
    the registry refuses the pull. The config.json is removed after the run."""
    login = {"registry-username": auth_image.user, "registry-password": auth_image.password}
    run, _ = _action(
        tmp_path / "login", image=auth_image.ref, imagegate=str(IMAGEGATE), driver="rootfs", sign="false", **login
    )  # fmt: skip
    assert run.outcome == "success" and run.outputs["verdict"] == "PASS", run.log
    assert f"registry login for {auth_image.ref.split('/')[0]} as {auth_image.user}" in run.log
    assert auth_image.password not in run.log
    run, _ = _action(
        tmp_path / "none", image=auth_image.ref, imagegate=str(IMAGEGATE), driver="rootfs", sign="false"
    )
    assert run.outcome == "failure" and run.outputs["verdict"] == "", run.log
    assert "401" in run.log or "unauthorized" in run.log.lower(), run.log


def _act_job(name: str, image: str, with_: dict[str, str]) -> dict[str, Any]:
    """A job that uses the Action as a workflow would (OWNER/NAME@REF), then records what it got."""
    record = (
        'import json, os; json.dump({k: os.environ[k] for k in ("OUTCOME", "EXIT", "SIGNED", "ATTEMPT")}, '
        f'open(os.environ["IMAGEGATE_TEST_RESULTS"] + "/{name}.json", "w"))'
    )
    return {
        "runs-on": "ubuntu-latest",
        "steps": [
            {"id": "gate", "uses": "imagegate/imagegate@v1", "with": {"image": image, **with_}},
            {
                "if": "${{ always() }}",
                "run": f"python3 -c '{record}'",
                "env": {
                    "OUTCOME": "${{ steps.gate.outcome }}",
                    "EXIT": "${{ steps.gate.outputs.exit-code }}",
                    "SIGNED": "${{ steps.gate.outputs.signed }}",
                    "ATTEMPT": "${{ steps.gate.outputs.attempt }}",
                },
            },
        ],
    }


@pytest.mark.engine
def test_the_action_through_act_refuses_without_a_key_and_signs_with_one(
    act: str, images: dict[str, str], ci_key: KeyPair, tmp_path: Path
) -> None:
    """GitHub's runner as nektos/act runs it, on this machine's shell: one job with no key fails
    with the refusal, one with the key from a secret signs, and the signature verifies; the
    upload is act's too, with actions/upload-artifact's STAND-IN (tests/install/data)."""
    action = tmp_path / "action"  # the Action as a workflow fetches it: its repository's files
    (action / "ci").mkdir(parents=True)
    shutil.copy(ACTION, action / "action.yml")
    shutil.copy(CONSTRAINTS, action / "ci" / "constraints.txt")
    results, artifacts = tmp_path / "results", tmp_path / "artifacts"
    results.mkdir()
    common = {"imagegate": str(IMAGEGATE)}  # the install is the host runner's test above
    workflow = {
        "on": "push",
        "env": {"IMAGEGATE_TEST_RESULTS": str(results), "IMAGEGATE_TEST_ARTIFACTS": str(artifacts)},
        "jobs": {
            "no-key": _act_job("no-key", images["python"], common),
            "signed": _act_job("signed", images["python"], {**common, "signing-key": "${{ secrets.IMAGEGATE_KEY }}"}),
        },
    }  # fmt: skip
    upload = next(s["uses"] for s in yaml.safe_load(ACTION.read_text())["runs"]["steps"] if "uses" in s)
    for work in ("act", "act-again"):
        run = run_act(
            act, yaml.safe_dump(workflow), tmp_path / work,
            {"imagegate/imagegate@v1": action, upload: UPLOAD_STAND_IN},
            {"IMAGEGATE_KEY": ci_key.key.read_text()},
        )  # fmt: skip
        # act's host runner returns from a failed command before it has copied the rest of the
        # command's terminal output (nektos/act v0.2.89 pkg/container/host_environment.go, exec:
        # `if err != nil { return err }` comes before `<-logctx.Done()`): on a busy machine the
        # refusal's line can be lost from act's log, not from the step. Once more, then it counts.
        if f"sign is true but there is {NO_KEY}" in run.log:
            break
    assert run.returncode != 0 and "Job 'no-key' failed" in run.log, run.log[-5000:]
    refused = json.loads((results / "no-key.json").read_text())
    assert refused["OUTCOME"] == "failure" and refused["EXIT"] == "3", refused
    assert f"sign is true but there is {NO_KEY}" in run.log
    assert "🏁  Job succeeded" in run.log and "[test.yml/signed] 🏁  Job succeeded" in run.log, run.log[
        -5000:
    ]
    signed = json.loads((results / "signed.json").read_text())
    assert signed["OUTCOME"] == "success" and signed["EXIT"] == "0" and signed["SIGNED"] == "true", signed
    assert ci_key.key.read_text().splitlines()[1] not in run.log  # the key's text is in no log
    # The job's workspace is gone with it: what is left is the artifact, here the stand-in's copy
    # (the reports and the evidence), and its attestation verifies.
    _verifies(artifacts / "imagegate" / signed["ATTEMPT"], ci_key.pub)
    _no_key_made(run.home)


# ---- the GitLab CI template -------------------------------------------------------------------


def _gitlab(
    tmp_path: Path, key: KeyPair | None, settings: dict[str, str] | None = None, **variables: str
) -> tuple[GitLabJob, Path]:
    """`settings`: CI/CD variables of the project's settings (raw: not expanded), beside the job's."""
    project = tmp_path / "project"
    project.mkdir(parents=True, exist_ok=True)
    # A runner with the host's engine, not Docker in Docker: the job sets DOCKER_HOST and the docker
    # driver, as its user would; the key is a File variable (GitLab hands the job its path).
    signing = {"IMAGEGATE_SIGNING_KEY": str(key.key)} if key else {}
    job = {
        "extends": ".imagegate",
        "variables": {"DOCKER_HOST": DOCKER_SOCK, "IMAGEGATE_DRIVER": "docker", **signing, **variables},
    }
    return run_gitlab_job(GITLAB, job, project, {**_env(), **(settings or {})}), project


def _dotenv(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def _gitlab_artifacts(job: GitLabJob, project: Path) -> None:
    artifacts = job.job["artifacts"]
    assert artifacts["when"] == "always"
    assert all((project / p).is_dir() for p in artifacts["paths"]), artifacts
    assert all((project / p).is_file() for p in artifacts["reports"].values()), artifacts


@pytest.mark.engine
def test_the_gitlab_job_accepts_and_reports(images: dict[str, str], ci_key: KeyPair, tmp_path: Path) -> None:
    job, project = _gitlab(tmp_path, ci_key, IMAGEGATE_IMAGE=images["python"], IMAGEGATE_BIN=str(IMAGEGATE))
    assert job.returncode == 0, job.output
    env = _dotenv(project / job.job["artifacts"]["reports"]["dotenv"])
    assert env["IMAGEGATE_VERDICT"] == "PASS" and env["IMAGEGATE_EXIT_CODE"] == "0", env
    assert env["IMAGEGATE_SIGNED"] == "true"
    assert (project / env["IMAGEGATE_ATTEMPT"] / "statement.json").is_file()
    _verifies(project / env["IMAGEGATE_ATTEMPT"], ci_key.pub)
    assert _junit(project / job.job["artifacts"]["reports"]["junit"]) == {
        "pip_check": "PASS",
        "find_spec": "PASS",
    }
    _gitlab_artifacts(job, project)


@pytest.mark.engine
def test_a_rejected_image_fails_the_gitlab_job(images: dict[str, str], tmp_path: Path) -> None:
    job, project = _gitlab(
        tmp_path,
        None,
        IMAGEGATE_IMAGE=images["conflict"],
        IMAGEGATE_BIN=str(IMAGEGATE),
        IMAGEGATE_SIGN="false",
    )
    assert job.returncode == 1, job.output
    env = _dotenv(project / "imagegate.env")
    assert env["IMAGEGATE_VERDICT"] == "FAIL" and env["IMAGEGATE_EXIT_CODE"] == "1", env
    assert env["IMAGEGATE_SIGNED"] == "false"  # asked for unsigned, and said so
    assert _junit(project / "imagegate-reports" / "junit.xml")["pip_check"] == "FAIL"
    assert "imagegate job: verdict FAIL (UNSIGNED), exit code 1" in job.output
    _gitlab_artifacts(job, project)


def test_the_gitlab_job_names_what_is_missing(ci_key: KeyPair, tmp_path: Path) -> None:
    job, project = _gitlab(tmp_path, None, IMAGEGATE_IMAGE="app:1", IMAGEGATE_BIN=str(IMAGEGATE))
    assert job.returncode == 3 and f"IMAGEGATE_SIGN is true but there is {NO_KEY}" in job.output, job.output
    assert not (project / "imagegate-runs").exists()
    job, project = _gitlab(tmp_path, ci_key, IMAGEGATE_IMAGE="app:1")
    assert job.returncode == 3 and "IMAGEGATE_INSTALL is empty" in job.output, job.output
    job, project = _gitlab(tmp_path, ci_key, IMAGEGATE_IMAGE="app:1", IMAGEGATE_INSTALL="imagegate.whl")
    assert job.returncode == 3 and "IMAGEGATE_CONSTRAINTS is empty" in job.output, job.output
    job, project = _gitlab(
        tmp_path, ci_key, IMAGEGATE_IMAGE="app:1", IMAGEGATE_BIN=str(IMAGEGATE), IMAGEGATE_FAIL_ON="no"
    )
    assert job.returncode == 3 and "IMAGEGATE_FAIL_ON 'no' is not one of" in job.output, job.output
    assert _dotenv(project / "imagegate.env") == {"IMAGEGATE_EXIT_CODE": "3"}


@pytest.mark.engine
def test_the_gitlab_job_logs_in_with_the_jobs_own_registry_credentials(
    auth_image: AuthImage, tmp_path: Path
) -> None:
    """CI_REGISTRY, CI_REGISTRY_USER and CI_REGISTRY_PASSWORD (GitLab's, for every job) become a
    Docker config.json outside the project folder, which the rootfs driver pulls with."""
    registry = {"CI_REGISTRY": auth_image.ref.split("/")[0], "CI_REGISTRY_USER": auth_image.user,
                "CI_REGISTRY_PASSWORD": auth_image.password}  # fmt: skip
    common = {"IMAGEGATE_IMAGE": auth_image.ref, "IMAGEGATE_BIN": str(IMAGEGATE), "IMAGEGATE_SIGN": "false",
              "IMAGEGATE_DRIVER": "rootfs"}  # fmt: skip
    job, project = _gitlab(tmp_path / "login", None, **common, **registry)
    assert job.returncode == 0, job.output
    assert _dotenv(project / "imagegate.env")["IMAGEGATE_VERDICT"] == "PASS"
    assert f"registry login for {registry['CI_REGISTRY']}" in job.output
    assert not list(project.rglob("config.json"))  # the credentials are no artifact
    job, _ = _gitlab(tmp_path / "none", None, **common)
    assert job.returncode != 0 and ("401" in job.output or "unauthorized" in job.output.lower()), job.output


@dataclass(frozen=True)
class TLSEngine:
    host: str  # tcp://127.0.0.1:PORT, TLS with client certificates required
    client: Path  # ca.pem, cert.pem, key.pem: what Docker in Docker writes in /certs/client


def _certificates(d: Path) -> Path:
    """A CA, the engine's certificate for 127.0.0.1 (d/server-*.pem) and a client's, as dockerd's
    TLS mode wants them (openssl); the client's three files in d/client, as dind writes them."""
    client = d / "client"
    client.mkdir(parents=True)
    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    sh("openssl", "req", "-x509", *new_key, "-keyout", str(d / "ca-key.pem"), "-out", str(d / "ca.pem"),
       "-days", "1", "-subj", "/CN=imagegate test CA")  # fmt: skip
    signed = {
        "server": (d / "server-key.pem", d / "server-cert.pem", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
        "client": (client / "key.pem", client / "cert.pem", "extendedKeyUsage=clientAuth"),
    }  # fmt: skip
    for name, (key, cert, extensions) in signed.items():
        (d / f"{name}.ext").write_text(extensions + "\n")
        sh(
            "openssl",
            "req",
            *new_key,
            "-keyout",
            str(key),
            "-out",
            str(d / f"{name}.csr"),
            "-subj",
            f"/CN={name}",
        )
        sh("openssl", "x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
           "-CAkey", str(d / "ca-key.pem"), "-CAcreateserial", "-days", "1", "-extfile", str(d / f"{name}.ext"),
           "-out", str(cert))  # fmt: skip
    shutil.copy(d / "ca.pem", client / "ca.pem")
    return client


@pytest.fixture(scope="module")
def tls_engine(images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSEngine]:
    """A STAND-IN for the template's docker:dind service, whose image cannot be pulled here: a
    dockerd of its own on 127.0.0.1 in TLS mode (client certificates verified), as the dind
    image starts when DOCKER_TLS_CERTDIR is set, with the python test image loaded into it. No
    bridge, no iptables: it leaves the machine's network alone; stopped by its PID."""
    d = tmp_path_factory.mktemp("tls-engine")
    client = _certificates(d / "certs")
    host, sock = f"tcp://127.0.0.1:{free_port()}", f"unix://{d / 'engine.sock'}"
    log = open(d / "dockerd.log", "wb")  # noqa: SIM115  (dockerd writes it until stopped)
    engine = subprocess.Popen(
        ["dockerd", "--data-root", str(d / "data"), "--exec-root", str(d / "exec"), "--pidfile", str(d / "pid"),
         "-H", sock, "-H", host, "--tlsverify", "--tlscacert", str(d / "certs" / "ca.pem"),
         "--tlscert", str(d / "certs" / "server-cert.pem"), "--tlskey", str(d / "certs" / "server-key.pem"),
         "--bridge", "none", "--iptables=false", "--ip6tables=false"],
        stdout=log, stderr=log,
    )  # fmt: skip
    try:
        assert wait_for(
            lambda: subprocess.run(["docker", "-H", sock, "version"], capture_output=True).returncode == 0, 60
        ), (d / "dockerd.log").read_text()[-3000:]
        saved = subprocess.Popen(
            ["docker", "-H", DOCKER_SOCK, "save", images["python"]], stdout=subprocess.PIPE
        )
        loaded = subprocess.run(
            ["docker", "-H", sock, "load", "-q"], stdin=saved.stdout, capture_output=True, text=True
        )
        assert saved.wait() == 0 and loaded.returncode == 0, loaded.stderr
        yield TLSEngine(host, client)
    finally:
        engine.terminate()
        engine.wait(timeout=60)
        log.close()
        subprocess.run(["rm", "-rf", str(d / "data"), str(d / "exec")], check=False)


@pytest.mark.engine
def test_the_dind_job_and_the_tasks_tcp_engine_are_reached_over_tls_alone(
    tls_engine: TLSEngine, images: dict[str, str], ci_key: KeyPair, tmp_path: Path
) -> None:
    """`.imagegate-dind`'s variables as written (DOCKER_TLS_VERIFY, DOCKER_CERT_PATH where the
    service's client certificates are shared), only the address and the folder moved to the
    stand-in's: the docker driver accepts the image through the engine's TLS port; the same
    engine without the client's certificates answers nothing. The Task's docker-host and
    docker-tls workspace reach it the same way."""
    where = {"DOCKER_HOST": tls_engine.host, "DOCKER_CERT_PATH": str(tls_engine.client)}
    spec = {"extends": ".imagegate-dind", "variables": {
        **where, "IMAGEGATE_IMAGE": images["python"], "IMAGEGATE_BIN": str(IMAGEGATE),
        "IMAGEGATE_SIGNING_KEY": str(ci_key.key)}}  # fmt: skip
    # requests lets REQUESTS_CA_BUNDLE and CURL_CA_BUNDLE replace the engine's CA (DOCKER_CERT_PATH's
    # ca.pem) when they are set, as on this machine; a job's python image sets neither.
    env = {
        k: v for k, v in _env().items() if k not in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "DOCKER_HOST")
    }
    (tmp_path / "tls" / "project").mkdir(parents=True)
    job = run_gitlab_job(GITLAB, spec, tmp_path / "tls" / "project", env)
    assert (
        job.job["variables"]["DOCKER_TLS_VERIFY"] == "1"
        and job.job["variables"]["IMAGEGATE_DRIVER"] == "docker"
    )
    assert job.returncode == 0, job.output
    attempt = (
        tmp_path
        / "tls"
        / "project"
        / _dotenv(tmp_path / "tls" / "project" / "imagegate.env")["IMAGEGATE_ATTEMPT"]
    )
    _verifies(attempt, ci_key.pub)
    spec["variables"].update(DOCKER_TLS_VERIFY="", DOCKER_CERT_PATH="")
    (tmp_path / "plain" / "project").mkdir(parents=True)
    job = run_gitlab_job(GITLAB, spec, tmp_path / "plain" / "project", env)
    assert job.returncode != 0 and "verdict none" in job.output, job.output
    assert "Client sent an HTTP request to an HTTPS server" in job.output  # the engine's refusal
    # The Task's docker-host on TCP, its client certificates from the docker-tls workspace.
    evidence, secret = tmp_path / "tekton" / "evidence", tmp_path / "tekton" / "signing-key"
    evidence.mkdir(parents=True)
    secret.mkdir()
    shutil.copy(ci_key.key, secret / "imagegate.key")
    params = {
        "image": images["python"],
        "imagegate": str(IMAGEGATE),
        "driver": "docker",
        "docker-host": tls_engine.host,
    }
    workspaces = {"evidence": evidence, "signing-key": secret, "docker-tls": tls_engine.client}
    step = run_tekton_step(TEKTON, params, workspaces, tmp_path / "tekton" / "run", env)
    assert step.returncode == 0 and step.results["verdict"] == "PASS", step.output
    _verifies(evidence / step.results["attempt"], ci_key.pub)


# ---- the Tekton Task --------------------------------------------------------------------------


def _tekton(
    tmp_path: Path, key: KeyPair | None, workspaces: dict[str, Path | None] | None = None, **params: str
) -> tuple[Any, Path]:
    evidence = tmp_path / "evidence"
    evidence.mkdir(parents=True, exist_ok=True)
    bound: dict[str, Path | None] = {"evidence": evidence, "source": None, **(workspaces or {})}
    if key is not None:  # the signing-key workspace: a Secret's files, the key under its default name
        secret = bound["signing-key"] = tmp_path / "signing-key"
        secret.mkdir(exist_ok=True)
        shutil.copy(key.key, secret / "imagegate.key")
    step = run_tekton_step(
        TEKTON, {"driver": "docker", "docker-host": DOCKER_SOCK, **params}, bound, tmp_path / "tekton", _env()
    )  # fmt: skip
    return step, evidence


@pytest.mark.engine
def test_the_tekton_task_accepts_and_sets_its_results(
    images: dict[str, str], ci_key: KeyPair, tmp_path: Path
) -> None:
    step, evidence = _tekton(tmp_path, ci_key, image=images["python"], imagegate=str(IMAGEGATE))
    assert step.returncode == 0, step.output
    assert step.results["verdict"] == "PASS" and step.results["exit-code"] == "0", step.results
    assert step.results["signed"] == "true"
    assert (evidence / step.results["attempt"] / "statement.json").is_file()
    _verifies(evidence / step.results["attempt"], ci_key.pub)
    assert _junit(evidence / "imagegate-reports" / "junit.xml") == {"pip_check": "PASS", "find_spec": "PASS"}


@pytest.mark.engine
def test_the_tekton_task_fails_a_rejected_image_unless_fail_on_never(
    images: dict[str, str], tmp_path: Path
) -> None:
    for fail_on, returncode in (("rejected", 1), ("never", 0)):
        step, evidence = _tekton(
            tmp_path / fail_on, None, image=images["conflict"], imagegate=str(IMAGEGATE), sign="false",
            **{"fail-on": fail_on},
        )  # fmt: skip
        assert step.returncode == returncode, step.output
        # The results are written whatever the step's exit: a Pipeline reads them either way.
        assert step.results["verdict"] == "FAIL" and step.results["exit-code"] == "1", step.results
        assert step.results["signed"] == "false" and "verdict FAIL (UNSIGNED)" in step.output
        assert _junit(evidence / "imagegate-reports" / "junit.xml")["pip_check"] == "FAIL"


def test_the_tekton_task_names_what_is_missing(ci_key: KeyPair, tmp_path: Path) -> None:
    step, evidence = _tekton(tmp_path / "no-key", None, image="app:1", imagegate=str(IMAGEGATE))
    assert step.returncode == 3 and f"param sign is true but there is {NO_KEY}" in step.output, step.output
    assert step.results["exit-code"] == "3" and not (evidence / "imagegate-runs").exists()
    step, _ = _tekton(tmp_path / "no-source", ci_key, image="app:1")
    assert step.returncode == 3 and "no source workspace" in step.output, step.output
    assert step.results["exit-code"] == "3"
    # An engine over TCP without its TLS files: refused, never talked to.
    step, _ = _tekton(
        tmp_path / "tcp",
        ci_key,
        image="app:1",
        imagegate=str(IMAGEGATE),
        **{"docker-host": "tcp://127.0.0.1:2375"},
    )
    assert step.returncode == 3 and "no docker-tls workspace is bound" in step.output, step.output


@pytest.mark.engine
def test_the_tekton_task_logs_in_with_the_docker_config_workspace(
    auth_image: AuthImage, tmp_path: Path
) -> None:
    login = tmp_path / "docker-config"  # a Secret of type kubernetes.io/dockerconfigjson, mounted
    login.mkdir()
    (login / ".dockerconfigjson").write_text(auth_image.docker_config())
    params = {
        "image": auth_image.ref,
        "imagegate": str(IMAGEGATE),
        "sign": "false",
        "driver": "rootfs",
        "docker-host": "",
    }
    step, evidence = _tekton(tmp_path / "login", None, {"docker-config": login}, **params)
    assert step.returncode == 0 and step.results["verdict"] == "PASS", step.output
    assert not list(evidence.rglob("config.json")) and not list(evidence.rglob(".dockerconfigjson"))
    step, _ = _tekton(tmp_path / "none", None, **params)
    assert step.returncode != 0 and step.results["verdict"] == "", step.output


@pytest.mark.engine
def test_a_key_with_a_passphrase_signs_in_each_step(images: dict[str, str], tmp_path: Path) -> None:
    """The passphrase as each platform keeps it: the Action's signing-key-password input (a
    secret), GitLab's masked IMAGEGATE_KEY_PASSWORD variable, the `password` file of Tekton's
    signing-key Secret; a wrong one fails the step before the run."""
    password = "a passphrase; not $HOME"
    key = _keygen(tmp_path / "locked", password)
    run, workspace = _action(
        tmp_path / "action", image=images["python"], imagegate=str(IMAGEGATE),
        **{"signing-key": key.key.read_text(), "signing-key-password": password},
    )  # fmt: skip
    assert run.outcome == "success" and run.outputs["signed"] == "true", run.log
    _verifies(workspace / run.outputs["attempt"], key.pub)
    job, project = _gitlab(
        tmp_path / "gitlab", key, {"IMAGEGATE_KEY_PASSWORD": password}, IMAGEGATE_IMAGE=images["python"],
        IMAGEGATE_BIN=str(IMAGEGATE),
    )  # fmt: skip
    assert job.returncode == 0, job.output
    _verifies(project / _dotenv(project / "imagegate.env")["IMAGEGATE_ATTEMPT"], key.pub)
    (tmp_path / "tekton" / "signing-key").mkdir(parents=True)
    (tmp_path / "tekton" / "signing-key" / "password").write_text(password)
    step, evidence = _tekton(tmp_path / "tekton", key, image=images["python"], imagegate=str(IMAGEGATE))
    assert step.returncode == 0 and step.results["signed"] == "true", step.output
    _verifies(evidence / step.results["attempt"], key.pub)
    (tmp_path / "tekton" / "signing-key" / "password").write_text("not it")
    step, evidence = _tekton(tmp_path / "tekton", key, image=images["python"], imagegate=str(IMAGEGATE))
    assert step.returncode == 3 and step.results["verdict"] == "", step.output


# ---- pinned images, no engine without TLS, constraints ------------------------------------------

_PINNED_IMAGE = re.compile(r"@sha256:[0-9a-f]{64}$")
_PINNED_ACTION = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")


def _unpinned(gitlab: dict[str, Any], tekton: dict[str, Any], action: dict[str, Any]) -> list[str]:
    """Every image a step definition starts, and every remote action it uses, that a tag names
    rather than a digest (a commit, for an action)."""
    images = []
    for job in gitlab.values():
        if isinstance(job, dict):
            images += [job["image"]] if "image" in job else []
            images += [s["name"] if isinstance(s, dict) else s for s in job.get("services", [])]
    spec = tekton["spec"]
    images += [c["image"] for c in [*spec.get("steps", []), *spec.get("sidecars", [])]]
    actions = [s["uses"] for s in action["runs"]["steps"] if "uses" in s and not s["uses"].startswith("./")]
    return [i for i in images if not _PINNED_IMAGE.search(str(i))] + [
        a for a in actions if not _PINNED_ACTION.match(a)
    ]


def _documents() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    gitlab, tekton, action = (yaml.safe_load(p.read_text()) for p in (GITLAB, TEKTON, ACTION))
    return gitlab, tekton, action


def test_every_image_and_action_the_steps_run_is_pinned() -> None:
    gitlab, tekton, action = _documents()
    assert _unpinned(gitlab, tekton, action) == []
    # The check sees a tag: each kind of reference, floating again, is named.
    gitlab[".imagegate"]["image"] = "python:3.12-slim"
    gitlab[".imagegate-dind"]["services"][0]["name"] = "docker:27-dind"
    tekton["spec"]["steps"][0]["image"] = "docker.io/library/python:3.12-slim"
    action["runs"]["steps"][-1]["uses"] = "actions/upload-artifact@v4"
    assert _unpinned(gitlab, tekton, action) == [
        "python:3.12-slim", "docker:27-dind", "docker.io/library/python:3.12-slim", "actions/upload-artifact@v4",
    ]  # fmt: skip


def _exposed_engines(gitlab: dict[str, Any], tekton: dict[str, Any]) -> list[str]:
    """Each engine a step definition would run or reach with TLS off: Docker in Docker (a
    service, a sidecar, anything privileged) without DOCKER_TLS_CERTDIR, and any address on 2375,
    Docker's port for plain TCP."""
    out = []
    for name, job in gitlab.items():
        if not isinstance(job, dict):
            continue
        variables = {k: str(v) for k, v in (job.get("variables") or {}).items()}
        if job.get("services") and not variables.get("DOCKER_TLS_CERTDIR"):
            out.append(f"{name}: Docker in Docker with TLS off")
        out += [f"{name}: {k} {v}" for k, v in variables.items() if ":2375" in v]
    spec = tekton["spec"]
    for c in [*spec.get("steps", []), *spec.get("sidecars", [])]:
        env = {e["name"]: str(e.get("value", "")) for e in c.get("env", [])}
        if (c.get("securityContext") or {}).get("privileged") and not env.get("DOCKER_TLS_CERTDIR"):
            out.append(f"{c['name']}: privileged with TLS off")
        out += [f"{c['name']}: {k} {v}" for k, v in env.items() if ":2375" in v]
    out += [f"param {p['name']}: {p['default']}" for p in spec["params"] if ":2375" in str(p.get("default"))]
    return out


def test_no_engine_runs_privileged_with_tls_off_and_rootfs_is_the_default() -> None:
    gitlab, tekton, _ = _documents()
    assert _exposed_engines(gitlab, tekton) == []
    # With no engine given, none is started: the rootfs driver, and what its sandbox needs said.
    assert (
        gitlab[".imagegate"]["variables"]["IMAGEGATE_DRIVER"] == "rootfs"
        and "services" not in gitlab[".imagegate"]
    )
    assert (
        'security_opt = ["seccomp:unconfined", "apparmor:unconfined", "systempaths=unconfined"]'
        in GITLAB.read_text()
    )
    spec = tekton["spec"]
    assert next(p for p in spec["params"] if p["name"] == "driver")["default"] == "rootfs"
    assert "sidecars" not in spec
    assert spec["steps"][0]["securityContext"] == {
        "seccompProfile": {"type": "Unconfined"}, "appArmorProfile": {"type": "Unconfined"}, "procMount": "Unmasked",
    }  # fmt: skip
    annotations = tekton["metadata"]["annotations"]
    assert (
        annotations[f"container.apparmor.security.beta.kubernetes.io/step-{spec['steps'][0]['name']}"]
        == "unconfined"
    )
    # Where an engine is chosen, TLS: the dind service's certificates shared, port 2376, verified.
    dind = gitlab[".imagegate-dind"]["variables"]
    assert dind == {"IMAGEGATE_DRIVER": "docker", "DOCKER_HOST": "tcp://docker:2376", "DOCKER_TLS_CERTDIR": "/certs",
                    "DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": "/certs/client"}  # fmt: skip
    # The check sees the old shapes: dind with TLS off, and a privileged sidecar on 2375.
    gitlab[".imagegate-dind"]["variables"].update(DOCKER_TLS_CERTDIR="", DOCKER_HOST="tcp://docker:2375")
    spec["sidecars"] = [{"name": "docker", "image": "docker:27-dind", "securityContext": {"privileged": True},
                         "env": [{"name": "DOCKER_TLS_CERTDIR", "value": ""}]}]  # fmt: skip
    assert _exposed_engines(gitlab, tekton) == [
        ".imagegate-dind: Docker in Docker with TLS off",
        ".imagegate-dind: DOCKER_HOST tcp://docker:2375",
        "docker: privileged with TLS off",
    ]


def _dependencies(name: str) -> dict[str, str]:
    """Every distribution installing `name` installs (no extras), with the version installed
    here: the requirements of each, their markers read for this Python, transitively."""
    found: dict[str, str] = {}
    todo = [(name, frozenset[str]())]
    while todo:
        dist_name, extras = todo.pop()
        dist = importlib.metadata.distribution(dist_name)
        key = canonicalize_name(dist.metadata["Name"])
        if key in found and not extras:
            continue
        found[key] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in extras or {""}):
                continue
            todo.append((req.name, frozenset(req.extras)))
    del found[canonicalize_name(name)]
    return found


def test_the_constraints_pin_every_dependency_the_steps_install() -> None:
    lines = [x for x in CONSTRAINTS.read_text().splitlines() if x.strip() and not x.startswith("#")]
    pinned = dict(x.split("==", 1) for x in lines)
    assert all(re.fullmatch(r"[a-z0-9-]+==[\w.+!-]+", x) for x in lines), lines  # exact versions only
    needed = _dependencies("imagegate")
    missing = sorted(set(needed) - set(pinned))
    assert not missing, "add to ci/constraints.txt: " + " ".join(f"{n}=={needed[n]}" for n in missing)
    # Each step installs through it.
    assert '-c "$GITHUB_ACTION_PATH/ci/constraints.txt"' in ACTION.read_text()
    assert '-c "$constraints"' in GITLAB.read_text()
    assert '-c "$SOURCE_PATH/$CONSTRAINTS"' in TEKTON.read_text()


# ---- the GitLab job and the Tekton step in a Debian root standing in for their image ----------

# What the rootfs driver's sandbox needs of the job's container (the template's runner config,
# the Task's securityContext): docker run's form of it.
ROOTFS_OPTIONS = ("--security-opt", "seccomp=unconfined", "--security-opt", "systempaths=unconfined",
                  "--security-opt", "apparmor=unconfined")  # fmt: skip


@pytest.fixture(scope="module")
def debian_root(engine: str) -> str:
    """A STAND-IN for python:3.12-slim (which cannot be pulled here): Debian 12's root made with
    mmdebstrap, with python3 and what the rootfs driver needs, the one imagegate's own image is
    built on (scripts/build-image.py --base-only, kept in the engine by its package list)."""
    built = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build-image.py"), "--base-only"],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    return built.stdout.strip()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """imagegate's wheel, as a release ships it (what the steps install from)."""
    dist = tmp_path_factory.mktemp("dist")
    made = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    (found,) = dist.glob("imagegate-*.whl")
    return found


def _in_root(image: str, *mounts: Path) -> Container:
    """The job's container: the rootfs sandbox's options, the host's network (the registry on
    127.0.0.1, the package index), pip's cache kept between runs, and this machine's pip settings
    (PIP_*: its index, its certificate authority), as a runner on it would be configured."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "imagegate" / "pip-debian-root"
    cache.mkdir(parents=True, exist_ok=True)
    options = (*ROOTFS_OPTIONS, "--network", "host", "-v", f"{cache}:/root/.cache/pip")
    pip = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
    files = tuple(Path(v) for v in pip.values() if v.startswith("/") and Path(v).exists())
    return Container(image, options, (*mounts, *files), pip)


@pytest.mark.engine
def test_the_gitlab_job_in_a_debian_root_refuses_without_a_key_and_signs_with_one(
    debian_root: str, wheel: Path, auth_image: AuthImage, ci_key: KeyPair, tmp_path: Path
) -> None:
    """The job's script as GitLab's runner runs it in the job's image: the install from the wheel
    with the constraints, the job's registry credentials, the rootfs driver, no engine."""
    shutil.copy(CONSTRAINTS, tmp_path / "constraints.txt")
    container = _in_root(debian_root, tmp_path, wheel.parent, ci_key.key.parent)
    variables = {
        "IMAGEGATE_IMAGE": auth_image.ref, "IMAGEGATE_INSTALL": str(wheel),
        "IMAGEGATE_CONSTRAINTS": str(tmp_path / "constraints.txt"), "CI_REGISTRY": auth_image.ref.split("/")[0],
        "CI_REGISTRY_USER": auth_image.user, "CI_REGISTRY_PASSWORD": auth_image.password,
    }  # fmt: skip

    def job(name: str, **more: str) -> tuple[GitLabJob, Path]:
        project = tmp_path / name / "project"
        project.mkdir(parents=True)
        spec = {"extends": ".imagegate", "variables": {**variables, **more}}
        return run_gitlab_job(GITLAB, spec, project, {}, container), project

    refused, project = job("no-key")
    assert refused.returncode == 3 and f"IMAGEGATE_SIGN is true but there is {NO_KEY}" in refused.output, (
        refused.output
    )
    # Nothing ran: no evidence, no install (`imagegate --version` would name its version).
    assert not (project / "imagegate-runs").exists() and not re.search(r"^imagegate \d", refused.output, re.M)
    signed, project = job("signed", IMAGEGATE_SIGNING_KEY=str(ci_key.key))
    assert signed.returncode == 0, signed.output
    env = _dotenv(project / "imagegate.env")
    assert env["IMAGEGATE_VERDICT"] == "PASS" and env["IMAGEGATE_SIGNED"] == "true", env
    assert "(signed)" in signed.output and f"registry login for {variables['CI_REGISTRY']}" in signed.output
    _verifies(project / env["IMAGEGATE_ATTEMPT"], ci_key.pub)


@pytest.mark.engine
def test_the_tekton_step_in_a_debian_root_refuses_without_a_key_and_signs_with_one(
    debian_root: str, wheel: Path, auth_image: AuthImage, ci_key: KeyPair, tmp_path: Path
) -> None:
    """The step's script as Tekton runs it in the step's image, the Task's defaults (driver rootfs,
    no engine), imagegate installed from the source workspace with its constraints, the registry
    login from the docker-config workspace, the key from the signing-key workspace."""
    source, login, secret = tmp_path / "source", tmp_path / "docker-config", tmp_path / "signing-key"
    (source / "ci").mkdir(parents=True)
    shutil.copy(wheel, source)
    shutil.copy(CONSTRAINTS, source / "ci" / "constraints.txt")
    login.mkdir()
    (login / ".dockerconfigjson").write_text(auth_image.docker_config())
    secret.mkdir()
    shutil.copy(ci_key.key, secret / "imagegate.key")
    container = _in_root(debian_root, tmp_path)

    def step(name: str, **bound: Path) -> tuple[Any, Path]:
        evidence = tmp_path / name / "evidence"
        evidence.mkdir(parents=True)
        workspaces = {"evidence": evidence, "source": source, "docker-config": login, **bound}
        params = {"image": auth_image.ref, "install": wheel.name}
        return run_tekton_step(
            TEKTON, params, workspaces, tmp_path / name / "tekton", {}, container
        ), evidence

    refused, evidence = step("no-key")
    assert refused.returncode == 3 and f"param sign is true but there is {NO_KEY}" in refused.output, (
        refused.output
    )
    assert refused.results["exit-code"] == "3" and not (evidence / "imagegate-runs").exists()
    signed, evidence = step("signed", **{"signing-key": secret})
    assert signed.returncode == 0, signed.output
    assert signed.results["verdict"] == "PASS" and signed.results["signed"] == "true", signed.results
    _verifies(evidence / signed.results["attempt"], ci_key.pub)


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
