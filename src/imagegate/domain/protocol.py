"""The controller's event channel (docs/design.md, "Protocol"), read by the runner.

An event line is `imagegate-event 2 SEQ MAC JSON`: SEQ counts from 0, MAC is HMAC-SHA256 under
the run's key over `SEQ JSON`. The stream is read incrementally with bounded memory: a line that
is not an event is counted and its head kept as evidence, never buffered whole; an event line is
buffered up to MAX_EVENT_LINE. Only authenticated events in sequence and in plan order are
accepted; every other thing that claims to be an event is a violation, named, and makes the run
ERROR (runner.py) — never a PASS."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

MARK = b"imagegate-event"
PROTOCOL = 2
MAX_EVENT_LINE = 32 * 1024 * 1024  # a stage event holds at most ~1 MiB of capped output, escaped
NOISE_KEEP = 1024 * 1024  # head of the non-event output kept as evidence
EVENTS_KEEP = 48 * 1024 * 1024  # authenticated event lines kept verbatim as evidence
MAX_VIOLATIONS = 20
_MARK_SP = MARK + b" "

OnEvent = Callable[[dict[str, object]], None]


def new_key() -> bytes:
    return secrets.token_bytes(32)


def mac(key: bytes, seq: int, payload: bytes) -> str:
    return hmac.new(key, b"%d " % seq + payload, hashlib.sha256).hexdigest()


def encode(key: bytes, seq: int, event: dict[str, object]) -> bytes:
    """One event line as the controller writes it (probes/controller.py); used by tests."""
    payload = json.dumps(event, sort_keys=True, separators=(",", ":")).encode()
    return b"\n%s %d %d %s %s\n" % (MARK, PROTOCOL, seq, mac(key, seq, payload).encode(), payload)


@dataclass
class Events:
    start: dict[str, object] | None = None
    stages: dict[str, dict[str, object]] = field(default_factory=dict)
    end: dict[str, object] | None = None
    violations: list[str] = field(default_factory=list)
    violations_total: int = 0
    noise_bytes: int = 0  # output that was not an event line
    noise_head: bytes = b""
    event_lines: bytes = b""  # the accepted lines, verbatim (re-verifiable with the key)
    started: dict[str, float] = field(default_factory=dict)  # stage id -> when its stage_start came
    closed_at: float | None = None  # when the output ended (monotonic)


class EventStream:
    """Feed it the controller's output as it arrives; `close()` gives the accepted events."""

    def __init__(self, key: bytes, plan_ids: Sequence[str], on_event: OnEvent | None = None) -> None:
        self.key = key
        self.plan_ids = list(plan_ids)
        self.on_event = on_event
        self.ev = Events()
        self._seq = 0
        self._line = bytearray()  # the current line while it may be, or is, an event
        self._kind: str | None = None  # None: undecided; "event"; "noise"; "overlong"
        self._noise = bytearray()
        self._lineno = 1
        self._events = bytearray()

    # -- bytes to lines ---------------------------------------------------------------------
    # Linear in the input whatever its shape: noise is skipped with bytes.find, in bulk, and
    # never buffered beyond NOISE_KEEP; only a line that starts with MARK is held.
    def feed(self, chunk: bytes) -> None:
        pos, n = 0, len(chunk)
        while pos < n:
            if self._kind == "noise":
                nxt = chunk.find(b"\n" + _MARK_SP, pos)
                if nxt >= 0:
                    self._noise_feed(chunk[pos : nxt + 1])
                    self._lineno += chunk.count(b"\n", pos, nxt + 1)
                    self._kind, pos = None, nxt + 1
                    continue
                last = chunk.rfind(b"\n", pos)
                if last < 0:
                    self._noise_feed(chunk[pos:])
                    return
                self._noise_feed(chunk[pos : last + 1])
                self._lineno += chunk.count(b"\n", pos, last + 1)
                self._kind, pos = None, last + 1
            elif self._kind in ("event", "overlong"):
                nl = chunk.find(b"\n", pos)
                end = n if nl < 0 else nl
                if self._kind == "event":
                    self._line += chunk[pos:end]
                    self._check_size()
                if nl < 0:
                    return
                if self._kind == "event":
                    self._event_line(bytes(self._line).rstrip(b"\r"))
                self._line.clear()
                self._kind, pos = None, nl + 1
                self._lineno += 1
            else:  # at a line start: is it an event line? (the held bytes are a prefix of MARK)
                if not self._line and chunk[pos] == 0x0A:  # an empty line (events start with one)
                    pos += 1
                    self._lineno += 1
                    continue
                want = _MARK_SP[len(self._line) :]
                got = chunk[pos : pos + len(want)]
                if want.startswith(got):
                    self._line += got
                    pos += len(got)
                    if len(got) == len(want):
                        self._kind = "event"
                    continue
                self._kind = "noise"
                self._noise_feed(bytes(self._line))
                self._line.clear()

    def _check_size(self) -> None:
        if len(self._line) > MAX_EVENT_LINE:
            self._violation(
                f"line {self._lineno}: an event line longer than {MAX_EVENT_LINE} bytes (dropped)"
            )
            self._line.clear()
            self._kind = "overlong"

    def _noise_feed(self, data: bytes) -> None:
        self.ev.noise_bytes += len(data)
        room = NOISE_KEEP - len(self._noise)
        if room > 0:
            self._noise += data[:room]

    # -- lines to events --------------------------------------------------------------------
    def _violation(self, what: str) -> None:
        self.ev.violations_total += 1
        if len(self.ev.violations) < MAX_VIOLATIONS:
            self.ev.violations.append(what)

    def _event_line(self, line: bytes) -> None:
        parts = line.split(b" ", 4)
        where = f"line {self._lineno}"
        if len(parts) != 5 or parts[1] != b"%d" % PROTOCOL or not parts[2].isdigit():
            self._violation(f"{where}: a malformed event line: {_show(line)}")
            return
        seq, given, payload = int(parts[2]), parts[3].decode("ascii", "replace"), parts[4]
        if not hmac.compare_digest(given, mac(self.key, seq, payload)):
            self._violation(f"{where}: an event line that fails authentication (forged?): {_show(line)}")
            return
        if seq != self._seq:
            self._violation(f"{where}: event number {seq} where {self._seq} was expected")
            return
        self._seq += 1
        try:
            obj = json.loads(payload)
        except (ValueError, RecursionError):
            self._violation(f"{where}: an authenticated event that is not JSON")
            return
        if not isinstance(obj, dict) or not self._accept(obj, where):
            return
        if len(self._events) + len(line) < EVENTS_KEEP:
            self._events += line + b"\n"
        if self.on_event is not None:
            self.on_event(obj)

    def _accept(self, obj: dict[str, object], where: str) -> bool:
        kind = obj.get("event")
        ev = self.ev
        if ev.end is not None:
            self._violation(f"{where}: an event after the end event")
            return False
        if kind == "start":
            if ev.start is not None:
                self._violation(f"{where}: a second start event")
                return False
            ev.start = obj
            return True
        if ev.start is None:
            self._violation(f"{where}: a {kind!r} event before the start event")
            return False
        if kind == "stage":
            sid = obj.get("id")
            if sid not in self.plan_ids:
                self._violation(f"{where}: an event for stage {sid!r}, which is not in the plan")
                return False
            if sid in ev.stages:
                self._violation(f"{where}: a second event for stage {sid!r}")
                return False
            expected = self.plan_ids[len(ev.stages)]
            if sid != expected:
                self._violation(f"{where}: stage {sid!r} reported before {expected!r} (out of plan order)")
                return False
            ev.stages[sid] = obj
            return True
        if kind == "stage_start":
            sid = obj.get("id")
            upcoming = self.plan_ids[len(ev.stages)] if len(ev.stages) < len(self.plan_ids) else None
            if not isinstance(sid, str) or sid != upcoming or sid in ev.started:
                self._violation(f"{where}: a start for stage {sid!r} where {upcoming!r} was next")
                return False
            ev.started[sid] = time.monotonic()
            return True
        if kind == "end":
            ev.end = obj
            return True
        self._violation(f"{where}: an event of unknown kind {kind!r}")
        return False

    def close(self) -> Events:
        # An unterminated event line is a run cut mid-write: the missing events say so already.
        if self._kind != "event" and self._line:
            self._noise_feed(bytes(self._line))
        self.ev.closed_at = time.monotonic()
        self.ev.noise_head = bytes(self._noise)
        self.ev.event_lines = bytes(self._events)
        return self.ev


def _show(line: bytes, limit: int = 160) -> str:
    text = line.decode("utf-8", "replace")
    return text if len(text) <= limit else text[:limit] + f"… ({len(line)} bytes)"


def read_all(key: bytes, plan_ids: Sequence[str], data: bytes) -> Events:
    """A whole captured output at once (a Pod log)."""
    stream = EventStream(key, plan_ids)
    stream.feed(data)
    return stream.close()
