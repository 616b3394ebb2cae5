"""A command in a process group of its own, under a deadline: what the local driver (the
controller itself) and the rootfs driver (bubblewrap around it) share. Output is streamed as it
arrives and capped; at the deadline, on cancel and on any way out of here (an interrupt too) the
whole group is killed and waited for, so nothing the command started outlives the run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from imagegate.drivers.interface import STDERR_CAP, STDOUT_CAP, CappedBuffer, OnOutput
from imagegate.errors import EngineError

POLL_S = 0.2  # how soon a cancel is seen while the command runs


@dataclass
class Completed:
    stdout: bytes
    stderr: bytes
    exit_code: int | None  # None: killed (deadline, cancel)
    timed_out: bool
    stdout_total: int
    stderr_total: int
    wall_s: float


def run_group(
    argv: Sequence[str],
    *,
    deadline_s: float,
    env: Mapping[str, str],
    stdin: bytes | None = None,
    pass_fds: tuple[int, ...] = (),
    on_stdout: OnOutput | None = None,
    cancel: threading.Event | None = None,
) -> Completed:
    """Run `argv` as the leader of a new session; `stdin` is written to it (None: /dev/null),
    stdout is streamed to `on_stdout`. The group is killed at `deadline_s` seconds, when `cancel`
    is set, and after the leader exits (whatever it left behind in its group goes too)."""
    out, err = CappedBuffer(STDOUT_CAP, on_stdout), CappedBuffer(STDERR_CAP)
    start = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        start_new_session=True,
        pass_fds=pass_fds,
    )
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout.fileno(), out), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr.fileno(), err), daemon=True),
    ]
    try:
        if proc.stdin is not None:
            feeder = threading.Thread(target=_feed, args=(os.dup(proc.stdin.fileno()), stdin), daemon=True)
            proc.stdin.close()
            feeder.start()
        for t in pumps:
            t.start()
        exited = wait_until(proc, start + deadline_s, cancel)
    finally:
        kill_group(proc)
        for t in pumps:
            if t.ident is not None:  # started
                t.join(timeout=5)
        for s in (proc.stdout, proc.stderr):
            with contextlib.suppress(OSError):
                s.close()
    return Completed(
        out.value(),
        err.value(),
        proc.returncode if exited else None,
        not exited,
        out.total,
        err.total,
        round(time.monotonic() - start, 3),
    )


def wait_until(proc: subprocess.Popen[bytes], end: float, cancel: threading.Event | None) -> bool:
    """True when the process exited before `end` (time.monotonic) and before `cancel` was set."""
    while proc.poll() is None:
        if time.monotonic() >= end or (cancel is not None and cancel.is_set()):
            return False
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=min(POLL_S, max(0.01, end - time.monotonic())))
    return True


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the process's group (it leads it: a new session), then wait for the leader."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired as e:  # a process in uninterruptible sleep; say which
        raise EngineError(
            f"process {proc.pid} did not exit after SIGKILL",
            hint=f"check it: ps -o pid,stat,cmd -g {proc.pid}",
        ) from e


def _pump(fd: int, sink: CappedBuffer) -> None:
    with contextlib.suppress(OSError):
        while chunk := os.read(fd, 1 << 16):
            sink.feed(chunk)


def _feed(fd: int, data: bytes) -> None:
    # A command that exits without reading its stdin is not an error of the writer.
    with contextlib.suppress(OSError):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    with contextlib.suppress(OSError):
        os.close(fd)
