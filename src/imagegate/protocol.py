"""The controller's JSON-lines events (DESIGN.md): start, one stage per stage, end. Lines that
are not our events (anything else the image printed) are ignored here and kept as raw evidence."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MARK = "imagegate"
PROTOCOL = 1


@dataclass
class Events:
    start: dict[str, Any] | None = None
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    end: dict[str, Any] | None = None
    foreign_lines: int = 0


class LiveEvents:
    """Events as the controller prints them, for progress while the run goes on: feed it the
    stdout chunks, it calls `on_event` for each complete event line. The final verdict never
    depends on this: `parse` reads the whole, capped output afterwards."""

    def __init__(self, on_event: Callable[[dict[str, Any]], None]) -> None:
        self.on_event = on_event
        self.partial = bytearray()

    def feed(self, chunk: bytes) -> None:
        self.partial += chunk
        *lines, rest = self.partial.split(b"\n")
        self.partial = bytearray(rest)
        for line in lines:
            obj = parse_event(bytes(line))
            if obj is not None:
                self.on_event(obj)


def parse_event(raw: bytes) -> dict[str, Any] | None:
    """One output line -> our event, or None for anything else the image printed."""
    line = raw.strip()
    if not line.startswith(b"{"):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and obj.get(MARK) == PROTOCOL else None


def parse(stdout: bytes) -> Events:
    ev = Events()
    for raw in stdout.splitlines():
        obj = parse_event(raw)
        if obj is None:
            ev.foreign_lines += 1 if raw.strip() else 0
            continue
        kind = obj.get("event")
        if kind == "start":
            ev.start = obj
        elif kind == "stage" and isinstance(obj.get("id"), str):
            ev.stages[obj["id"]] = obj
        elif kind == "end":
            ev.end = obj
    return ev
