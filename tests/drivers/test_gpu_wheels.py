"""The wheel list a GPU machine without network gets (scripts/gpu-wheels.py): derived from package
metadata, and enough. The GPU acceptance's commands (keygen, run --driver rootfs of an oci: layout,
complete --driver rootfs, verify) run here with every installed distribution outside the list
made unimportable: a module the list lacks fails the command, as it would on that machine."""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.helpers import load_script
from tests.oci.infra import skopeo
from tests.run.test_gpu import GPU_PIPELINE

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-wheels.py"
# The CLI with a finder in front that refuses the blocked top-level modules.
BOOT = """
import importlib.abc, sys
blocked = set(sys.argv[1].split(","))
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError("not on the GPU machine: " + name, name=name)
        return None
sys.meta_path.insert(0, Refuse())
sys.argv = ["imagegate", *sys.argv[2:]]
from imagegate.cli import main
sys.exit(main())
"""


def wheels() -> ModuleType:
    return load_script(SCRIPT)


def test_the_list_is_imagegates_requirements_closed_and_pinned() -> None:
    gw = wheels()
    pins = gw.closure()
    # The layer decompressors the rootfs driver needs, which the hand-written list lacked.
    assert {"isal", "zstandard", "cryptography", "pydantic", "pydantic-core", "typer", "pyyaml"} <= set(pins)
    assert not set(pins) & set(gw.NOT_IMPORTED)
    for name, version in pins.items():
        assert md.distribution(name).version == version
        for req in gw._requirements(md.distribution(name)):  # closed: what each one requires is in it
            assert gw.norm(req) in pins or not _installed(req), (name, req)


def _installed(name: str) -> bool:
    try:
        md.distribution(name)
    except md.PackageNotFoundError:
        return False
    return True


def _blocked(allowed: set[str]) -> list[str]:
    """Top-level modules of installed distributions outside `allowed` (the standard library aside)."""
    gw = wheels()
    out = []
    for module, dists in md.packages_distributions().items():
        if module in sys.stdlib_module_names or module.startswith("_"):
            continue
        if not any(gw.norm(d) in allowed for d in dists):
            out.append(module)
    return sorted(out)


def test_the_gpu_acceptances_commands_run_with_nothing_else(
    pushed_vllm: str, root_cache: dict[str, str], tmp_path: Path
) -> None:
    gw = wheels()
    blocked = _blocked({*gw.closure(), "imagegate"})
    assert "docker" in blocked and "httpx" in blocked and "isal" not in blocked
    layout = tmp_path / "layout"
    skopeo("copy", "-q", "--src-tls-verify=false", f"docker://{pushed_vllm}", f"oci:{layout}:0.11")
    (tmp_path / "deferred.yaml").write_text(GPU_PIPELINE.format(python="python3"))
    runs = tmp_path / "runs"

    def ig(*args: str) -> subprocess.CompletedProcess[str]:
        env = {**root_cache, "IMAGEGATE_SIGNING_KEY": str(tmp_path / "k.key"), "PATH": "/usr/bin:/bin"}
        argv = [sys.executable, "-c", BOOT, ",".join(blocked), *args]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
        assert "ModuleNotFoundError" not in done.stderr and "not on the GPU machine" not in done.stderr, (
            done.stderr
        )
        return done

    assert ig("keygen", "--out", str(tmp_path / "k")).returncode == 0
    ran = ig(
        "run",
        f"oci:{layout}:0.11",
        "--driver",
        "rootfs",
        "-p",
        str(tmp_path / "deferred.yaml"),
        "-o",
        str(runs),
    )
    assert ran.returncode == 0, ran.stderr
    (first,) = runs.glob("*/*/")
    done = ig("complete", str(first), "--driver", "rootfs")
    assert done.returncode == 0, done.stderr
    second = next(p for p in runs.glob("*/*/") if p != first)
    checked = ig("verify", str(second / "attestation.dsse.json"), "--key", str(tmp_path / "k.pub"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
