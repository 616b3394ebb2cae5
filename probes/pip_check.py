"""pip_check: the dependency closure, by `python -m pip check`, parsed into structured problems."""

from __future__ import annotations

import re
import sys

from . import capture

# The three lines pip check writes (pip/_internal/commands/check.py).
MISSING = re.compile(
    r"^(?P<project>\S+) (?P<version>\S+) requires (?P<requirement>.+), which is not installed\.$"
)
CONFLICT = re.compile(
    r"^(?P<project>\S+) (?P<version>\S+) has requirement (?P<requirement>.+), "
    r"but you have (?P<dependency>\S+) (?P<installed>\S+)\.$"
)
UNSUPPORTED = re.compile(r"^(?P<project>\S+) (?P<version>\S+) is not supported on this platform\.?$")
CLEAN = "No broken requirements found."


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(output: str):
    problems, unparsed = [], []
    for line in output.splitlines():
        line = line.strip()
        if not line or line == CLEAN:
            continue
        m = MISSING.match(line)
        if m:
            problems.append(dict(kind="missing", line=line, **m.groupdict()))
            continue
        m = CONFLICT.match(line)
        if m:
            problems.append(dict(kind="conflict", line=line, **m.groupdict()))
            continue
        m = UNSUPPORTED.match(line)
        if m:
            problems.append(dict(kind="unsupported_platform", line=line, **m.groupdict()))
            continue
        unparsed.append(line)
    return problems, unparsed


def run(params: dict) -> dict:
    done = capture.run(
        [sys.executable, "-m", "pip", "check"], timeout=capture.child_timeout(), new_group=False
    )
    out, err = done.out.text(), done.err.text()
    # pip's own output is the stage's raw evidence.
    sys.stdout.write(out)
    sys.stderr.write(err)
    data = {"returncode": done.returncode, "python": sys.executable}
    if "No module named pip" in err:
        return {
            "status": "ERROR",
            "detail": f"pip is not installed for {sys.executable}; install pip in the image or drop the pip_check stage",
            "data": data,
        }
    problems, unparsed = parse(out)
    ignore = set(normalize(n) for n in params.get("ignore", []))
    for p in problems:
        p["ignored"] = normalize(p["project"]) in ignore
    data.update(problems=problems, unparsed=unparsed)
    counted = [p for p in problems if not p["ignored"]]
    if done.returncode == 0 and not problems and CLEAN in out:
        return {"status": "PASS", "detail": "no broken requirements", "data": data}
    if done.returncode == 0 and not counted and problems:
        return {
            "status": "PASS",
            "detail": "%s, all ignored by the pipeline" % _count(len(problems)),
            "data": data,
        }
    if counted:
        text = "; ".join(p["line"] for p in counted)  # pip's own words
        return {"status": "FAIL", "detail": "%s: %s" % (_count(len(counted)), text), "data": data}
    if done.returncode != 0 and problems:  # only ignored ones, but pip still failed
        return {
            "status": "PASS",
            "detail": "%s, all ignored by the pipeline" % _count(len(problems)),
            "data": data,
        }
    # pip failed and said nothing we understand: never a PASS.
    last = (unparsed or err.strip().splitlines() or ["no output"])[-1]
    return {
        "status": "ERROR",
        "detail": f"pip check exited {done.returncode} with output imagegate could not parse: {last[:300]}",
        "data": data,
    }


def _count(n: int) -> str:
    return "1 problem" if n == 1 else "%d problems" % n
