"""The server under test as a process: started in its own session (one process group), its
whole output kept bounded (head and tail), every line time-stamped against the phase patterns as
it arrives, and the group killed at the end or at the deadline, with a check that nothing of it
is left."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import threading
import time

from . import capture

LOG_CAP = 2 * 1024 * 1024  # bytes kept at the head and again at the tail of the server's log
RECENT_LINES = 400
# The server's own words for a failure, most telling first: an exception's name, then any line
# that says error or failed, then an access-log line with a 5xx.
ERROR_LINES = (
    re.compile(r"\w(Error|Exception)\b|Traceback"),
    re.compile(r"(?i)\berror\b|\bfailed\b"),
    re.compile(r"\b5\d\d\b"),
)


class Server:
    def __init__(self, argv, env, cwd, phases) -> None:
        self.argv = argv
        self.phases = [(name, re.compile(rx)) for name, rx in phases]
        self.seen = {}  # phase name -> seconds after start, first match
        self.log = capture.Bounded(LOG_CAP)
        self.recent = collections.deque(maxlen=RECENT_LINES)  # (seconds, line)
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.proc = capture.start_process(argv, env, cwd, new_group=True, merge=True)
        self.pump = threading.Thread(target=self._read, daemon=True)
        self.pump.start()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def _read(self) -> None:
        partial = b""
        stream = self.proc.stdout
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not chunk:
                break
            with self.lock:
                self.log.feed(chunk)
            lines = (partial + chunk).split(b"\n")
            partial = lines.pop()[-65536:]  # a line without end stays bounded
            # progress bars redraw with \r: each redraw is a line of its own
            for raw in (p for line in lines for p in line.split(b"\r")):
                self._line(raw.decode("utf-8", "replace"))
        if partial:
            self._line(partial.decode("utf-8", "replace"))

    def _line(self, line: str) -> None:
        now = round(self.elapsed(), 3)
        with self.lock:
            self.recent.append((now, line[:2000]))
            for name, rx in self.phases:
                if name not in self.seen and rx.search(line):
                    self.seen[name] = now

    def alive(self) -> bool:
        return self.proc.poll() is None

    def lines_since(self, t: float) -> list:
        with self.lock:
            return [line for at, line in self.recent if at >= t]

    def error_line(self, since: float, settle: float = 0.0):
        """The server's own error line logged since `since` (seconds after start), the most
        telling kind, the last of it; waits up to `settle` seconds for the log to catch up.
        A weaker kind found first is kept only when no stronger one comes within `settle`: a
        server may log its access line ("... 500") before the exception that caused it."""
        give_up = time.monotonic() + settle
        while True:
            lines = [ln.strip() for ln in self.lines_since(since) if ln.strip()]
            kinds = [[ln for ln in lines if rx.search(ln)] for rx in ERROR_LINES]
            best = next((hits[-1][:500] for hits in kinds if hits), None)
            if kinds[0] or time.monotonic() >= give_up:
                return best
            time.sleep(0.05)

    def log_text(self) -> str:
        with self.lock:
            return self.log.text()

    def stop(self) -> dict:
        """Kill the server's whole group (TERM, then KILL after a grace period) and say what is
        left of it."""
        pgid = self.proc.pid
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
            if wait_group_gone(pgid, self.proc, grace):
                break
        self.pump.join(timeout=5)
        return {"returncode": self.proc.returncode, "left_alive": group_members(pgid)}


def wait_group_gone(pgid: int, proc, grace: float) -> bool:
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        proc.poll()
        if not group_members(pgid):
            return True
        time.sleep(0.05)
    return False


def group_members(pgid: int) -> list:
    """Live (non-zombie) processes of process group `pgid`, from /proc."""
    return [pid for pid, _, group in capture.live_processes() if group == pgid]
