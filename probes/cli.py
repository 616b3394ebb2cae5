"""cli: a command's argument parsing works.

The command runs in a child interpreter. When argv[0] is a console script, the child calls its
entry point in-process, so that a platform override (Python code) runs first, before the CLI
builds its parser: vLLM >= 0.9 infers the device while building `vllm serve`'s parser and fails
with "Failed to infer device type" on a host without a GPU; selecting CpuPlatform first lets the
parser be checked there.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys

from . import capture, versions
from .platforms import OVERRIDES

BOOTSTRAP = r"""
import importlib, json, runpy, sys
spec = json.loads(sys.argv.pop(1))
if spec.get("override"):
    exec(compile(spec["override"], "<imagegate platform override>", "exec"), {"__name__": "__imagegate_override__"})
sys.argv = spec["argv"]
if spec["kind"] == "module":
    runpy.run_module(spec["target"], run_name="__main__", alter_sys=True)
    sys.exit(0)
mod, _, attr = spec["target"].partition(":")
obj = importlib.import_module(mod)
for part in attr.split("."):
    obj = getattr(obj, part)
sys.exit(obj())
"""

EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning))(?::\s*(.*))?$")


SCRIPT_IMPORT = re.compile(r"^from ([\w.]+) import ([\w]+)\s*$", re.M)
SCRIPT_CALL = re.compile(r"sys\.exit\(([\w.]+)\(\)\)")


def console_script(name: str):
    """`module:function` of a console script: from the wrapper on PATH when it is the usual
    generated one (what the user's shell runs, and cheap), else from the installed metadata."""
    exe = shutil.which(name)
    if exe:
        try:
            with open(exe, "rb") as f:
                head = f.read(4096).decode("utf-8", "replace")
        except OSError:
            head = ""
        imp, call = SCRIPT_IMPORT.search(head), SCRIPT_CALL.search(head)
        if head.startswith("#!") and imp and call and call.group(1).split(".")[0] == imp.group(2):
            return "%s:%s" % (imp.group(1), call.group(1))
    try:
        import importlib.metadata as md
    except ImportError:  # pragma: no cover
        return None
    eps = md.entry_points()
    group = eps.select(group="console_scripts") if hasattr(eps, "select") else eps.get("console_scripts", [])
    for ep in group:
        if ep.name == name:
            return ep.value
    return None


def dist_version(name: str):
    try:
        import importlib.metadata as md

        return md.version(name)
    except Exception:
        return None


def last_exception(*texts: str):
    """The last `SomeError: message` line of a traceback, for a one-line reason."""
    for text in texts:
        for line in reversed(text.splitlines()):
            m = EXC_LINE.match(line.strip())
            if m:
                return line.strip()
    return None


def pick_args(params: dict, data: dict):
    """-> (args, params with the case's target applied, problem)."""
    args = list(params.get("args", []))
    by = params.get("args_by_version")
    if not by:
        return args, params, None
    version = dist_version(by["distribution"])
    data["version_choice"] = {"distribution": by["distribution"], "version": version}
    if version is None:
        return (
            None,
            params,
            "{} is not installed, so no arguments can be picked for it".format(by["distribution"]),
        )
    for case in by["cases"]:
        if versions.matches(version, case["when"]):
            data["version_choice"].update(when=case["when"], args=case["args"], note=case.get("note"))
            if case.get("command") or case.get("module"):
                params = dict(
                    params, command=case.get("command"), module=case.get("module"), entry_point=None
                )
            return list(case["args"]), params, None
    data["version_choice"].update(when=None, args=args, note="no case matched; default args")
    return args, params, None


def build(params: dict, args, override):
    """-> (argv to execute, how) or raises LookupError with a reason."""
    if params.get("module"):
        spec = {"kind": "module", "target": params["module"], "argv": [params["module"], *args]}
    elif params.get("entry_point"):
        spec = {
            "kind": "entry_point",
            "target": params["entry_point"],
            "argv": [params["entry_point"], *args],
        }
    else:
        command = list(params["command"])
        target = console_script(command[0])
        if target is None:
            if override:
                raise LookupError(
                    f"{command[0]} is not a console script of any installed distribution; a platform override "
                    "needs one (or use module/entry_point)"
                )
            exe = shutil.which(command[0])
            if exe is None:
                raise LookupError(f"{command[0]}: not found on PATH nor as a console script")
            return [exe, *command[1:], *args], f"executable {exe}"
        spec = {"kind": "entry_point", "target": target, "argv": command + args}
    spec["override"] = override
    how = "{} {} in-process".format(spec["kind"].replace("_", " "), spec["target"])
    return [sys.executable, "-c", BOOTSTRAP, json.dumps(spec)], how


def execute(argv, params: dict):
    env = dict(os.environ)
    env.update(params.get("env", {}))
    return capture.run(argv, timeout=capture.child_timeout(), env=env, new_group=False)


def run(params: dict) -> dict:
    data = {}
    args, params, problem = pick_args(params, data)
    if problem:
        return {"status": "FAIL", "detail": problem, "data": data}
    override = OVERRIDES.get(params.get("platform") or "") or params.get("platform_code")
    try:
        argv, how = build(params, args, override)
    except LookupError as e:
        return {"status": "FAIL", "detail": str(e), "data": data}
    shown = (params.get("command") or [params.get("module") or params.get("entry_point")]) + args
    data.update(argv=shown, how=how, platform=params.get("platform") or ("custom" if override else None))
    if params.get("platform_checked_against"):
        data["platform_checked_against"] = params["platform_checked_against"]
    artifacts = {}
    if params.get("record_raw") and override:
        _record_raw(params, args, data, artifacts)
    done = execute(argv, params)
    out, err = done.out.text(), done.err.text()
    # The command's own output is the stage's output: the controller keeps it as evidence.
    sys.stdout.write(out)
    sys.stderr.write(err)
    data.update(
        returncode=done.returncode,
        timed_out=done.timed_out,
        command_stdout_bytes=done.out.total,
        command_stderr_bytes=done.err.total,
    )
    # Quoted as a shell would need it: a reason is split into problems at "; ", never inside a
    # quoted argument (`python3 -c 'import x; x.run()'`).
    cmd = " ".join(shlex.quote(str(a)) for a in shown)
    status, detail = _judge(done, out, err, cmd, params, data)
    return {"status": status, "detail": detail, "data": data, "artifacts": artifacts}


def _record_raw(params: dict, args: list, data: dict, artifacts: dict) -> None:
    """The same command without the platform override, kept as evidence of what it says alone
    (e.g. vLLM's "Failed to infer device type")."""
    raw_argv, _ = build(params, args, None)
    raw = execute(raw_argv, params)
    artifacts["raw.stdout.txt"] = raw.out.text()
    artifacts["raw.stderr.txt"] = raw.err.text()
    data["raw"] = {
        "returncode": raw.returncode,
        "timed_out": raw.timed_out,
        "reason": last_exception(raw.err.text(), raw.out.text()),
    }


def _judge(done, out: str, err: str, cmd: str, params: dict, data: dict) -> tuple:
    """The stage's status and detail from the command's exit, output and the expectations."""
    if done.timed_out:  # a hang is "could not decide", like a stage timeout
        return "ERROR", "%s: timed out after %gs (killed); its output is kept" % (
            cmd,
            capture.child_timeout(),
        )
    problems = []
    if done.returncode != params.get("expect_exit", 0):
        reason = last_exception(err, out)
        problems.append(
            "exit {} (expected {}){}".format(
                done.returncode, params.get("expect_exit", 0), ": " + reason if reason else ""
            )
        )
    for key, text in (("stdout_regex", out), ("stderr_regex", err)):
        rx = params.get(key)
        if rx and not re.search(rx, text, re.MULTILINE):
            problems.append("{} {!r} did not match".format(key.split("_")[0], rx))
    suffix = ""
    if data.get("platform"):
        suffix = " (platform {})".format(data["platform"])
    vc = data.get("version_choice")
    if vc:
        suffix += " [{} {}]".format(vc["distribution"], vc["version"])
    if problems:
        return "FAIL", "{}: {}{}".format(cmd, "; ".join(problems), suffix)
    return "PASS", f"{cmd}: exit {done.returncode}{suffix}"
