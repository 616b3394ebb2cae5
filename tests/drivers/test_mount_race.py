"""The `--here` sandbox binds / with every mount under it, then remounts each read-only. A mount
that goes away in between (a container engine's overlay when a container stops) fails bwrap's
setup before the command runs, with `Can't bind mount /oldroot/ on /newroot/: Unable to apply
mount flags: remount …`; CI saw it fail a `run --here` beside the engine tests, and a shared
mount toggled in a loop makes it on this machine. The race itself depends on the machine's load,
so this test gives bwrap that failure at a known moment: a wrapper on PATH answers its first call
(of each step) with bwrap's own message, then runs the real bwrap. The runner's three uses of
bwrap (the host check, the environment's fingerprint, the probes' process) try again and succeed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from imagegate.drivers import bwrap, local

MESSAGE = (
    "bwrap: Can't bind mount /oldroot/ on /newroot/: Unable to apply mount flags: "
    'remount "/newroot/var/lib/docker/overlay2/0/merged": No such file or directory'
)
WRAPPER = """#!/bin/sh
# bwrap's setup failing once, as when a mount under / goes away while it binds it
if [ ! -e "{state}/failed" ]; then
  : > "{state}/failed"
  cat "{state}/message" >&2
  exit 1
fi
echo x >> "{state}/runs"
exec {real} "$@"
"""


@pytest.fixture
def flaky_bwrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    real = shutil.which("bwrap")
    assert real is not None, "bubblewrap is installed by .ci/run"
    bin_, state = tmp_path / "bin", tmp_path / "state"
    bin_.mkdir()
    state.mkdir()
    wrapper = bin_ / "bwrap"
    (state / "message").write_text(MESSAGE + "\n")
    wrapper.write_text(WRAPPER.format(state=state, real=real))
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(bwrap, "_checked", {})  # the host check runs, not its cached answer
    return state


def _fail_next(state: Path) -> None:
    (state / "failed").unlink()


def test_a_mount_that_vanishes_while_bwrap_binds_root_does_not_fail_the_run(flaky_bwrap: Path) -> None:
    assert bwrap.mount_raced(1, b"", MESSAGE.encode())
    iso = local.key_isolation(signing=False)
    assert iso.bwrap is not None, iso.reason  # the host check tried again
    env = {"PATH": os.environ["PATH"]}

    _fail_next(flaky_bwrap)
    done = local._run(iso.argv(["/bin/true"], env, gpus=False), 30.0, interpreter="true", tried=[], env=env)
    assert done.exit_code == 0, done.stderr

    _fail_next(flaky_bwrap)
    code = [os.path.realpath(shutil.which("python3") or "python3"), "-c", local._FINGERPRINT_CODE]
    fp = local.environment_fingerprint(iso.argv(code, env, gpus=False), env)
    assert fp.get("sha256"), fp
    # each step failed once and ran once more: three failures, three real runs
    assert len((flaky_bwrap / "runs").read_text().split()) == 3
