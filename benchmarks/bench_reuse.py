#!/usr/bin/env python3
"""`run --reuse` of a large image's accepted run, side by side with the CLI's own start-up.

Runs --pipeline (default vllm) on --image (default the 10 GB vLLM test image) once, signed with a
key of its own, then times, alternating, --repeat times each:
  imagegate --version                        the CLI's start-up alone
  imagegate run IMAGE -p PIPELINE --reuse    answered from the earlier attempt
and prints the medians and their difference; then checks that the newest reuse verifies with its
link (`imagegate verify`), that an edited evidence file makes the earlier attempt refused, and
that an attempt past --reuse-within is not reused (each of these two runs under --timeout 5: the
refusal is said before the run starts, and the run is cut there).
Goals: median(reuse) - median(--version) <= 0.5 s; the link verified; both refusals said.
The package's bytecode is compiled first, as pip and pipx compile it at install: a source tree
whose .pyc files are stale (edited, PYTHONDONTWRITEBYTECODE set) would time the compiler instead.

Usage: .venv/bin/python benchmarks/bench_reuse.py [--image REF] [--pipeline P] [--repeat 7] [--record F]
Needs: a Docker engine holding the image (tests/images/build.py builds the vLLM one).
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import Goal, print_goals, write

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 0.5


def imagegate(*args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "imagegate", *args], capture_output=True, text=True)
    return time.perf_counter() - t, p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", default="imagegate-test/vllm:latest")
    ap.add_argument("--pipeline", default="vllm")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--record", type=Path)
    a = ap.parse_args()
    size = int(subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", a.image],
                              capture_output=True, text=True, check=True).stdout)  # fmt: skip
    spec = importlib.util.find_spec("imagegate")
    assert spec is not None and spec.origin is not None
    compileall.compile_dir(Path(spec.origin).parent, quiet=1)
    work = Path(tempfile.mkdtemp(prefix="bench-reuse-"))
    key, out = work / "k", work / "runs"
    subprocess.run([sys.executable, "-c", f"from imagegate.attest import keys; keys.write_keypair(__import__('pathlib').Path('{key}'), keys.generate(), None)"], check=True)  # fmt: skip
    run = [
        "run",
        a.image,
        "-p",
        a.pipeline,
        "-o",
        str(out),
        "--key",
        f"{key}.key",
    ]  # its lines say what it reused
    first_s, first = imagegate(*run, "-q")
    if first.returncode != 0:
        raise SystemExit(f"the first run was not accepted (exit {first.returncode}): {first.stderr[-2000:]}")
    (earlier,) = [p for p in out.glob("sha256-*/*") if p.is_dir()]
    print(f"  first run ({a.pipeline}, {size / 1e9:.1f} GB): {first_s:.1f} s", file=sys.stderr)
    version_s, reuse_s = [], []
    for _ in range(a.repeat):
        version_s.append(imagegate("--version")[0])
        took, p = imagegate(*run, "--reuse")
        if p.returncode != 0 or f"reused attempt {earlier.name}" not in p.stderr:
            raise SystemExit(f"--reuse did not reuse {earlier.name}: {p.stderr[-2000:]}")
        reuse_s.append(took)
    newest = max((p for p in out.glob("sha256-*/*") if p.is_dir()), key=lambda p: p.name)
    _, v = imagegate("verify", str(newest / "attestation.dsse.json"), "--key", f"{key}.pub")
    linked = v.returncode in (0, 1) and f"ok      link: reuses attempt {earlier.name}" in v.stdout

    # Past --reuse-within: not reused (said before the run starts; --timeout cuts the run after).
    _, old = imagegate(*run, "--reuse", "--reuse-within", "1s", "--timeout", "5")
    old_said = f"not reused: {earlier.name}: finished" in old.stderr and "past --reuse-within" in old.stderr
    # One evidence file edited: the earlier attempt does not verify, so it is not reused.
    for attempt in out.glob("sha256-*/*"):
        if attempt.is_dir() and attempt != earlier:
            (attempt / "attestation.dsse.json").unlink(missing_ok=True)  # the reuses would answer
    stdout = next(earlier.glob("stages/*/stdout.txt"))
    stdout.write_bytes(stdout.read_bytes() + b"edited\n")
    _, edited = imagegate(*run, "--reuse", "--timeout", "5")
    edited_said = f"not reused: {earlier.name}: does not verify" in edited.stderr

    v_med, r_med = statistics.median(version_s), statistics.median(reuse_s)
    print(f"\n--version median {v_med:.3f} s; run --reuse median {r_med:.3f} s; difference {r_med - v_med:.3f} s "
          f"(first run {first_s:.1f} s)")  # fmt: skip
    goals = [
        Goal("run --reuse - --version (medians)", f"<= {GOAL_S} s", f"{r_med - v_med:.3f} s", r_med - v_med <= GOAL_S),
        Goal("the reuse verifies with its link", "link ok", "link ok" if linked else v.stdout[-300:], linked),
        Goal("an attempt past --reuse-within", "not reused, said", "said" if old_said else old.stderr[-300:], old_said),
        Goal("an edited evidence file", "not reused, said", "said" if edited_said else edited.stderr[-300:], edited_said),
    ]  # fmt: skip
    code = print_goals(goals)
    if a.record:
        results = {
            "image": a.image, "image_bytes": size, "pipeline": a.pipeline, "first_run_s": round(first_s, 2),
            "version_s": [round(x, 3) for x in version_s], "reuse_s": [round(x, 3) for x in reuse_s],
            "version_median_s": round(v_med, 3), "reuse_median_s": round(r_med, 3),
            "verdict": json.loads((earlier / "statement.json").read_text())["predicate"]["verdict"],
        }  # fmt: skip
        write(a.record, "bench_reuse", vars(a), results, goals)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
