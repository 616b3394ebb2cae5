"""The local driver (`run --here`): the bundle runs with this environment's interpreter (or
--python PATH). It is what runs inside a Pod, and on any machine or virtual environment."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from imagegate.drivers.interface import BundleRun, OnOutput, Refusal
from imagegate.drivers.process import run_group
from imagegate.errors import UsageError
from imagegate.gpus import HIDING_ENV, GpuRequest
from imagegate.model import ImageFacts
from imagegate.oci.sources.interface import Source
from imagegate.oci.verify import VerifyReport

KEY_FD_ENV = "IMAGEGATE_EVENT_KEY_FD"  # probes/controller.py reads the key from this descriptor


class LocalDriver:
    name = "local"
    # Controllers here share a user and a process table: one at a time, so that no stage's code
    # runs beside another controller's stages.
    isolated_runs = False
    has_image = False  # this environment is under test, whatever image it may be in

    def __init__(self, python: str | None = None, gpus: GpuRequest | None = None) -> None:
        self.python = python
        self.gpus = gpus
        self._fingerprint: dict[str, Any] | None = None

    def gpu_env(self) -> dict[str, str]:
        """This host's GPUs are hidden from the probes unless --gpus asks for them."""
        env = {k: v for k, v in os.environ.items() if k not in HIDING_ENV or v not in ("", "void", "none")}
        if self.gpus is None:
            return {**env, **HIDING_ENV}
        if (cvd := self.gpus.cuda_visible_devices) is not None:
            env["CUDA_VISIBLE_DEVICES"] = cvd
        return env

    def _interpreter(self, interpreters: Sequence[str]) -> tuple[str | None, list[str]]:
        # "This environment" is the python a user would type here: an activated venv's, else the
        # PATH's; imagegate's own interpreter only as the last resort.
        candidates = [self.python] if self.python else [*interpreters, sys.executable]
        tried: list[str] = []
        for cand in candidates:
            tried.append(cand)
            exe = cand if os.path.sep in cand and os.access(cand, os.X_OK) else shutil.which(cand)
            if exe:
                return exe, tried
        return None, tried

    def fingerprint(self) -> dict[str, Any] | None:
        """This environment's identity for `imagegate complete --here`: the interpreter and its
        installed distributions as the probes see them; the sha256 of that is compared."""
        if self._fingerprint is None:
            exe, _ = self._interpreter(DEFAULT_INTERPRETERS)
            self._fingerprint = environment_fingerprint(exe, self.gpu_env()) if exe else {}
        return self._fingerprint or None

    def environment(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint(),
            "driver": self.name,
            "engine": None,
            "host": platform.node(),
            "os": platform.system().lower(),
            "arch": platform.machine(),
            "gpus_requested": self.gpus.spec if self.gpus else None,
        }

    def resolve(self, reference: str) -> ImageFacts:
        # No image: the environment itself is under test. The reference (e.g. the Pod's image)
        # is recorded as given; its digest comes from elsewhere (pod collect, --expect-config).
        return ImageFacts(reference=reference, config_digest=None)

    def verified_report(self, image: ImageFacts) -> VerifyReport | None:
        return None  # the layers stage reads the image itself

    def refusal(self, image: ImageFacts) -> Refusal | None:
        return None  # no image of its own: nothing to refuse

    def left_behind(self) -> str | None:
        return None  # the probes' processes end with their run

    def image_source(self, image: ImageFacts, timeout: float | None) -> Source | None:
        return None  # no image here: this environment is under test

    def run_bundle(
        self,
        image: ImageFacts,
        bundle: bytes,
        bundle_sha256: str,
        interpreters: list[str],
        deadline_s: float,
        event_key: bytes,
        on_stdout: OnOutput | None = None,
        stages: Sequence[str] | None = None,
        cancel: threading.Event | None = None,
    ) -> BundleRun:
        exe, tried = self._interpreter(interpreters)
        if not exe:
            if self.python:
                raise UsageError(
                    f"--python {self.python}: not an executable", hint="give a python interpreter"
                )
            return BundleRun(
                b"", b"", None, tried=tried, error=f"no python interpreter (tried {', '.join(tried)})"
            )
        with tempfile.TemporaryDirectory(prefix="imagegate-local-") as tmp:
            path = Path(tmp) / "imagegate.pyz"
            path.write_bytes(bundle)
            # The key through a pipe the controller alone inherits; -I -S: the controller never
            # runs this environment's site hooks (.pth files, sitecustomize, PYTHONPATH).
            key_r, key_w = os.pipe()
            try:
                os.write(key_w, event_key.hex().encode() + b"\n")
            finally:
                os.close(key_w)
            try:
                return _run(
                    [exe, "-I", "-S", str(path)],
                    deadline_s,
                    interpreter=exe,
                    tried=tried,
                    env={
                        **self.gpu_env(),
                        KEY_FD_ENV: str(key_r),
                        "IMAGEGATE_STAGES": ",".join(stages or ()),
                    },
                    on_stdout=on_stdout,
                    pass_fds=(key_r,),
                    cancel=cancel,
                )
            finally:
                os.close(key_r)


DEFAULT_INTERPRETERS = ("python3", "python")
_FINGERPRINT_CODE = (
    "import json,sys\n"
    "import importlib.metadata as m\n"
    "d=sorted({(str(x.metadata['Name'] or '').lower().replace('_','-').replace('.','-'),x.version)"
    " for x in m.distributions()})\n"
    "print(json.dumps({'python':sys.version,'executable':sys.executable,"
    "'distributions':['%s==%s'%p for p in d]}))\n"
)


def environment_fingerprint(exe: str, env: dict[str, str]) -> dict[str, Any]:
    """sha256 over the interpreter's version, path and every distribution it can import (name
    and version), as canonical JSON; {} when the interpreter cannot say."""
    try:
        done = subprocess.run(
            [exe, "-c", _FINGERPRINT_CODE], env=env, capture_output=True, timeout=120, check=False
        )
        facts = json.loads(done.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return {}
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return {
        "sha256": digest,
        "python": str(facts.get("python", "")).split()[0],
        "executable": facts.get("executable"),
        "distributions": len(facts.get("distributions") or []),
    }


def _run(
    argv: list[str],
    deadline_s: float,
    *,
    interpreter: str,
    tried: list[str],
    env: dict[str, str],
    on_stdout: OnOutput | None = None,
    pass_fds: tuple[int, ...] = (),
    cancel: threading.Event | None = None,
) -> BundleRun:
    done = run_group(
        argv, deadline_s=deadline_s, env=env, pass_fds=pass_fds, on_stdout=on_stdout, cancel=cancel
    )
    return BundleRun(
        done.stdout,
        done.stderr,
        done.exit_code,
        timed_out=done.timed_out,
        interpreter=interpreter,
        tried=tried,
        stdout_total=done.stdout_total,
        stderr_total=done.stderr_total,
        error="overall deadline reached; process group killed" if done.timed_out else None,
        facts={"wall_s": done.wall_s},
    )
