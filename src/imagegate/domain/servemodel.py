"""The model a serve stage gives its server: a host path (--model PATH) checked before anything
runs, and where the sandbox sees it. Engines and the rootfs sandbox bind it read-only at one
fixed path under the sandbox's /tmp (the image's root stays read-only, and a bind needs a folder
to land on); --here uses it where it is."""

from __future__ import annotations

import os
from pathlib import Path

from imagegate.errors import UsageError

IN_SANDBOX = "/tmp/imagegate-model"


def check(path: str) -> Path:
    """The absolute host path of --model, or a UsageError (exit 3) naming it and what is wrong,
    before any sandbox or server starts."""
    p = Path(os.path.abspath(path))
    if not p.exists():
        raise UsageError(
            f"--model {path}: no such file or folder", hint="give the folder holding the model's weights"
        )
    if not os.access(p, os.R_OK) or (p.is_dir() and not os.access(p, os.X_OK)):
        raise UsageError(
            f"--model {path}: not readable by this user", hint="make it readable, e.g. chmod -R a+rX"
        )
    if not (p.is_dir() or p.is_file()):
        raise UsageError(f"--model {path}: not a file or folder", hint="give the folder holding the model")
    return p


def in_sandbox(host: Path, here: bool) -> str:
    """Where the server finds the model: its own path with --here, the bind's target elsewhere."""
    return str(host) if here else IN_SANDBOX
