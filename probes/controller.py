"""The in-image controller: runs each stage of the plan as a subprocess with its own timeout
and prints one JSON event per line (start, stage..., end) on stdout.

It finds its own bundle by the path it was started with (`os.path.abspath`, never `realpath`):
a Kubernetes ConfigMap update swaps the resolved, versioned folder away mid-run, while the
stable mount path keeps pointing at the current files.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import traceback

from . import capture

PROTOCOL = 1
MARK = "imagegate"  # every event carries {"imagegate": PROTOCOL}; other lines are not ours
STAGE_OUTPUT_CAP = 256 * 1024


def emit(event: dict) -> None:
    event = dict(event)
    event[MARK] = PROTOCOL
    sys.stdout.write(json.dumps(event, sort_keys=True) + "\n")
    sys.stdout.flush()


def bundle_path() -> str:
    return os.path.abspath(sys.argv[0])


def load_plan(path: str) -> dict:
    import zipfile

    with zipfile.ZipFile(path) as zf:
        return json.loads(zf.read("plan.json").decode("utf-8"))


def gpu_facts() -> dict:
    devices = []
    with contextlib.suppress(OSError):
        devices = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit())
    nvd = os.environ.get("NVIDIA_VISIBLE_DEVICES")
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    hidden = nvd in ("void", "none", "") or cvd == ""
    return {
        "devices": devices,
        "NVIDIA_VISIBLE_DEVICES": nvd,
        "CUDA_VISIBLE_DEVICES": cvd,
        "present": bool(devices) and not hidden,
    }


def writable(path: str) -> bool:
    return bool(path) and os.path.isdir(path) and os.access(path, os.W_OK)


def main(argv=None) -> int:
    # Stage processes (`BUNDLE stage ...`) never get here: __main__ sends them to stage.main.
    return run_plan(list(sys.argv[1:] if argv is None else argv))


def run_plan(argv) -> int:
    bundle = bundle_path()
    if argv:  # a plan file given explicitly (debugging a bundle by hand)
        with open(argv[0]) as f:
            plan = json.load(f)
    else:
        plan = load_plan(bundle)
    work = tempfile.mkdtemp(prefix="imagegate-")
    cwd = os.path.join(work, "cwd")  # empty: no stray folder can satisfy find_spec from here
    os.mkdir(cwd)
    env = dict(os.environ)
    home_note = None
    if not writable(env.get("HOME", "")):
        # Read-only root filesystem: give tools that write caches under ~ somewhere to write.
        env["HOME"] = os.path.join(work, "home")
        os.mkdir(env["HOME"])
        home_note = env["HOME"]
    env.setdefault("XDG_CACHE_HOME", os.path.join(work, "cache"))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    gpu = gpu_facts()
    emit(
        {
            "event": "start",
            "python": sys.version.split()[0],
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
            # Not platform.platform(): it reads the interpreter binary to find the libc version.
            "platform": "%s-%s-%s" % (platform.system(), platform.release(), platform.machine()),
            "machine": platform.machine(),
            "bundle": bundle,
            "plan_stages": [s["id"] for s in plan["stages"]],
            "gpu": gpu,
            "uid": os.getuid() if hasattr(os, "getuid") else None,
            "home_redirected_to": home_note,
            "pythonpath": os.environ.get("PYTHONPATH"),
            "virtual_env": os.environ.get("VIRTUAL_ENV"),
        }
    )
    capabilities = {"gpu": gpu["present"]}
    statuses = {}
    stopped_by = None
    for stage in plan["stages"]:
        event = run_stage(stage, plan, statuses, capabilities, stopped_by, bundle, work, cwd, env)
        statuses[stage["id"]] = event["status"]
        if event["status"] == "FAIL" and plan.get("stop_on_fail") and stopped_by is None:
            stopped_by = stage["id"]
        emit(event)
    emit({"event": "end", "stages": len(plan["stages"])})
    shutil.rmtree(work, ignore_errors=True)
    return 0


def run_stage(stage, plan, statuses, capabilities, stopped_by, bundle, work, cwd, env) -> dict:
    sid = stage["id"]
    base = {"event": "stage", "id": sid, "probe": stage["probe"], "duration_s": 0.0}
    if stopped_by is not None:
        return dict(base, status="SKIPPED", detail=f"stop_on_fail: {stopped_by} failed")
    unmet_needs = [n for n in stage.get("needs", []) if statuses.get(n) != "PASS"]
    if unmet_needs:
        why = ", ".join("{} is {}".format(n, statuses.get(n, "not run")) for n in unmet_needs)
        return dict(base, status="SKIPPED", detail="needs " + why)
    result_path = os.path.join(work, f"result-{sid}.json")
    stage_path = os.path.join(work, f"stage-{sid}.json")
    with open(stage_path, "w") as f:
        json.dump(stage, f)
    stage_env = dict(env)
    stage_env.update(stage.get("env", {}))
    stage_env["IMAGEGATE_STAGE_TIMEOUT"] = str(stage["timeout"])
    try:
        done = capture.run(
            [sys.executable, bundle, "stage", sid, stage_path, result_path],
            timeout=stage["timeout"],
            env=stage_env,
            cwd=cwd,
            cap=STAGE_OUTPUT_CAP,
        )
    except OSError as e:
        return dict(base, status="ERROR", detail=f"could not start the stage: {e}")
    event = dict(base, duration_s=round(done.duration, 3))
    event["stdout"] = done.out.text()
    event["stderr"] = done.err.text()
    event["stdout_bytes"] = done.out.total
    event["stderr_bytes"] = done.err.total
    result = None
    if os.path.exists(result_path):
        try:
            with open(result_path) as f:
                result = json.load(f)
        except ValueError:
            result = None
    if done.timed_out:
        event.update(status="ERROR", detail="timed out after {:g}s (killed)".format(stage["timeout"]))
    elif result is None:
        last = [ln for ln in event["stderr"].splitlines() if ln.strip()][-1:] or ["no output"]
        event.update(
            status="ERROR", detail=f"probe exited {done.returncode} without a result: {last[0][:300]}"
        )
    else:
        event.update(status=result["status"], detail=result.get("detail", ""))
        event["data"] = result.get("data", {})
        event["artifacts"] = result.get("artifacts", {})
    unmet = [r for r in stage.get("requires", []) if not capabilities.get(r)]
    if unmet:
        # Ran for the record: its outcome is evidence, not a verdict, on a host without them.
        event["ran_for_record"] = {"status": event["status"], "detail": event["detail"]}
        event["status"] = "DEFERRED"
        event["detail"] = "requires {}, not present here; ran for the record: {}".format(
            ", ".join(unmet),
            event["ran_for_record"]["detail"] or event["ran_for_record"]["status"],
        )
    return event


def crash_detail() -> str:
    return traceback.format_exc(limit=8)
