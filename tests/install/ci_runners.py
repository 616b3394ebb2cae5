"""Stand-ins for three CI runners, none of which can start here (GitHub's runner and GitLab's need
their services, Tekton a Kubernetes cluster): each executes a step definition's shell the way its
runner does, on this machine, against the real engine.

- `run_action`: a composite GitHub Action. Inputs get their defaults, `${{ … }}` expressions are
  substituted (`github_expression`: the subset the Action uses: contexts, string literals, `==`,
  `!=`, `!`, `&&`, `||`, the status functions), each `run:` step runs as `shell: bash` does
  (`bash --noprofile --norc -eo pipefail FILE`) with GITHUB_OUTPUT (a file per step, read back as
  `steps.<id>.outputs`), GITHUB_STEP_SUMMARY, GITHUB_ACTION_PATH, GITHUB_WORKSPACE and RUNNER_TEMP
  set, and a step's `if:` decides whether it runs (default `success()`). A `uses:` step is not
  executed: its `with:` is returned, substituted, for the test to check.
- `run_gitlab_job`: a job extending a hidden job of an included template. Its `variables` (the
  template's, then the job's, `$VAR` in them expanded as GitLab does) and GitLab's predefined
  variables are the environment, and the `script:` items run in one bash, after `set -eo pipefail`,
  in CI_PROJECT_DIR, as the runner's bash shell runs them.
- `run_tekton_step`: a Task's step. `$(params.x)` (defaults applied), `$(results.x.path)`,
  `$(workspaces.x.path)` and `$(workspaces.x.bound)` are substituted in its env, workingDir and
  script, as Tekton does before the Pod starts; a reference to anything the Task does not declare
  is refused, as Tekton's admission webhook refuses it; the script runs by its shebang.
- `Container`: a STAND-IN for the image GitLab's job or Tekton's step starts in (python:…-slim,
  which cannot be pulled here): the job's script runs in `docker run` of a Debian root made with
  mmdebstrap, with the options the runner's config gives the job's container.

The GitHub Action also runs through the real runner: `run_act`, nektos/act on this machine's
shell, with the remote actions it uses taken from local folders (github.com cannot be reached)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import DOCKER_SOCK

# ---- GitHub Actions -------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<op>==|!=|&&|\|\||!|\(|\))|(?P<name>[A-Za-z_][\w.-]*(?:\(\))?))"
)


def _tokens(expr: str) -> list[str]:
    out, pos = [], 0
    while pos < len(expr.rstrip()):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"expression {expr!r}: cannot read {expr[pos:]!r}")
        out.append(m.group(m.lastgroup or ""))
        pos = m.end()
    return out


def github_expression(expr: str, context: Mapping[str, Any], status: str = "success") -> Any:
    """The value of one `${{ … }}` expression: recursive descent over `||`, `&&`, `!`, `==`/`!=`
    (string comparison ignores case, as GitHub's does), parentheses, `'…'` literals, dotted
    context paths (a missing property is '') and always(), success(), failure(), cancelled()."""
    toks = _tokens(expr)
    functions: dict[str, Callable[[], bool]] = {
        "always()": lambda: True,
        "success()": lambda: status == "success",
        "failure()": lambda: status == "failure",
        "cancelled()": lambda: status == "cancelled",
    }

    def atom() -> Any:
        t = toks.pop(0)
        if t == "(":
            v = either()
            assert toks.pop(0) == ")", expr
            return v
        if t.startswith("'"):
            return t[1:-1].replace("''", "'")
        if t in functions:
            return functions[t]()
        if t in ("true", "false"):
            return t == "true"
        value: Any = context
        for part in t.split("."):
            value = value.get(part, "") if isinstance(value, Mapping) else ""
        return value

    def compare() -> Any:
        left = atom()
        if toks and toks[0] in ("==", "!="):
            op = toks.pop(0)
            right = atom()
            same = str(left).lower() == str(right).lower()
            return same if op == "==" else not same
        return left

    def negation() -> Any:
        if toks and toks[0] == "!":
            toks.pop(0)
            return not negation()
        return compare()

    def chain(op: str, operand: Callable[[], Any]) -> Callable[[], Any]:
        """`operand (op operand)*`, left to right; both sides are read (GitHub evaluates them
        lazily, but nothing here has a side effect)."""

        def parse() -> Any:
            v = operand()
            while toks and toks[0] == op:
                toks.pop(0)
                right = operand()
                v = (v and right) if op == "&&" else (v or right)
            return v

        return parse

    both = chain("&&", negation)
    either = chain("||", both)

    value = either()
    assert not toks, f"expression {expr!r}: {toks} left over"
    return value


_EXPR = re.compile(r"\$\{\{(.*?)\}\}", re.S)


def _text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def substitute(text: str, context: Mapping[str, Any]) -> str:
    """Every `${{ … }}` in `text` replaced by its value as a string, as GitHub does before a step runs."""
    return _EXPR.sub(lambda m: _text(github_expression(m.group(1), context)), text)


def _condition(text: str | bool | None, context: Mapping[str, Any], status: str) -> bool:
    """A step's `if:` (with or without `${{ }}`); with no status function in it, success() is
    implied, as GitHub implies it."""
    if text is None:
        return status == "success"
    expr = str(text).strip()
    m = re.fullmatch(r"\$\{\{(.*)\}\}", expr, re.S)
    expr = m.group(1) if m else expr
    value = bool(github_expression(expr, context, status))
    if not re.search(r"\b(always|success|failure|cancelled)\(\)", expr):
        value = value and status == "success"
    return value


def read_outputs(path: Path) -> dict[str, str]:
    """A GITHUB_OUTPUT file: `name=value` lines and `name<<DELIMITER` … `DELIMITER` blocks."""
    out: dict[str, str] = {}
    lines = path.read_text().splitlines()
    while lines:
        line = lines.pop(0)
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            end = lines.index(delimiter)
            out[name] = "\n".join(lines[:end])
            del lines[: end + 1]
        elif line:
            name, value = line.split("=", 1)
            out[name] = value
    return out


@dataclass
class ActionRun:
    outcome: str  # success or failure: the Action's, as the job sees it
    outputs: dict[str, str]  # the Action's outputs
    steps: dict[str, dict[str, Any]]  # id -> {outcome, outputs, returncode, stdout, stderr}
    uses: list[dict[str, Any]]  # the `uses:` steps that would run: {uses, with}
    summary: str
    log: str = field(repr=False)


def run_action(action: Path, inputs: Mapping[str, str], workspace: Path, env: Mapping[str, str]) -> ActionRun:
    """Execute the composite Action at `action` (action.yml) in `workspace`, as a runner would."""
    spec = yaml.safe_load(action.read_text())
    assert spec["runs"]["using"] == "composite", spec["runs"]
    given = dict(inputs)
    for name, decl in spec.get("inputs", {}).items():
        if name not in given:
            assert not decl.get("required") or "default" in decl, f"input {name} is required"
            given[name] = str(decl.get("default", ""))
    runner_temp = workspace.parent / f"{workspace.name}-runner-temp"
    runner_temp.mkdir(exist_ok=True)
    summary = runner_temp / "step_summary.md"
    summary.touch()
    context: dict[str, Any] = {"inputs": given, "steps": {}, "env": dict(env)}
    status, uses, log = "success", [], []
    for i, step in enumerate(spec["runs"]["steps"]):
        sid = step.get("id", f"__step{i}")
        if not _condition(step.get("if"), context, status):
            context["steps"][sid] = {"outcome": "skipped", "outputs": {}}
            continue
        if "uses" in step:
            with_ = {k: substitute(str(v), context) for k, v in step.get("with", {}).items()}
            uses.append({"uses": step["uses"], "with": with_})
            context["steps"][sid] = {"outcome": "success", "outputs": {}}
            continue
        assert step.get("shell") == "bash", f"step {sid}: a composite run step names its shell"
        script = runner_temp / f"{sid}.sh"
        script.write_text(substitute(step["run"], context))
        output = runner_temp / f"{sid}.output"
        output.write_text("")
        step_env = {k: substitute(str(v), context) for k, v in step.get("env", {}).items()}
        p = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            cwd=workspace, capture_output=True, text=True, timeout=1200,
            env={
                **env, "GITHUB_ACTIONS": "true", "CI": "true", "GITHUB_OUTPUT": str(output),
                "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_ACTION_PATH": str(action.parent),
                "GITHUB_WORKSPACE": str(workspace), "RUNNER_TEMP": str(runner_temp), **step_env,
            },
        )  # fmt: skip
        log.append(f"== {sid}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
        outcome = "success" if p.returncode == 0 else "failure"
        context["steps"][sid] = {
            "outcome": outcome, "outputs": read_outputs(output), "returncode": p.returncode,
            "stdout": p.stdout, "stderr": p.stderr,
        }  # fmt: skip
        if outcome == "failure":
            status = "failure"
    outputs = {
        name: substitute(str(decl["value"]), context) for name, decl in spec.get("outputs", {}).items()
    }
    return ActionRun(status, outputs, context["steps"], uses, summary.read_text(), "\n".join(log))


# ---- act: GitHub Actions' runner on this machine -------------------------------------------------


@dataclass
class ActRun:
    returncode: int
    log: str
    home: Path  # act's HOME: its caches and each job's workspace are under it


def run_act(
    act: str,
    workflow: str,
    work: Path,
    local: Mapping[str, Path],
    secrets: Mapping[str, str],
    env: Mapping[str, str] | None = None,
) -> ActRun:
    """Run `workflow` (a workflow's YAML, on push) with nektos/act in `work`, every job on this
    machine's own shell (`-P ubuntu-latest=-self-hosted`: no runner image to pull); each action
    `local` names (OWNER/NAME@REF) comes from its folder in place of github.com, and nothing is
    fetched (--action-offline-mode). `env`: variables every job sees (act's --env), as a runner
    sets its own (the ID-token request's)."""
    repo, home = work / "repo", work / "home"
    (repo / ".github" / "workflows").mkdir(parents=True)
    home.mkdir()
    (repo / ".github" / "workflows" / "test.yml").write_text(workflow)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)  # act reads the event's repository
    argv = [act, "push", "-C", str(repo), "-P", "ubuntu-latest=-self-hosted", "--action-offline-mode"]
    argv += [a for name, folder in local.items() for a in ("--local-repository", f"{name}={folder}")]
    argv += [a for name, value in secrets.items() for a in ("-s", f"{name}={value}")]
    argv += [a for name, value in (env or {}).items() for a in ("--env", f"{name}={value}")]
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "DOCKER_HOST": DOCKER_SOCK}
    p = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    return ActRun(p.returncode, p.stdout + p.stderr, home)


# ---- a job's image -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Container:
    """A STAND-IN for the image a job or step would start in, which cannot be pulled here:
    `docker run` of a local `image` (a Debian root made with mmdebstrap), with `options` (what
    the runner's config gives the job's container) and each of `mounts` at its own path, so the
    paths in the job's variables hold inside as outside. Only the job's variables reach it."""

    image: str
    options: tuple[str, ...] = ()
    mounts: tuple[Path, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)  # the runner's own, beside the job's

    def run(
        self, argv: list[str], env: Mapping[str, str], cwd: Path | str
    ) -> subprocess.CompletedProcess[str]:
        docker = ["docker", "run", "--rm", "-w", str(cwd), *self.options]
        docker += [a for m in self.mounts for a in ("-v", f"{m}:{m}")]
        docker += [a for k, v in {**self.env, **env}.items() for a in ("-e", f"{k}={v}")]
        return subprocess.run(
            [*docker, self.image, *argv], capture_output=True, text=True, timeout=1200,
            env={**os.environ, "DOCKER_HOST": DOCKER_SOCK},
        )  # fmt: skip


# ---- GitLab CI ---------------------------------------------------------------------------------

_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def _expand(value: str, known: Mapping[str, str]) -> str:
    return _VAR.sub(lambda m: known.get(m.group(1) or m.group(2), ""), value)


@dataclass
class GitLabJob:
    returncode: int
    output: str
    job: dict[str, Any]  # the job as GitLab resolves it (extends merged)


def resolve_job(template: Path, job: Mapping[str, Any]) -> dict[str, Any]:
    """The job after `extends:` (a hidden job of the template, which may extend another): keys
    merged, mappings deeply, the nearest job winning, as GitLab merges them."""
    jobs = yaml.safe_load(template.read_text())

    def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for k, v in over.items():
            out[k] = merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
        return out

    def resolved(one: Mapping[str, Any]) -> dict[str, Any]:
        own = {k: v for k, v in one.items() if k != "extends"}
        return merge(resolved(jobs[one["extends"]]), own) if "extends" in one else own

    return resolved(job)


def run_gitlab_job(
    template: Path,
    job: Mapping[str, Any],
    project_dir: Path,
    env: Mapping[str, str],
    container: Container | None = None,
) -> GitLabJob:
    resolved = resolve_job(template, job)
    predefined = {
        "CI": "true", "GITLAB_CI": "true", "CI_PROJECT_DIR": str(project_dir), "CI_BUILDS_DIR": str(project_dir.parent),
        "CI_JOB_NAME": "gate-image", "CI_JOB_ID": "1", "CI_PIPELINE_ID": "1", "CI_COMMIT_SHA": "0" * 40,
        "CI_COMMIT_SHORT_SHA": "00000000", "CI_PROJECT_NAME": project_dir.name, "CI_SERVER": "yes",
    }  # fmt: skip
    variables: dict[str, str] = {**env, **predefined}
    for k, v in (resolved.get("variables") or {}).items():
        variables[k] = _expand(str(v["value"] if isinstance(v, Mapping) else v), variables)
    script = "set -eo pipefail\nset +o noclobber\n" + "\n".join(resolved["script"]) + "\n"
    argv = ["bash", "--noprofile", "--norc", "-c", script]
    if container is not None:
        p = container.run(argv, variables, project_dir)
    else:
        p = subprocess.run(argv, cwd=project_dir, env=variables, capture_output=True, text=True, timeout=1200)
    return GitLabJob(p.returncode, p.stdout + p.stderr, resolved)


# ---- Tekton ------------------------------------------------------------------------------------

_REF = re.compile(r"\$\((params|results|workspaces)\.([\w-]+)(?:\.(path|bound))?\)")


@dataclass
class TektonStep:
    returncode: int
    output: str
    results: dict[str, str]


def task_references(task: Mapping[str, Any]) -> list[str]:
    """The `$(…)` references in the Task's steps that name nothing it declares (Tekton refuses them)."""
    spec = task["spec"]
    declared = {
        "params": {p["name"] for p in spec.get("params", [])},
        "results": {r["name"] for r in spec.get("results", [])},
        "workspaces": {w["name"] for w in spec.get("workspaces", [])},
    }
    text = yaml.safe_dump(spec.get("steps", []))
    return [m.group(0) for m in _REF.finditer(text) if m.group(2) not in declared[m.group(1)]]


def run_tekton_step(
    task_file: Path,
    params: Mapping[str, str],
    workspaces: Mapping[str, Path | None],
    root: Path,
    env: Mapping[str, str],
    container: Container | None = None,
) -> TektonStep:
    """Run the Task's only step here: `workspaces` maps each declared workspace to a folder (None:
    an optional one left unbound), results go to root/results/<name>."""
    task = yaml.safe_load(task_file.read_text())
    spec = task["spec"]
    assert not task_references(task), task_references(task)
    values: dict[str, str] = {}
    for p in spec.get("params", []):
        if p["name"] in params:
            values[p["name"]] = params[p["name"]]
        else:
            assert "default" in p, f"param {p['name']} is required"
            values[p["name"]] = str(p["default"])
    results = root / "results"
    results.mkdir(parents=True, exist_ok=True)
    for w in spec.get("workspaces", []):
        assert workspaces.get(w["name"]) is not None or w.get("optional"), (
            f"workspace {w['name']} is required"
        )

    def sub(text: str) -> str:
        def one(m: re.Match[str]) -> str:
            kind, name, attr = m.groups()
            if kind == "params":
                return values[name]
            if kind == "results":
                return str(results / name)
            bound = workspaces.get(name)
            return ("true" if bound else "false") if attr == "bound" else str(bound or "")

        return _REF.sub(one, text)

    (step,) = spec["steps"]
    script = root / "script"
    script.write_text(sub(step["script"]))
    script.chmod(0o755)
    assert step["script"].startswith("#!"), "the script names its interpreter, as Tekton runs it"
    step_env = {e["name"]: sub(str(e.get("value", ""))) for e in step.get("env", [])}
    cwd = sub(step.get("workingDir", str(root)))
    if container is not None:
        p = container.run([str(script)], {**env, **step_env}, cwd)
    else:
        p = subprocess.run(
            [str(script)], cwd=cwd, env={**env, **step_env}, capture_output=True, text=True, timeout=1200
        )
    got = {f.name: f.read_text() for f in results.iterdir()}
    return TektonStep(p.returncode, p.stdout + p.stderr, got)
