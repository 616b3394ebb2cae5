"""The controller's JSON-lines events (DESIGN.md): start, one stage per stage, end. Lines that
are not our events (anything else the image printed) are ignored here and kept as raw evidence."""

from __future__ import annotations

import json
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


def parse(stdout: bytes) -> Events:
    ev = Events()
    for raw in stdout.splitlines():
        line = raw.strip()
        if not line.startswith(b"{"):
            if line:
                ev.foreign_lines += 1
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            ev.foreign_lines += 1
            continue
        if not isinstance(obj, dict) or obj.get(MARK) != PROTOCOL:
            ev.foreign_lines += 1
            continue
        kind = obj.get("event")
        if kind == "start":
            ev.start = obj
        elif kind == "stage" and isinstance(obj.get("id"), str):
            ev.stages[obj["id"]] = obj
        elif kind == "end":
            ev.end = obj
    return ev
