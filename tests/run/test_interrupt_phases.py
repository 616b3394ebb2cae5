"""A signal or the deadline ends a run within 2 s in every phase of reading a multi-GB image: the
engine's export (before its first byte and while it streams), the hashing of its layers, a
registry's blobs. Before, the interrupt waited for the export and the hashing to finish (over a
minute on a 10 GB image): the layers stage's thread had nothing to stop it.

The image is `big` (tests/images/build.py): three 1 GiB layers of random bytes, so that each
phase lasts seconds on any machine. Each signal is sent when the run's log (-vv) says the phase
began, and the time counted is from the signal to the process's exit."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import DOCKER_SOCK, default_signals
from tests.oci.infra import Registry, skopeo, start_registry

# Not marked `signals`: CI runs those again with SIGINT ignored to test the handlers'
# dispositions (tests/run/test_interrupt.py does); what is tested here is how soon each phase ends.
EXIT_WITHIN_S = 2.0  # the promise: a signal ends the command within 2 s, at real sizes
GRACE_S = 2.0  # imagegate._support.deadline.GRACE_S: after the deadline, before its hard stop

# The layers stage alone, so that what is timed is the reading, not a container's removal
# (tests/run/test_interrupt.py covers those); it runs in the runner's background thread as
# beside any in-image stage.
LAYERS_ONLY = """\
apiVersion: imagegate/v1
kind: Pipeline
name: layers-only
stages:
  - id: layers
    probe: layers
    timeout: 30m
"""

EXPORT_ASKED = "asking the engine"  # imagegate.oci.sources.daemon: the export request is sent
EXPORT_BEGAN = "export began"  # its first byte arrived: the layers are being hashed
UNPACKING = ": unpacking layer "  # imagegate.rootfs.unpack: a blob is read, verified and unpacked


@dataclass
class Ended:
    code: int
    after_signal_s: float  # from the signal to the exit
    after_start_s: float  # from the start to the exit
    lines: list[str]
    pid: int
    tmp: Path  # its TMPDIR
    slowdown: float = 1.0  # how much slower than its CPU time a process ran here just then
    export_began_s: float | None = None  # from the start to its log's EXPORT_BEGAN line


def _slowdown() -> float:
    """How much this machine's load stretches a process's wall time just now: the wall time of
    starting python and importing imagegate's CLI over the CPU time it took (1.0 on an idle
    machine). A promise of seconds holds on a machine that gives the process the CPU; under
    load, each of its steps waits as long for it, and the bound stretches alike."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import imagegate.cli._app"], check=True, capture_output=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return max(1.0, wall / max(cpu, 0.05))


def _run(argv: list[str], marker: str | None, sig: int | None, tmp: Path, *, delay: float = 0.5) -> Ended:
    """`imagegate ARGV -vv` with a TMPDIR of its own; `sig` sent `delay` s after a stderr line
    holds `marker`."""
    (tmp / "tmpdir").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, COLUMNS="200", TMPDIR=str(tmp / "tmpdir"))

    start = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, "-m", "imagegate", *argv, "-vv"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals,
        env=env,
    )  # fmt: skip
    lines: list[str] = []
    seen = threading.Event()
    began: list[float] = []

    def read() -> None:
        assert p.stderr is not None
        for line in p.stderr:
            lines.append(line.rstrip("\n"))
            if EXPORT_BEGAN in line and not began:
                began.append(time.monotonic() - start)
            if marker is not None and marker in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    sent = start
    try:
        if marker is not None:
            assert seen.wait(300), "\n".join(lines[-30:])
            time.sleep(delay)
            assert p.poll() is None, "ended before the signal:\n" + "\n".join(lines[-30:])
            sent = time.monotonic()
            assert sig is not None
            p.send_signal(sig)
        p.wait(timeout=600)
        ended = time.monotonic()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    reader.join(10)
    return Ended(
        p.returncode, ended - sent, ended - start, lines, p.pid, tmp / "tmpdir", _slowdown(),
        began[0] if began else None,
    )  # fmt: skip


def _left_by(pid: int) -> list[str]:
    out = subprocess.run(
        ["docker", "-H", DOCKER_SOCK, "ps", "-a", "--filter", f"label=io.imagegate.pid={pid}", "-q"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return out.split()


@pytest.fixture(scope="module")
def big(images: dict[str, str]) -> str:
    return images["big"]


@pytest.fixture(scope="module")
def big_in_registry(big: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The image in a registry on 127.0.0.1, its layers as the engine exports them (a compressed
    copy would shrink nothing: random bytes)."""
    storage = tmp_path_factory.mktemp("big-registry")
    reg: Registry = start_registry(storage)
    try:
        ref = f"{reg.host}/big:1"
        skopeo("copy", "--quiet", "--dest-tls-verify=false", f"docker-daemon:{big}", f"docker://{ref}")
        yield ref
    finally:
        reg.stop()
        shutil.rmtree(storage, ignore_errors=True)  # 3 GiB: not kept to the end of the session


@pytest.fixture
def layers_only(tmp_path: Path) -> Path:
    path = tmp_path / "layers-only.yaml"
    path.write_text(LAYERS_ONLY)
    return path


def _assert_quick(ended: Ended, code: int, what: str) -> None:
    """The exit code, within EXIT_WITHIN_S of the signal, and nothing left: no container of the
    run, no temporary file, no "may be left" in what it said."""
    text = "\n".join(ended.lines[-40:])
    assert ended.code == code, text
    assert "Traceback" not in text and "may be left" not in text, text
    assert ended.after_signal_s <= EXIT_WITHIN_S * ended.slowdown, (
        f"{what}: exit {ended.after_signal_s:.1f} s after the signal (load stretches time "
        f"{ended.slowdown:.1f}x here now)\n{text}"
    )
    assert _left_by(ended.pid) == []
    assert list(ended.tmp.iterdir()) == []


@pytest.mark.parametrize(
    ("marker", "sig", "code"),
    [
        (EXPORT_ASKED, signal.SIGINT, 130),  # the engine prepares the export: no byte yet
        (EXPORT_BEGAN, signal.SIGINT, 130),  # the export streams; its layers are hashed
        (EXPORT_BEGAN, signal.SIGTERM, 143),
    ],
    ids=["export-sigint", "hashing-sigint", "hashing-sigterm"],
)
def test_a_signal_while_the_engine_exports_ends_the_run_at_once(
    big: str, layers_only: Path, tmp_path: Path, marker: str, sig: int, code: int
) -> None:
    argv = ["run", big, "-p", str(layers_only), "--no-sign", "-o", str(tmp_path / "runs")]
    ended = _run(argv, marker, sig, tmp_path, delay=0.2 if marker == EXPORT_ASKED else 1.0)
    _assert_quick(ended, code, marker)


def test_a_signal_while_registry_blobs_are_read_and_unpacked_ends_the_run_at_once(
    big_in_registry: str, layers_only: Path, tmp_path: Path
) -> None:
    """--driver rootfs reads the registry's blobs, verifying and unpacking each in one pass: a
    signal then leaves no half-unpacked root in the cache, nor a root taken for complete."""
    cache = tmp_path / "cache"
    argv = ["run", f"docker://{big_in_registry}", "-p", str(layers_only), "--driver", "rootfs",
            "--cache-dir", str(cache), "--no-sign", "-o", str(tmp_path / "runs")]  # fmt: skip
    ended = _run(argv, UNPACKING, signal.SIGINT, tmp_path, delay=1.0)
    _assert_quick(ended, 130, "registry read and unpacking")
    left = [p for p in cache.rglob("*") if p.is_dir() and p.parent.name in ("work", "roots")]
    assert left == [], left


def _strike_at(probe: Ended) -> int:
    """A deadline a third of the way into `probe`'s hashing, the export flowing."""
    assert probe.export_began_s is not None, "\n".join(probe.lines[-30:])
    flow = probe.after_start_s - probe.export_began_s
    return max(2, round(probe.export_began_s + max(1.0, flow / 3)))


def test_the_deadline_ends_a_run_while_the_export_is_read(
    big: str, layers_only: Path, tmp_path: Path
) -> None:
    """A run the deadline strikes, waiting for the export or hashing it, ends by the deadline plus
    GRACE_S plus 2 s with exit 2, never a verdict; and one struck while the export flows (where
    no reader waits long enough for its own timeout to see the deadline) is among them. How long
    the engine prepares the export depends on the machine and its load: the deadline is put a
    third of the way into the last run's hashing, later when it struck before the first byte,
    sooner when the run beat it."""
    probe = _run(
        ["run", big, "-p", str(layers_only), "--no-sign", "-o", str(tmp_path / "a")], None, None, tmp_path
    )
    assert probe.code == 0, "\n".join(probe.lines[-30:])
    timeout = _strike_at(probe)
    for attempt in range(6):
        out = str(tmp_path / f"b{attempt}")
        argv = ["run", big, "-p", str(layers_only), "--no-sign", "-o", out, "--timeout", str(timeout)]
        ended = _run(argv, None, None, tmp_path)
        text = "\n".join(ended.lines[-30:])
        if ended.code == 0:
            # It beat the deadline by its own clock, which starts once python has started: never
            # a verdict later than that allows.
            assert ended.after_start_s < timeout + EXIT_WITHIN_S * ended.slowdown, (
                f"a verdict {ended.after_start_s:.1f} s into a {timeout} s deadline, the export "
                f"begun after {ended.export_began_s} s\n{text}"
            )
            timeout = min(timeout - 1, _strike_at(ended))  # strike sooner
            continue
        assert ended.code == 2, text
        assert ended.after_start_s <= timeout + GRACE_S + EXIT_WITHIN_S, (
            f"{ended.after_start_s:.1f} s\n{text}"
        )
        assert _left_by(ended.pid) == [] and list(ended.tmp.iterdir()) == []
        if ended.export_began_s is None or ended.export_began_s >= timeout:
            timeout += 3  # struck while the engine prepared: later, to strike while it sends
            continue
        # The stage's evidence says what ended it.
        (result,) = Path(out).glob("*/*/stages/*-layers/result.json")
        assert f"the {timeout} s deadline (--timeout) passed" in result.read_text(), text
        return
    pytest.fail(f"six runs never had the deadline strike while the export flowed, the last {timeout} s")


FAILING_AND_LAYERS = """\
apiVersion: imagegate/v1
kind: Pipeline
name: failing-and-layers
stages:
  - id: find_spec
    probe: find_spec
    timeout: 5m
    with:
      modules: [no_such_module_here]
  - id: layers
    probe: layers
    timeout: 30m
"""


def test_fail_fast_stops_the_layers_stage_once_the_verdict_is_known(big: str, tmp_path: Path) -> None:
    """The issue's run: the verdict (FAIL) known in seconds, the export read on for a minute.
    With --fail-fast the layers stage stops at once and says why; by default it runs to the end
    (every failure is listed: what CI users want)."""
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(FAILING_AND_LAYERS)
    out = tmp_path / "runs"
    base = ["run", big, "-p", str(pipeline), "--no-sign", "-o", str(out)]
    fast = _run([*base, "--fail-fast"], None, None, tmp_path / "fast")
    full = _run(base, None, None, tmp_path / "full")
    assert fast.code == 1 and full.code == 1, "\n".join(fast.lines[-20:] + full.lines[-20:])
    statements = sorted(out.glob("*/*/statement.json"), key=lambda p: p.stat().st_mtime)
    fast_stages, full_stages = ({s["id"]: s for s in _stages(p)} for p in statements)
    assert fast_stages["find_spec"]["status"] == "FAIL" == full_stages["find_spec"]["status"]
    assert fast_stages["layers"]["status"] == "SKIPPED"
    assert fast_stages["layers"]["detail"].startswith("stopped by --fail-fast: find_spec FAIL")
    assert full_stages["layers"]["status"] == "PASS"
    assert any("--fail-fast: find_spec FAIL: stopping" in line for line in fast.lines)
    assert fast.after_start_s < full.after_start_s
    assert _left_by(fast.pid) == [] and list(fast.tmp.iterdir()) == []


def _stages(statement: Path) -> list[dict[str, str]]:
    import json

    doc = json.loads(statement.read_text())
    stages: list[dict[str, str]] = doc["predicate"]["stages"]
    return stages
