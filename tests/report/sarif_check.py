"""SARIF validated by an independent validator: Microsoft's SARIF Multitool (`validate`: the SARIF
2.1.0 JSON schema, then the SARIF SDK's rules), from the npm registry (tests/npm_tools.py)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

from tests.npm_tools import node_modules

HERE = Path(__file__).parent
LINUX = "@microsoft/sarif-multitool-linux"


def problems(sarif: str, workdir: Path) -> list[dict[str, Any]]:
    """The validator's results of level error for `sarif` (none: it is valid SARIF 2.1.0)."""
    modules = node_modules(HERE / "sarif_tool" / "package.json", "IMAGEGATE_SARIF_TOOL", "sarif-tool", LINUX)
    tool = modules / LINUX / "Sarif.Multitool"
    if not os.access(tool, os.X_OK):
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "report.sarif").write_text(sarif)
    out = workdir / "validation.sarif"
    out.unlink(missing_ok=True)
    p = subprocess.run(
        [str(tool), "validate", str(workdir / "report.sarif"), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DOTNET_SYSTEM_GLOBALIZATION_INVARIANT": "1"},
    )
    assert p.returncode == 0 and out.is_file(), p.stdout + p.stderr
    results = json.loads(out.read_text())["runs"][0].get("results") or []
    return [r for r in results if r.get("level", "warning") == "error"]
