"""A run names a container "left by a killed run" (and suggests `docker rm -f`) only when it is
sure: CI jobs in containers share one engine and one hostname, and their PIDs mean nothing in
another PID namespace. Containers are made with the real engine, labelled as other runs."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from imagegate.drivers.docker import run_labels
from tests.helpers import imagegate


def _absent_pid() -> int:
    with open("/proc/sys/kernel/pid_max") as f:
        pid = int(f.read()) - 7
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


def _create(engine: str, image: str, labels: dict[str, str]) -> str:
    flags = [x for k, v in labels.items() for x in ("--label", f"{k}={v}")]
    return subprocess.run(
        ["docker", "-H", engine, "create", *flags, "--label", "io.imagegate.test=leftovers", image, "true"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


def _name(engine: str, cid: str) -> str:
    return (
        subprocess.run(
            ["docker", "-H", engine, "inspect", "-f", "{{.Name}}", cid],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .lstrip("/")
    )


def test_only_a_dead_run_of_this_machine_is_called_a_leftover(
    engine: str, images: dict[str, str], tmp_path: Path
) -> None:
    ours = run_labels()  # this machine's boot, PID namespace and host, as a runner here writes them
    gone = str(_absent_pid())
    cases = {
        # Another CI job on the same engine, same hostname, its own PID namespace: its PID is
        # absent here, yet its run may be in flight.
        "other_namespace": {**ours, "io.imagegate.pid": gone, "io.imagegate.pidns": "4026500001"},
        # Another machine's boot (a host that shares the name and the engine).
        "other_boot": {**ours, "io.imagegate.pid": gone, "io.imagegate.boot": "0" * 8},
        # A live runner that is not this test's imagegate: this test's own process.
        "alive": {**ours},
        # Labels of a run that cannot be told apart (no start time, no namespace): the old labels.
        "old_labels": {"io.imagegate.run": "1", "io.imagegate.pid": gone, "io.imagegate.host": socket.gethostname()},
        # A run of this machine whose runner is gone: the one real leftover.
        "dead": {**ours, "io.imagegate.pid": gone},
        # The same PID alive again, but a later process: the runner is gone too.
        "pid_reused": {**ours, "io.imagegate.pid": "1", "io.imagegate.pid-start": "0"},
    }  # fmt: skip
    ids = {case: _create(engine, images["python"], labels) for case, labels in cases.items()}
    try:
        names = {case: _name(engine, cid) for case, cid in ids.items()}
        r = imagegate("run", images["python"], "-p", "python", "-o", str(tmp_path / "out"), "--no-sign")
        assert r.returncode == 0, r.stderr
        for case in ("other_namespace", "other_boot", "alive", "old_labels"):
            assert names[case] not in r.stderr, (case, r.stderr)
        for case in ("dead", "pid_reused"):
            assert f"container {names[case]} was left by an imagegate run that was killed" in r.stderr
            assert f"docker rm -f {names[case]}" in r.stderr
    finally:
        subprocess.run(["docker", "-H", engine, "rm", "-f", *ids.values()], capture_output=True)
