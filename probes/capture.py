"""Run a child process and keep a bounded amount of its output (head and tail), so a probe that
prints 100 MB costs a few hundred KiB of memory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

DEFAULT_CAP = 256 * 1024  # bytes kept at the head and again at the tail, per stream


class Bounded:
    """Keeps the first `cap` bytes and the last `cap` bytes; counts the rest."""

    def __init__(self, cap: int = DEFAULT_CAP) -> None:
        self.cap = cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.cap:
                del self.tail[: len(self.tail) - self.cap]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        head = self.head.decode("utf-8", "replace")
        if not self.tail:
            return head
        tail = self.tail.decode("utf-8", "replace")
        if self.truncated:
            skipped = self.total - len(self.head) - len(self.tail)
            return head + "\n[imagegate: %d bytes omitted]\n" % skipped + tail
        return head + tail


def _pump(stream, sink: Bounded) -> None:
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            break
        sink.feed(chunk)
    stream.close()


class Completed:
    def __init__(self, returncode, out: Bounded, err: Bounded, timed_out: bool, duration: float) -> None:
        self.returncode = returncode
        self.out = out
        self.err = err
        self.timed_out = timed_out
        self.duration = duration


def run(
    argv, timeout=None, env=None, cwd=None, cap: int = DEFAULT_CAP, new_group: bool = True, after_exit=None
) -> Completed:
    """Run argv; with `new_group` in its own process group, killed whole (its children too) on
    timeout. Probes pass new_group=False so that the controller's kill of a stage's group reaches
    their children. `after_exit` runs once the process has ended, before its output is drained.
    Raises OSError when argv[0] cannot be executed."""
    start = time.monotonic()
    proc = start_process(argv, env, cwd, new_group)
    out, err = Bounded(cap), Bounded(cap)
    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, err), daemon=True),
    ]
    for t in pumps:
        t.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc) if new_group else _kill(proc)
    except BaseException:
        kill_group(proc) if new_group else _kill(proc)
        raise
    if after_exit is not None:
        after_exit()
    for t in pumps:
        # A grandchild that kept the pipe open must not hang us: the group was killed above,
        # and a detached writer gets a short grace period only.
        t.join(timeout=5)
    return Completed(proc.returncode, out, err, timed_out, time.monotonic() - start)


def start_process(argv, env, cwd, new_group: bool, merge: bool = False) -> subprocess.Popen:
    """argv with no stdin and its output on pipes (stderr into stdout with `merge`); with
    `new_group` in a session of its own, so that its whole group can be killed."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge else subprocess.PIPE,
        env=env,
        cwd=cwd,
        start_new_session=new_group,
    )


def live_processes() -> list:
    """(pid, parent pid, process group) of every live process this one can see in /proc; a
    zombie is dead already (reaping it is enough) and is left out."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[0] != b"Z":
            found.append((int(name), int(fields[1]), int(fields[2])))
    return found


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _kill(proc: subprocess.Popen) -> None:
    try:
        proc.kill()
        proc.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        pass


def child_timeout(default: float = 300.0) -> float:
    """A probe's own child gets most of the stage's time, so that on a hang the probe still
    reports what the child printed before the controller kills the whole stage."""
    try:
        total = float(os.environ.get("IMAGEGATE_STAGE_TIMEOUT", default))
    except ValueError:
        total = default
    return max(1.0, total * 0.9 - 1.0)
