"""The deadline and cancel of the drivers that run the bundle as a local process group: the local
driver (`run --here`) and the rootfs driver (bubblewrap). A run cut by either stops in time, says
why, keeps what was printed before, and leaves no process of the bundle's behind; so does a
bundle that exits while something it started still runs."""

from __future__ import annotations

import hashlib
import secrets
import sys
import threading
import time
import uuid
from collections.abc import Callable

import pytest

from imagegate.drivers.interface import BundleRequest, BundleRun, Driver
from imagegate.drivers.local import LocalDriver
from imagegate.drivers.rootfs import PreparedRoot, RootfsDriver
from tests.drivers.test_sandbox import alive_with

# The bundle: plain Python source (the interpreter runs a file that is not a zip as a script).
# It starts a child in its own process group, says so, then sleeps (or exits at once).
BUNDLE = """\
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", {mark!r}])
print("child started", flush=True)
time.sleep({sleep})
"""

MakeDriver = Callable[[], Driver]


@pytest.fixture(params=["local", "rootfs"])
def make_driver(request: pytest.FixtureRequest) -> MakeDriver:
    if request.param == "local":
        return lambda: LocalDriver(sys.executable)
    exported: Callable[[str], PreparedRoot] = request.getfixturevalue("exported")
    root = exported("python")
    return lambda: RootfsDriver(lambda _ref: root)


def run(
    driver: Driver,
    mark: str,
    sleep: float,
    deadline_s: float,
    cancel: threading.Event | None = None,
    on_stdout: Callable[[bytes], None] | None = None,
) -> BundleRun:
    bundle = BUNDLE.format(mark=mark, sleep=sleep).encode()
    image = driver.resolve("imagegate-test/python")
    return driver.run_bundle(
        BundleRequest(
            image,
            bundle,
            hashlib.sha256(bundle).hexdigest(),
            ["python3"],
            deadline_s,
            secrets.token_bytes(32),
            on_stdout=on_stdout,
            cancel=cancel,
        )
    )


def gone(mark: str) -> bool:
    deadline = time.monotonic() + 10  # the kernel reaps a killed namespace at once; allow a little
    while alive_with(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive_with(mark)


def test_the_deadline_kills_the_bundle_and_what_it_started(make_driver: MakeDriver) -> None:
    # The deadline scaled from this machine's own start of the bundle, now: on a busy machine a
    # fixed few seconds can pass before the child is started, and the test would check nothing.
    t0 = time.monotonic()
    assert run(make_driver(), f"imagegate-mark-{uuid.uuid4().hex}", sleep=0, deadline_s=600).exit_code == 0
    deadline_s = 2 + 3 * (time.monotonic() - t0)
    mark = f"imagegate-mark-{uuid.uuid4().hex}"
    t0 = time.monotonic()
    done = run(make_driver(), mark, sleep=600, deadline_s=deadline_s)
    assert time.monotonic() - t0 < deadline_s + 30
    assert done.timed_out and done.exit_code is None
    assert done.error is not None and done.error.startswith("overall deadline reached;")
    assert b"child started" in done.stdout
    assert gone(mark)


def test_cancel_stops_the_bundle_and_what_it_started(make_driver: MakeDriver) -> None:
    mark = f"imagegate-mark-{uuid.uuid4().hex}"
    cancel = threading.Event()
    timer = threading.Timer(0.5, cancel.set)  # started once the bundle says its child runs

    def seen(data: bytes) -> None:
        if b"child started" in data and timer.ident is None:  # not started yet
            timer.start()

    t0 = time.monotonic()
    try:
        done = run(make_driver(), mark, sleep=600, deadline_s=600, cancel=cancel, on_stdout=seen)
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < 120
    assert done.timed_out and done.exit_code is None
    assert b"child started" in done.stdout
    assert gone(mark)


def test_a_bundle_that_exits_leaves_nothing_running(make_driver: MakeDriver) -> None:
    mark = f"imagegate-mark-{uuid.uuid4().hex}"
    done = run(make_driver(), mark, sleep=0, deadline_s=60)
    assert not done.timed_out and done.exit_code == 0, done.stderr
    assert gone(mark)
