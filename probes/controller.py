"""The in-image controller: runs each stage of the plan as a subprocess with its own timeout
and reports one authenticated event per stage (start, stage..., end) to the runner; the protocol
is written down in docs/design.md, "Protocol".

Trust (the image is untrusted; see README "What an image can and cannot do to the verdict"):
- it is started isolated from the image's site hooks (`python -I -S`): it needs only the
  standard library, so an image's `.pth` files, `sitecustomize` or PYTHONPATH never run in it;
- it makes itself non-dumpable before any stage starts, so a stage (same user, no
  capabilities) cannot open `/proc/<controller>/fd/*`, read its memory or ptrace it;
- its event channel is a private descriptor; fd 1 and 2 of the controller both go to stderr,
  stage processes get their own pipes and never inherit the channel;
- every event line carries a sequence number and an HMAC-SHA256 under a per-run key that the
  runner hands over through a pipe (or, in a Pod, the container's environment) and that is
  removed from the environment before any stage starts;
- each stage runs from a fresh private folder (its own copy of the bundle, its stage spec, its
  result file), and every process a stage left behind is killed before the next one starts
  (the controller is PID 1 in a container, and a child subreaper elsewhere), so nothing of one
  stage is alive while another is prepared, run or read.
A stage's own probe imports the image's code, so it can lie about its own result; it cannot
write, alter or suppress another stage's event.

The bundle is read once, by the path the controller was started with (`os.path.abspath`, never
`realpath`: a Kubernetes ConfigMap update swaps the resolved, versioned folder away mid-run).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time

from . import capture

PROTOCOL = 2
MARK = b"imagegate-event"  # an event line: MARK PROTOCOL SEQ MAC JSON
KEY_FD_ENV = "IMAGEGATE_EVENT_KEY_FD"  # a pipe holding the hex key (docker and local drivers)
KEY_ENV = "IMAGEGATE_EVENT_KEY"  # the hex key itself (a Pod's environment)
STAGES_ENV = "IMAGEGATE_STAGES"  # comma-separated stage ids this controller runs (default: all)
STAGE_OUTPUT_CAP = 256 * 1024
RESULT_CAP = 16 * 1024 * 1024
# What a probe may say of itself; SKIPPED: it had nothing to check (find_spec given no modules).
STATUSES = ("PASS", "FAIL", "ERROR", "SKIPPED")

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


class Channel:
    """The private event channel: a descriptor nothing else in the image holds."""

    def __init__(self, fd: int, key) -> None:
        self.fd = fd
        self.key = key
        self.seq = 0

    def emit(self, event: dict) -> None:
        payload = json.dumps(event, sort_keys=True, separators=(",", ":")).encode("utf-8")
        head = b"%d " % self.seq
        mac = hmac.new(self.key, head + payload, hashlib.sha256).hexdigest().encode() if self.key else b"-"
        # A leading newline: an event always starts on a fresh line, whatever came before it.
        line = b"\n" + MARK + b" %d " % PROTOCOL + head + mac + b" " + payload + b"\n"
        self.seq += 1
        view = memoryview(line)
        while view:
            view = view[os.write(self.fd, view) :]


def take_channel(environ) -> Channel:
    """Move the event channel off fd 1 (stdout then goes to stderr, so nothing the controller or
    a library prints can reach it) and take the key out of the environment."""
    fd = os.dup(1)  # non-inheritable: no stage process gets it
    os.dup2(2, 1)
    key = None
    key_fd = environ.pop(KEY_FD_ENV, None)
    if key_fd is not None:
        with contextlib.suppress(ValueError, OSError):
            n = int(key_fd)
            key = bytes.fromhex(os.read(n, 256).decode("ascii").strip())
            os.close(n)
    hex_key = environ.pop(KEY_ENV, None)
    if key is None and hex_key:
        with contextlib.suppress(ValueError):
            key = bytes.fromhex(hex_key.strip())
    return Channel(fd, key)


def harden() -> dict:
    """Non-dumpable and a child subreaper, through prctl(2). Every fact goes to the runner, which
    refuses to trust a run where either is missing."""
    facts = {"non_dumpable": False, "subreaper": False, "error": None}
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        facts["non_dumpable"] = libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
        facts["subreaper"] = os.getpid() == 1 or libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        if not (facts["non_dumpable"] and facts["subreaper"]):
            facts["error"] = "prctl failed: %s" % os.strerror(ctypes.get_errno())
    except Exception as e:  # no ctypes in this image's python, or no prctl (not Linux)
        facts["error"] = "%s: %s" % (type(e).__name__, e)
    facts["isolated"] = bool(sys.flags.isolated and sys.flags.no_site)
    return facts


def bundle_path() -> str:
    return os.path.abspath(sys.argv[0])


def load_bundle(path: str):
    import io
    import zipfile

    with open(path, "rb") as f:
        data = f.read()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return data, json.loads(zf.read("plan.json").decode("utf-8"))


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
    channel = take_channel(os.environ)
    protection = harden()
    data, plan = load_bundle(bundle_path())
    # The runner may split the plan over several controllers (a container each): this one runs
    # only the stages it was given, in plan order.
    only = [x for x in os.environ.pop(STAGES_ENV, "").split(",") if x]
    if only:
        plan = dict(plan, stages=[s for s in plan["stages"] if s["id"] in only])
    return run_plan(plan, data, channel, protection)


def run_plan(plan, data: bytes, channel: Channel, protection: dict) -> int:
    work = tempfile.mkdtemp(prefix="imagegate-")
    env = dict(os.environ)  # the key is gone from it already
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
    channel.emit(
        {
            "event": "start",
            "python": sys.version.split()[0],
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
            # Not platform.platform(): it reads the interpreter binary to find the libc version.
            "platform": "%s-%s-%s" % (platform.system(), platform.release(), platform.machine()),
            "machine": platform.machine(),
            "bundle": bundle_path(),
            "plan_stages": [s["id"] for s in plan["stages"]],
            "gpu": gpu,
            "uid": os.getuid() if hasattr(os, "getuid") else None,
            "pid": os.getpid(),
            "protection": protection,
            "home_redirected_to": home_note,
            "pythonpath": os.environ.get("PYTHONPATH"),
            "virtual_env": os.environ.get("VIRTUAL_ENV"),
        }
    )
    capabilities = {"gpu": gpu["present"]}
    statuses = {}
    stopped_by = None
    node_checks = {s["id"] for s in plan["stages"] if s.get("probe") == "gpu_preflight"}
    for stage in plan["stages"]:
        # Said before the stage runs: a run cut during it names the stage and how long it ran.
        channel.emit({"event": "stage_start", "id": stage["id"]})
        event = run_stage(stage, statuses, capabilities, stopped_by, data, work, env, node_checks)
        statuses[stage["id"]] = event["status"]
        if event["status"] == "FAIL" and plan.get("stop_on_fail") and stopped_by is None:
            stopped_by = stage["id"]
        channel.emit(event)
    channel.emit({"event": "end", "stages": len(plan["stages"])})
    shutil.rmtree(work, ignore_errors=True)
    return 0


def run_stage(stage, statuses, capabilities, stopped_by, data, work, env, node_checks=()) -> dict:
    sid = stage["id"]
    base = {"event": "stage", "id": sid, "probe": stage["probe"], "duration_s": 0.0}
    why = skip_reason(stage, statuses, stopped_by, node_checks)
    if why:
        return dict(base, status="SKIPPED", detail=why)
    # A fresh, unpredictable folder per stage: nothing an earlier stage planted is used.
    folder = tempfile.mkdtemp(prefix="stage-", dir=work)
    cwd = os.path.join(folder, "cwd")  # empty: no stray folder can satisfy find_spec from here
    os.mkdir(cwd)
    bundle = os.path.join(folder, "imagegate.pyz")
    stage_path = os.path.join(folder, "stage.json")
    result_path = os.path.join(folder, "result.json")
    with open(bundle, "wb") as f:
        f.write(data)
    with open(stage_path, "w") as f:
        json.dump(stage, f)
    stage_env = dict(env)
    stage_env.update(stage.get("env", {}))
    stage_env["IMAGEGATE_STAGE_TIMEOUT"] = str(stage["timeout"])
    survivors = []
    kill_survivors()  # nothing of an earlier stage may be alive while this one runs
    started = time.monotonic()
    try:
        done = capture.run(
            [sys.executable, bundle, "stage", sid, stage_path, result_path],
            timeout=stage["timeout"],
            env=stage_env,
            cwd=cwd,
            cap=STAGE_OUTPUT_CAP,
            # Before the output is drained and the result read: nothing of the stage is alive
            # to change them, and a daemon holding its pipes cannot stall the run.
            after_exit=lambda: survivors.append(kill_survivors()),
        )
    except OSError as e:
        return dict(base, status="ERROR", detail="could not start the stage: %s" % e)
    event = dict(base, duration_s=round(time.monotonic() - started, 3))
    if sum(survivors):
        event["survivors_killed"] = sum(survivors)
    judge(event, done, result_path, stage["timeout"])
    shutil.rmtree(folder, ignore_errors=True)
    defer_unmet(event, stage, capabilities)
    return event


def skip_reason(stage, statuses, stopped_by, node_checks) -> str:
    """Why the stage is not run ("" when it runs): an earlier stop_on_fail, or a need not met."""
    if stopped_by is not None:
        return "stop_on_fail: %s failed" % stopped_by
    unmet_needs = [n for n in stage.get("needs", []) if statuses.get(n) != "PASS"]
    # The GPU node check DEFERRED means no GPU here, not a broken node: a GPU stage that needs it
    # runs for the record and is DEFERRED by its own `requires`, as without the node check.
    unmet_needs = [n for n in unmet_needs if not (n in node_checks and statuses.get(n) == "DEFERRED")]
    if unmet_needs:
        return "needs " + ", ".join("{} is {}".format(n, statuses.get(n, "not run")) for n in unmet_needs)
    return ""


def judge(event: dict, done, result_path: str, timeout: float) -> None:
    """The stage's outcome from how its process ended and the result file it left."""
    event["stdout"] = done.out.text()
    event["stderr"] = done.err.text()
    event["stdout_bytes"] = done.out.total
    event["stderr_bytes"] = done.err.total
    result, problem = read_result(result_path)
    if done.timed_out:
        event.update(status="ERROR", detail=f"timed out after {timeout:g}s (killed)")
    elif result is None:
        last = [ln for ln in event["stderr"].splitlines() if ln.strip()][-1:] or ["no output"]
        event.update(
            status="ERROR",
            detail="probe exited %s without a result (%s): %s" % (done.returncode, problem, last[0][:300]),
        )
    else:
        status = result.get("status")
        if status not in STATUSES:
            event.update(status="ERROR", detail="the probe answered status %r" % (status,))
        else:
            event.update(status=status, detail=str(result.get("detail", "")))
        data_ = result.get("data", {})
        arts = result.get("artifacts", {})
        event["data"] = data_ if isinstance(data_, dict) else {"data": data_}
        event["artifacts"] = arts if isinstance(arts, dict) else {}


def defer_unmet(event: dict, stage: dict, capabilities: dict) -> None:
    """A stage that requires what this host lacks ran for the record: its outcome is evidence,
    not a verdict, here."""
    unmet = [r for r in stage.get("requires", []) if not capabilities.get(r)]
    if unmet:
        event["ran_for_record"] = {"status": event["status"], "detail": event["detail"]}
        event["status"] = "DEFERRED"
        event["detail"] = "requires {}, not present here; ran for the record: {}".format(
            ", ".join(unmet),
            event["ran_for_record"]["detail"] or event["ran_for_record"]["status"],
        )


def read_result(path: str):
    """The stage's result file, opened so that a planted FIFO, link or giant file cannot hang or
    exhaust the controller. (None, why) when there is no usable result."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        return None, "no result file" if e.errno == 2 else "result file unreadable: %s" % e.strerror
    try:
        import stat

        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "the result is not a regular file"
        if st.st_size > RESULT_CAP:
            return None, "the result file is %d bytes (limit %d)" % (st.st_size, RESULT_CAP)
        with os.fdopen(fd, "rb") as f:
            fd = -1
            raw = f.read(RESULT_CAP + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    try:
        result = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None, "the result file is not JSON"
    if not isinstance(result, dict):
        return None, "the result is not a JSON object"
    return result, None


def descendants(me: int) -> list:
    """Live processes below `me` (orphans are re-parented to us: PID 1 or a child subreaper)."""
    children = {}
    for pid, parent, _ in capture.live_processes():
        children.setdefault(parent, []).append(pid)
    found, todo = [], [me]
    while todo:
        for pid in children.get(todo.pop(), []):
            found.append(pid)
            todo.append(pid)
    return found


def kill_survivors() -> int:
    """Kill every process a stage left behind (daemons, double forks), then reap them."""
    me = os.getpid()
    killed = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = descendants(me)
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        reap()
        if not alive:
            break
        killed.update(alive)
        time.sleep(0.01)
    return len(killed)


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
