"""A ConfigMap update in the middle of a controller run (seeds README, point 9).

The bundle is projected into a folder exactly as the kubelet projects a ConfigMap volume
(tests/kube/atomic_writer.py), a real controller run starts from the stable mount path, and while
its first stage is running the ConfigMap is updated: a new timestamped folder, `..data` swapped
by renaming `..data_tmp` over it, the old folder deleted. The later stages must still run.

The controller reads its bundle once, at start, and every stage runs from a private copy of
it: so the run survives the update even with a controller that resolves its own path
(`realpath`, `Path.resolve()`), the regression that once broke stage 2 here. The stable
`abspath` is still what the controller records and starts from."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from imagegate.domain import probes_bundle as bundle
from imagegate.domain import protocol
from imagegate.usecases import runner
from tests.kube.atomic_writer import DATA_DIR, AtomicWriter

STABLE = "return os.path.abspath(sys.argv[0])"
VARIANTS = {
    "abspath (as shipped)": STABLE,
    "os.path.realpath": "return os.path.realpath(sys.argv[0])",
    "Path.resolve()": "import pathlib; return str(pathlib.Path(sys.argv[0]).resolve())",
}

# Stage 1 holds the run until the test has swapped the ConfigMap: it says it started, then waits
# for the go file. Stage 2 starts only afterwards: a fresh `python BUNDLE stage ...` process.
HOLD = (
    "import os, sys, time\n"
    "open(sys.argv[1], 'w').close()\n"
    "t = time.time()\n"
    "while not os.path.exists(sys.argv[2]) and time.time() - t < 60:\n"
    "    time.sleep(0.05)\n"
    "print('released')\n"
)


def _pipeline(tmp: Path) -> Path:
    started, go = tmp / "started", tmp / "go"
    path = tmp / "swap.yaml"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "imagegate/v1",
                "kind": "Pipeline",
                "name": "swap",
                "stages": [
                    {
                        "id": "hold",
                        "probe": "cli",
                        "timeout": 90,
                        "with": {
                            "command": [sys.executable, "-c", HOLD, str(started), str(go)],
                            "stdout_regex": "released",
                        },
                    },
                    {"id": "after", "probe": "find_spec", "timeout": 60, "with": {"modules": ["json"]}},
                ],
            }
        )
    )
    return path


def _variant(data: bytes, body: str) -> bytes:
    """The bundle with `bundle_path()` of the controller replaced by `body`."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            content = src.read(info.filename)
            if info.filename == f"{bundle.PACKAGE}/controller.py":
                assert STABLE.encode() in content, (
                    "the controller no longer finds itself as this test expects"
                )
                content = content.replace(STABLE.encode(), body.encode())
            dst.writestr(info, content)
    return out.getvalue()


def run_with_swap(tmp: Path, body: str) -> tuple[dict[str, dict[str, object]], dict[str, object]]:
    """Controller run from the mount path, with a ConfigMap update while stage 1 runs.
    Returns the stage events by id, and what the swap did."""
    prep = runner.prepare(runner.RunOptions(pipeline=str(_pipeline(tmp))))
    first = _variant(prep.bundle.data, body)
    # The update carries a new revision of the bundle: the kubelet writes nothing for equal data.
    revised = dict(prep.inside.to_json(), revision=2)
    second = _variant(bundle.build(revised).data, body)
    mount = tmp / "mount"
    mount.mkdir()
    writer = AtomicWriter(mount)
    assert writer.write({"imagegate.pyz": first})
    old_folder = mount / os.readlink(mount / DATA_DIR)
    entry = mount / "imagegate.pyz"
    assert entry.is_symlink() and os.readlink(entry) == f"{DATA_DIR}/imagegate.pyz"

    key = protocol.new_key()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", str(entry)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp,
        env={**os.environ, "IMAGEGATE_EVENT_KEY": key.hex()},
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp / "started").exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "stage 1 never started"
            time.sleep(0.05)
        assert writer.write({"imagegate.pyz": second})  # the update, mid-run
        swap = {
            "old_folder_gone": not old_folder.exists(),
            "data_now": os.readlink(mount / DATA_DIR),
            "old_folder": old_folder.name,
        }
        (tmp / "go").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events = protocol.read_all(key, ["hold", "after"], out)
    assert events.end is not None and not events.violations, err.decode()
    return events.stages, swap


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_configmap_update_mid_run(tmp_path: Path, variant: str) -> None:
    stages, swap = run_with_swap(tmp_path, VARIANTS[variant])
    # The swap happened as the kubelet does it: a new ..data target, the old folder deleted.
    assert swap["old_folder_gone"] is True
    assert str(swap["data_now"]).startswith("..") and swap["data_now"] != swap["old_folder"]
    assert stages["hold"]["status"] == "PASS", stages["hold"]
    assert stages["after"]["status"] == "PASS", stages["after"]


def test_writer_reproduces_the_kubelet_layout(tmp_path: Path) -> None:
    writer = AtomicWriter(tmp_path)
    assert writer.write({"imagegate.pyz": b"one"})
    assert not writer.write({"imagegate.pyz": b"one"})  # equal content: no write at all
    first = os.readlink(tmp_path / DATA_DIR)
    assert first.startswith("..") and "/" not in first  # relative, in the same folder
    assert writer.write({"imagegate.pyz": b"two"})
    second = os.readlink(tmp_path / DATA_DIR)
    assert second != first and not (tmp_path / first).exists()
    assert not (tmp_path / "..data_tmp").exists()
    assert (tmp_path / "imagegate.pyz").read_bytes() == b"two"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([DATA_DIR, second, "imagegate.pyz"])
