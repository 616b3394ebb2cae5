#!/usr/bin/env python3
"""How soon a run ends after Ctrl-C (SIGINT) or SIGTERM, in each phase of a real-size run, side by
side with what the same signal costs `docker save IMAGE | sha256sum` (which dies with its pipe).

For each phase a fresh `imagegate run IMAGE -p PIPELINE --no-sign -vv` is started and the signal
sent when its log says the phase began:
  export    the engine was asked for its export (the engine prepares it: no byte yet)
  hashing   the export's first byte arrived, 3 s later (the layers are being hashed)
  probes    the in-image stages run, 8 s after they started (the issue's "8-25 s in")
Measured: the seconds from the signal to the exit, the exit code, and whether a container of the
run is left. Goal: every exit within 2 s of the signal, with 130 (SIGINT) or 143 (SIGTERM), and
nothing left.

Usage: .venv/bin/python benchmarks/bench_interrupt.py [--image REF] [--pipeline P] [--record FILE]
Default: the real vLLM test image (tests/images/build.py vllm), -p vllm."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import Goal, print_goals, write

ROOT = Path(__file__).resolve().parents[1]
WITHIN_S = 2.0
PHASES = [  # name, the log line's marker, delay after it, signal
    ("export", "asking the engine", 0.5, signal.SIGINT),
    ("hashing", "export began", 3.0, signal.SIGINT),
    ("hashing-sigterm", "export began", 5.0, signal.SIGTERM),
    ("probes", " stages in ", 8.0, signal.SIGINT),
]


def one(image: str, pipeline: str, marker: str, delay: float, sig: int, work: Path) -> dict[str, object]:
    start = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, "-m", "imagegate", "run", image, "-p", pipeline, "--no-sign", "-vv", "-o", str(work)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    seen, lines = threading.Event(), []

    def read() -> None:
        assert p.stderr is not None
        for line in p.stderr:
            lines.append(line.rstrip())
            if marker in line:
                seen.set()

    threading.Thread(target=read, daemon=True).start()
    if not seen.wait(600):
        p.kill()
        return {"error": "marker not seen", "tail": lines[-10:]}
    time.sleep(delay)
    sent = time.monotonic()
    p.send_signal(sig)
    p.wait()
    ended = time.monotonic()
    time.sleep(1)
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=io.imagegate.pid={p.pid}"], capture_output=True, text=True
    ).stdout.split()
    return {
        "signal": signal.Signals(sig).name,
        "sent_at_s": round(sent - start, 1),
        "exit_after_signal_s": round(ended - sent, 2),
        "exit_code": p.returncode,
        "containers_left": len(left),
        "said": [line for line in lines if line.startswith("imagegate: interrupted")][-1:],
    }


def baseline(image: str) -> dict[str, object]:
    """`docker save IMAGE | sha256sum`, SIGINT to the pipeline's process group 3 s in."""
    p = subprocess.Popen(["sh", "-c", f"docker save {image} | sha256sum >/dev/null"], start_new_session=True)
    time.sleep(3)
    sent = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)
    p.wait()
    return {"exit_after_signal_s": round(time.monotonic() - sent, 2), "exit_code": p.returncode}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default="imagegate-test/vllm:latest")
    ap.add_argument("--pipeline", default="vllm")
    ap.add_argument("--record", type=Path)
    args = ap.parse_args()
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, marker, delay, sig in PHASES:
            results[name] = r = one(args.image, args.pipeline, marker, delay, sig, Path(tmp) / name)
            print(f"{name:<16} {r}")
    results["docker save | sha256sum"] = b = baseline(args.image)
    print(f"{'docker save':<16} {b}")
    timed = [r for k, r in results.items() if k != "docker save | sha256sum"]
    worst = max(float(r.get("exit_after_signal_s", 1e9)) for r in timed)  # type: ignore[arg-type]
    codes = all(r.get("exit_code") == (143 if r.get("signal") == "SIGTERM" else 130) for r in timed)
    left = sum(int(r.get("containers_left", 1)) for r in timed)  # type: ignore[call-overload]
    goals = [
        Goal(
            "slowest exit after the signal, every phase",
            f"<= {WITHIN_S} s",
            f"{worst:.2f} s",
            worst <= WITHIN_S,
        ),
        Goal(
            "exit codes", "130 (SIGINT), 143 (SIGTERM)", "as expected" if codes else "not as expected", codes
        ),
        Goal("containers left", "0", str(left), left == 0),
    ]
    if args.record:
        write(args.record, "bench_interrupt", vars(args), results, goals)
    return print_goals(goals)


if __name__ == "__main__":
    sys.exit(main())
