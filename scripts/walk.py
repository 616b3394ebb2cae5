#!/usr/bin/env python3
"""The walk a reader takes following an image through imagegate: `imagegate run IMAGE` from the
CLI down to the signed statement, traced as it runs.

    python scripts/walk.py IMAGE                  # this checkout's src/
    python scripts/walk.py IMAGE --src OTHER/src  # another tree (an earlier commit's worktree)

Every call of an imagegate function that is handed the image's facts (an `ImageFacts`), the run's
record (`RunRecord`) or its statement (a typed `Statement`, or the JSON of one) is a step into
that function's module; its return, a step back to the caller's. The walk is the sequence of
modules so visited (one entry per move, the same module twice in a row counted once): `rooms`
the modules it enters, `moves` the changes of module, `returns` the moves into a module the walk
had already left (the back-and-forth a reader follows). The same definition for every tree, so
two commits compare.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
CARRIED = ("ImageFacts", "RunRecord", "Statement")


def _carries(frame: FrameType) -> bool:
    """Handed the image's facts, its record or its statement; a method of those values (their
    own `to_json`, a property, a constructor) is the value itself, not a place the reader goes."""
    code = frame.f_code
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    if code.co_name.startswith("__") or (
        names[:1] in (("self",), ("cls",)) and _is_carried(frame.f_locals.get(names[0]))
    ):
        return False
    return any(_is_carried(frame.f_locals.get(name)) for name in names)


def _is_carried(value: object) -> bool:
    if isinstance(value, type):
        return value.__name__ in CARRIED
    if type(value).__name__ in CARRIED:
        return True
    return isinstance(value, dict) and "predicateType" in value and "subject" in value


def _module(frame: FrameType | None) -> str | None:
    """The product module a frame runs in; the helpers every ring uses (`_support`: JSON
    narrowing, files, sizes) are not rooms, as a builtin is not."""
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    if not isinstance(name, str) or not name.startswith("imagegate") or name.startswith("imagegate._support"):
        return None
    return name


class Walk:
    def __init__(self) -> None:
        self.steps: list[str] = []
        self.calls: list[str] = []  # module.function of each call counted, for --calls
        self.lock = threading.Lock()

    def step(self, module: str | None) -> None:
        if module is None:
            return
        with self.lock:
            if not self.steps or self.steps[-1] != module:
                self.steps.append(module)

    def profile(self, frame: FrameType, event: str, _arg: object) -> None:
        if event not in ("call", "return") or _module(frame) is None or not _carries(frame):
            return
        if event == "call":
            self.calls.append(f"{_module(frame)}.{frame.f_code.co_name}")
        self.step(_module(frame) if event == "call" else _module(frame.f_back))

    def figures(self) -> dict[str, object]:
        returns, seen = 0, set()
        for before, now in zip(self.steps, self.steps[1:], strict=False):
            seen.add(before)
            returns += now in seen
        return {
            "rooms": len(set(self.steps)),
            "moves": max(0, len(self.steps) - 1),
            "returns": returns,
            "walk": self.steps,
        }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("image")
    parser.add_argument("--src", type=Path, default=ROOT / "src")
    parser.add_argument("-p", "--pipeline", default="python")
    parser.add_argument("--calls", action="store_true", help="list each call the walk counted")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.src.resolve()))
    from imagegate import cli

    walk = Walk()
    with tempfile.TemporaryDirectory() as tmp:
        key = Path(tmp) / "k"
        cli.run_main(["keygen", "--out", str(key)])
        run = [
            "run",
            args.image,
            "-p",
            args.pipeline,
            "-o",
            str(Path(tmp) / "out"),
            "--key",
            f"{key}.key",
            "-q",
        ]
        sys.setprofile(walk.profile)  # the main thread's: the call chain a reader follows
        try:
            code = cli.run_main(run)
        finally:
            sys.setprofile(None)
    figures = {"source": str(args.src), "exit_code": code, **walk.figures()}
    if args.calls:
        figures["calls"] = walk.calls
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
