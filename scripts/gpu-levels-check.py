"""The checks of scripts/gpu-levels.sh, read from what its steps left under OUT (exit codes, the
signed VSAs, verify's words) and from the attempt folders: one PASS/FAIL line each, then
`gpu-levels: PASS` or `gpu-levels: FAIL`, and summary.json. Exit 0 when every check passed.
Standard library only: it runs on the GPU host's own python3.

Usage: gpu-levels-check.py OUT HIDDEN COMPLETED SKIPPED CLAIMED   (attempt folders of (a)-(d))
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

CPU, GPU = "IMAGEGATE_CPU", "IMAGEGATE_GPU"


def read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def rc(out: Path, name: str) -> int | None:
    text = read(out / f"rc-{name}").strip()
    return int(text) if text.lstrip("-").isdigit() else None


def vsa(out: Path, name: str) -> dict:
    try:
        envelope = json.loads(read(out / f"{name}-vsa.dsse.json"))
        return json.loads(base64.b64decode(envelope["payload"]))["predicate"]
    except (ValueError, KeyError, TypeError):
        return {}


def attempt(folder: str) -> dict:
    """The attempt's statement predicate, its stages by id, and each controller's grant."""
    root = Path(folder)
    try:
        pred = json.loads(read(root / "statement.json"))["predicate"]
        controllers = json.loads(read(root / "run.json"))["run"]["controllers"]
    except (ValueError, KeyError, TypeError):
        return {"stages": {}, "environment": {}, "controllers": []}
    return {
        "verdict": pred.get("verdict"),
        "stages": {s["id"]: s for s in pred.get("stages") or []},
        "environment": pred.get("environment") or {},
        "controllers": [c.get("gpus_granted") for c in controllers],
        "completes": (pred.get("completes") or {}).get("attempt"),
    }


def stage(a: dict, sid: str) -> tuple:
    s = a["stages"].get(sid) or {}
    return s.get("status"), s.get("gpuGranted") is True


def seen_gpus(grant: object) -> bool:
    """The runner granted GPUs and saw /dev/nvidiaN nodes."""
    if not isinstance(grant, dict) or grant.get("granted") is not True:
        return False
    seen = grant.get("seen") or []
    return bool(seen) and all(re.fullmatch(r"/dev/nvidia\d+", str(p)) for p in seen)


def checks(out: Path, a: dict, b: dict, c: dict, d: dict) -> list:
    """(name, passed, what was found)"""
    said = {n: read(out / f"verify-{n}.txt").strip().splitlines()[-1:] for n in ("a", "b", "c", "d")}
    lv = {n: vsa(out, n).get("verifiedLevels") for n in ("a", "b", "c", "d")}
    grants_b = b["controllers"]
    return [
        (
            "a: hidden GPUs, exit 0, CPU level alone",
            (rc(out, "a"), a.get("verdict"), lv["a"]) == (0, "CPU_PASS_NODE_CHECK_DEFERRED", [CPU]),
            [rc(out, "a"), a.get("verdict"), lv["a"]],
        ),
        (
            "a: the runner granted no GPU",
            a["environment"].get("gpuGranted") is False and stage(a, "node_check") == ("DEFERRED", False),
            [a["environment"].get("gpus_granted")],
        ),
        (
            "a: verify 0, --require-complete 1",
            (rc(out, "verify-a"), rc(out, "verify-a-require-complete")) == (0, 1),
            said["a"],
        ),
        (
            "b: complete --here --gpus: PASS, exit 0, CPU and GPU levels",
            (rc(out, "b"), b.get("verdict"), lv["b"]) == (0, "PASS", [CPU, GPU]),
            [rc(out, "b"), b.get("verdict"), lv["b"]],
        ),
        (
            "b: the runner's fact recorded: node_check gpuGranted, the nodes it saw",
            stage(b, "node_check") == ("PASS", True)
            and seen_gpus(b["environment"].get("gpus_granted"))
            and b["environment"].get("gpuGranted") is True
            and bool(grants_b)
            and all(map(seen_gpus, grants_b)),
            [stage(b, "node_check"), b["environment"].get("gpus_granted"), grants_b],
        ),
        (
            "b: verify 0 naming IMAGEGATE_GPU",
            rc(out, "verify-b") == 0 and GPU in " ".join(said["b"]),
            said["b"],
        ),
        (
            "c: CPU stage left out on the GPUs: no level, run exit 1",
            (rc(out, "c"), lv["c"]) == (1, ["FAILED"])
            and stage(c, "node_check") == ("PASS", True)
            and stage(c, "find_spec")[0] == "DEFERRED",
            [rc(out, "c"), c.get("verdict"), lv["c"]],
        ),
        (
            "c: verify 1, no level",
            rc(out, "verify-c") == 1 and "reaches no level" in " ".join(said["c"]),
            said["c"],
        ),
        (
            "d: an interpreter claiming GPUs never granted: no GPU level",
            GPU not in (lv["d"] or [GPU])
            and stage(d, "node_check") == ("DEFERRED", False)
            and d["environment"].get("gpuGranted") is False,
            [lv["d"], stage(d, "node_check"), {"claimed": d["environment"].get("gpuPresent")}],
        ),
    ]


def brief(a: dict) -> dict:
    """What the summary keeps of an attempt: its verdict, each stage's status and the runner's
    fact on it, the image's word and the runner's on GPUs."""
    env = a["environment"]
    return {
        "verdict": a.get("verdict"),
        "completes": a.get("completes"),
        "stages": {sid: list(stage(a, sid)) for sid in a["stages"]},
        "gpuPresent": env.get("gpuPresent"),
        "gpuGranted": env.get("gpuGranted"),
        "gpus_granted": env.get("gpus_granted"),
        "controllers_gpus_granted": a["controllers"],
    }


def main(argv: list) -> int:
    out = Path(argv[1])
    a, b, c, d = (attempt(f) for f in argv[2:6])
    results = checks(out, a, b, c, d)
    for name, ok, found in results:
        print(
            ("PASS " if ok else "FAIL ")
            + name
            + ("" if ok else ": found %s" % json.dumps(found, default=str))
        )
    try:
        smi = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            .stdout.strip()
            .splitlines()
        )
    except (OSError, subprocess.SubprocessError):
        smi = []
    passed = all(ok for _, ok, _ in results)
    summary = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": os.environ.get("COMMIT"),
        "nvidia_smi": smi,
        "checks": [{"name": n, "pass": ok, "found": f} for n, ok, f in results],
        "attempts": {
            k: brief(v) for k, v in (("hidden", a), ("completed", b), ("skipped", c), ("claimed", d))
        },
        "result": "PASS" if passed else "FAIL",
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print("gpu-levels: " + summary["result"])
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
