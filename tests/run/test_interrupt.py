"""An interrupt at any moment of a run leaves no container behind, and the CLI says "removed"
only when the engine confirmed it. The race this guards: an interrupt that lands while the
engine is creating the container (the create call has been sent, its answer not yet read)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import DOCKER_SOCK, default_signals

pytestmark = pytest.mark.signals

RUNS = int(os.environ.get("IMAGEGATE_TEST_INTERRUPTS", "50"))


def _imagegate_containers() -> dict[str, str]:
    """name -> the runner PID label ("" when a container has none) of every imagegate container."""
    out = subprocess.run(
        ["docker", "-H", DOCKER_SOCK, "ps", "-a", "--filter", "label=io.imagegate.run", "--format",
         '{{.Names}} {{.Label "io.imagegate.pid"}}'],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return {(f := [*line.split(), ""])[0]: f[1] for line in out.splitlines() if line.strip()}


def test_interrupted_runs_leave_no_container(images: dict[str, str], tmp_path: Path) -> None:
    rng = random.Random(20261130)
    # Counted from the moment the CLI says it starts the stages: the engine's create call, the
    # attach and the start all fall inside this window.
    delays = [rng.uniform(0.0, 0.4) for _ in range(RUNS)]

    def one(i: int) -> tuple[int, int, str]:
        code, lines, pid = _interrupted(
            images, tmp_path / str(i), " stages in ", [signal.SIGINT], delay=delays[i], verbose=()
        )
        return pid, code, "\n".join(lines)

    before = _imagegate_containers()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(RUNS)))
    pids = {str(pid) for pid, _, _ in results}
    time.sleep(1)  # an engine still finishing a removal it was asked for
    left = [n for n, pid in _imagegate_containers().items() if n not in before and pid in (*pids, "")]
    try:
        assert left == [], f"{len(left)} of {RUNS} interrupted runs left a container: {left}"
    finally:
        for name in left:
            subprocess.run(["docker", "-H", DOCKER_SOCK, "rm", "-f", name], capture_output=True)
    interrupted = [err for _, code, err in results if code == 130]
    # Most runs were cut while their container was being made or run: the race was exercised.
    assert len(interrupted) >= RUNS * 3 // 4, [code for _, code, _ in results]
    for _, code, err in results:
        assert code in (0, 130), err
        assert "Traceback" not in err, err
    for err in interrupted:
        assert "may be left" not in err, err


def _interrupted(
    images: dict[str, str],
    out: Path,
    marker: str,
    signals: list[int],
    *,
    flags: tuple[str, ...] = (),
    delay: float = 0.0,
    verbose: tuple[str, ...] = ("-vv",),
) -> tuple[int, list[str], int]:
    """`imagegate run` of the python image, sent `signals` 20 ms apart, `delay` after a stderr
    line holds `marker` (the phase began): its exit code, its stderr lines, its PID."""
    p = subprocess.Popen(
        [sys.executable, *flags, "-m", "imagegate", "run", images["python"], "-p", "python", "--no-sign",
         *verbose, "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals,
    )  # fmt: skip
    try:
        assert p.stderr is not None
        head = []
        for line in p.stderr:
            head.append(line)
            if marker in line:
                break
        assert marker in head[-1], "".join(head[-20:])
        time.sleep(delay)
        for n, sig in enumerate(signals):
            if n:
                time.sleep(0.02)
            p.send_signal(sig)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, [*"".join(head).splitlines(), *err.splitlines()], p.pid


def _assert_ended_cleanly(code: int, lines: list[str], pid: int, expected: int) -> None:
    text = "\n".join(lines)
    assert code == expected, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    said = [line for line in lines if line.startswith("imagegate: interrupted")]
    own = [line for line in lines if not line.startswith("import time:")]  # -X importtime's
    assert len(said) == 1 and own[-1] == said[0], text[-3000:]
    time.sleep(1)  # an engine still finishing a removal it was asked for
    left = [name for name, label in _imagegate_containers().items() if label == str(pid)]
    for name in left:
        subprocess.run(["docker", "-H", DOCKER_SOCK, "rm", "-f", name], capture_output=True)
    assert left == [], f"left behind: {left}"


@pytest.mark.parametrize("attempt", range(5))
def test_two_sigints_while_the_container_is_created_leave_nothing(
    images: dict[str, str], tmp_path: Path, attempt: int
) -> None:
    code, lines, pid = _interrupted(images, tmp_path, "creating container", [signal.SIGINT, signal.SIGINT])
    _assert_ended_cleanly(code, lines, pid, 130)


def test_two_sigterms_inside_a_stage_end_with_143(images: dict[str, str], tmp_path: Path) -> None:
    code, lines, pid = _interrupted(images, tmp_path, "bundle sent", [signal.SIGTERM, signal.SIGTERM])
    _assert_ended_cleanly(code, lines, pid, 143)


@pytest.mark.parametrize(("sig", "expected"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_still_importing_ends_with_its_code(
    images: dict[str, str], tmp_path: Path, sig: int, expected: int
) -> None:
    # -X importtime writes a line as each import ends: once typer's is out, the command's own
    # modules (the pipeline models, the drivers) are still being imported.
    code, lines, pid = _interrupted(images, tmp_path, "| typer", [sig, sig], flags=("-X", "importtime"))
    _assert_ended_cleanly(code, lines, pid, expected)
    assert not any("stages in" in line for line in lines)  # stopped before any work began
