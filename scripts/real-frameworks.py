#!/usr/bin/env python3
"""Real vLLM and SGLang images, built the ordinary way, through the built-in pipelines.

Each target is an image made by `pip install FRAMEWORK==X av` (plus the extras it names) on the
Debian bookworm base of the test images (tests/images/build.py: whole dependency set from PyPI,
CUDA torch included), tagged by the hash of its recipe so that a second run reuses it. The script
runs `imagegate run IMAGE -p PIPELINE` on each and writes a dated record:
benchmarks/records/real-frameworks-YYYY-MM-DD.json and .md (framework, version, image size,
torch version, verdict, exit code, every stage's status, detail and duration, the imagegate
commit, build and run times). A record of the same day is updated, entry by entry.

The versions here are every version a built-in pipeline names; a pipeline may name only versions
that a record holds.

Usage: .venv/bin/python scripts/real-frameworks.py [TARGET ...] [--remove-old] [--list]
  TARGET        a target's name (see --list); default: all
  --remove-old  remove each image of an older release once recorded (the newest ones are test
                images and stay)
Needs: a Docker engine, PyPI (the host downloads the wheels), ~12 GB of disk per image.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "images"))
sys.path.insert(0, str(ROOT / "tests" / "real"))
import build  # noqa: E402
from inputs import inputs  # noqa: E402

RECORDS = ROOT / "benchmarks" / "records"
IMAGEGATE = str(Path(sys.executable).parent / "imagegate")

# name -> what to build and which built-ins to run on it. The newest releases are the images of
# tests/images/build.py's REAL_RECIPES (the same recipe, so the same cached image).
TARGETS: dict[str, dict] = {
    "vllm": {"framework": "vllm", "pipelines": ["vllm", "vllm-serve"]},
    "vllm-0.11.0": {"framework": "vllm", "pip": ["vllm==0.11.0", "av"], "pipelines": ["vllm"]},
    "vllm-0.10.2": {"framework": "vllm", "pip": ["vllm==0.10.2", "av"], "pipelines": ["vllm"]},
    "sglang": {"framework": "sglang", "pipelines": ["sglang", "sglang-disagg", "sglang-serve"]},
    "sglang-nixl": {"framework": "sglang", "pipelines": ["sglang", "sglang-disagg"]},
    "sglang-nixl-cu12-only": {"framework": "sglang", "pipelines": ["sglang-disagg"]},
}


def recipe_of(name: str) -> dict:
    t = TARGETS[name]
    if "pip" in t:
        return {"from": "python", "pip": t["pip"]}
    return build.recipe(name)


def recipe_text(r: dict) -> str:
    """What the image adds to its base, in words."""
    parts = []
    if r.get("pip"):
        parts.append("pip install " + " ".join(r["pip"]))
    if r.get("run"):
        parts.append(r["run"])
    return " && ".join(parts)


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()


def in_image(ref: str, code: str) -> dict:
    """Facts read inside the image (no network, nothing imported but importlib.metadata)."""
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", ref, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr.strip()[-500:]}


FACTS = r"""
import json, importlib.metadata as md, pathlib, re, sys
def v(n):
    try: return md.version(n)
    except md.PackageNotFoundError: return None
cuda = None
try:
    t = md.distribution("torch").locate_file("torch/version.py")
    m = re.search(r"^cuda\s*(?::\s*[\w\[\]., ]+)?=\s*'([^']*)'", pathlib.Path(t).read_text(), re.M)
    cuda = m.group(1) if m else None
except Exception:
    pass
print(json.dumps({"python": sys.version.split()[0], "torch": v("torch"), "torch_cuda": cuda,
    "vllm": v("vllm"), "sglang": v("sglang"), "av": v("av"), "nixl": v("nixl"),
    "nixl_cu12": v("nixl-cu12"), "nixl_cu13": v("nixl-cu13"),
    "distributions": len(list(md.distributions()))}))
"""


def run_pipeline(ref: str, pipeline: str, out: Path) -> dict:
    t0 = time.monotonic()
    done = subprocess.run(
        [IMAGEGATE, "run", ref, "-p", pipeline, "--format", "json", "--no-sign", "-q", "-o", str(out)],
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - t0
    entry: dict = {"pipeline": pipeline, "exit_code": done.returncode, "wall_seconds": round(wall, 1)}
    # What this verdict rests on: a later change to any of these files makes the record stale.
    entry["inputs_sha256"] = inputs(pipeline)
    try:
        pred = json.loads(done.stdout)["predicate"]
    except (ValueError, KeyError):
        entry.update(verdict=None, error=(done.stderr or done.stdout).strip()[-2000:])
        return entry
    entry["verdict"] = pred["verdict"]
    entry["stages"] = [
        {
            "id": s["id"],
            "status": s["status"],
            "detail": s.get("detail"),
            "duration_seconds": s.get("durationSeconds"),
        }
        for s in pred["stages"]
    ]
    for s, kept in zip(pred["stages"], entry["stages"], strict=True):
        if s.get("probe") == "find_spec":  # where each module was found: the variant nixl picked
            kept["origins"] = {
                m["module"]: m.get("origin") for m in (s.get("facts") or {}).get("modules", [])
            }
    # The raw run of a deferred GPU stage is the evidence a user reads: keep its last lines.
    attempt = next(out.glob(f"*/{pred['attempt']['id']}"), None)
    if attempt:
        for s in pred["stages"]:
            if s["status"] == "DEFERRED":
                for err in attempt.glob(f"stages/*-{s['id']}/stderr.txt"):
                    tail = err.read_text(errors="replace").strip().splitlines()[-3:]
                    entry.setdefault("deferred_stderr_tail", {})[s["id"]] = tail
    return entry


def run_target(name: str, remove_old: bool, commit: str) -> dict:
    t = TARGETS[name]
    r = recipe_of(name)
    tag = f"imagegate-test/{name}:{build.recipe_hash(name, r)}"
    cached = build.image_exists(tag)
    t0 = time.monotonic()
    build.build(name, r)
    built_in = None if cached else round(time.monotonic() - t0, 1)
    size = int(subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", tag], capture_output=True,
                              text=True, check=True).stdout)  # fmt: skip
    layers = int(
        subprocess.run(["docker", "image", "inspect", "-f", "{{len .RootFS.Layers}}", tag],
                       capture_output=True, text=True, check=True).stdout
    )  # fmt: skip
    facts = in_image(tag, FACTS)
    entry = {
        "target": name,
        "imagegate_commit": commit,
        "framework": t["framework"],
        "version": facts.get(t["framework"]),
        "recipe": r,
        "adds": recipe_text(r),
        "image": tag,
        "image_bytes": size,
        "image_gb": round(size / 1e9, 2),
        "layers": layers,
        "build_seconds": built_in,
        "facts": facts,
        "runs": [],
    }
    # Durations depend on what else the machine runs: the load is part of the record.
    entry["load_average_before"] = [round(x, 1) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp:
        for p in t["pipelines"]:
            print(f"real-frameworks: {name}: imagegate run -p {p}", file=sys.stderr, flush=True)
            entry["runs"].append(run_pipeline(tag, p, Path(tmp)))
    entry["load_average_after"] = [round(x, 1) for x in os.getloadavg()]
    if remove_old and name not in build.REAL_RECIPES:
        # both of its tags (build.py also tags NAME:latest), so that the layers go
        subprocess.run(["docker", "image", "rm", tag, f"imagegate-test/{name}:latest"], capture_output=True)
        entry["removed_after"] = True
    return entry


def engine() -> dict:
    v = subprocess.run(["docker", "version", "-f", "{{.Server.Version}}"], capture_output=True, text=True)
    return {"docker": v.stdout.strip(), "cpus": os.cpu_count(), "gpu": False}


def write(record: dict, day: str) -> Path:
    RECORDS.mkdir(parents=True, exist_ok=True)
    path = RECORDS / f"real-frameworks-{day}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown(record))
    return path


def markdown(record: dict) -> str:
    commits = ", ".join(sorted({f"`{e['imagegate_commit']}`" for e in record["entries"]}))
    lines = [
        f"# Built-in pipelines on real framework images, {record['date']}",
        "",
        f"imagegate commit {commits}; "
        f"Docker {record['engine']['docker']}, "
        f"{record['engine']['cpus']} CPUs, no GPU. Made by `scripts/real-frameworks.py`; the JSON "
        "beside this file holds every stage's detail. Durations depend on the machine's load "
        "(1-minute load average before each image's runs: "
        + ", ".join(f"{e['target']} {e.get('load_average_before', ['?'])[0]}" for e in record["entries"])
        + ").",
        "",
        "Images: `pip install` from PyPI on Debian bookworm's python3 (`python`: tests/images/build.py).",
        "",
        "| image | made by | framework | torch (CUDA) | size | build | pipeline | verdict | exit | run | stages |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in record["entries"]:
        f = e["facts"]
        made = f"on {e['recipe']['from']}: {e.get('adds') or recipe_text(e['recipe'])}"
        for run in e["runs"]:
            stages = ", ".join(
                f"{s['id']} {s['status']} {s['duration_seconds']:.1f}s"
                if s.get("duration_seconds") is not None
                else f"{s['id']} {s['status']}"
                for s in run.get("stages", [])
            )
            build_s = f"{e['build_seconds']:.0f}s" if e.get("build_seconds") else "cached"
            lines.append(
                f"| {e['target']} | {made} | {e['framework']} {e['version']} "
                f"| {f.get('torch')} ({f.get('torch_cuda')}) | {e['image_gb']} GB | {build_s} "
                f"| {run['pipeline']} | {run.get('verdict')} | {run['exit_code']} | {run['wall_seconds']}s "
                f"| {stages} |"
            )
    lines += ["", "Details of what did not pass:", ""]
    for e in record["entries"]:
        for run in e["runs"]:
            for s in run.get("stages", []):
                if s["status"] != "PASS":
                    lines.append(
                        f"- {e['target']} `-p {run['pipeline']}` {s['id']} {s['status']}: {s['detail']}"
                    )
            if run.get("error"):
                lines.append(f"- {e['target']} `-p {run['pipeline']}`: {run['error']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*")
    ap.add_argument("--remove-old", action="store_true")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args(argv)
    if a.list:
        for n, t in TARGETS.items():
            print(
                n,
                f"(from {recipe_of(n)['from']})",
                recipe_text(recipe_of(n)),
                "->",
                ", ".join(t["pipelines"]),
            )
        return 0
    unknown = [n for n in a.targets if n not in TARGETS]
    if unknown:
        print(f"real-frameworks: unknown target {unknown[0]!r}; known: {', '.join(TARGETS)}", file=sys.stderr)
        return 3
    day = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    path = RECORDS / f"real-frameworks-{day}.json"
    record = json.loads(path.read_text()) if path.exists() else {"entries": []}
    # Uncommitted changes to what runs are marked: such an entry is no record of a commit.
    dirty = bool(git("status", "--porcelain", "--", "src", "probes", "data"))
    commit = git("rev-parse", "--short=12", "HEAD") + ("+changes" if dirty else "")
    command = " ".join([".venv/bin/python", "scripts/real-frameworks.py", *argv])
    record.update(date=day, engine=engine(), script="scripts/real-frameworks.py")
    for name in a.targets or list(TARGETS):
        entry = run_target(name, a.remove_old, commit)
        # records written meanwhile are no change to what ran
        entry["tree"] = (
            "dirty" if git("status", "--porcelain", "--", ".", ":(exclude)benchmarks/records") else "clean"
        )
        entry["command"] = command
        if path.exists():  # another run may have written meanwhile: keep its entries
            record["entries"] = json.loads(path.read_text())["entries"]
        before = next((e for e in record["entries"] if e["image"] == entry["image"]), None)
        if entry["build_seconds"] is None and before:  # a cached image: its build as recorded then
            entry["build_seconds"] = before.get("build_seconds")
        entry["recorded"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        record["entries"] = [e for e in record["entries"] if e["target"] != name] + [entry]
        record["entries"].sort(key=lambda e: list(TARGETS).index(e["target"]))
        print(f"real-frameworks: {name}: written to {write(record, day)}", file=sys.stderr, flush=True)
        for run in entry["runs"]:
            print(
                f"  {name} -p {run['pipeline']}: {run.get('verdict')} (exit {run['exit_code']})", flush=True
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
