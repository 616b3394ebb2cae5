"""The bundle: one zipapp file = the in-image controller + probes + the plan (plan.json).

Built deterministically (fixed timestamps, sorted members) so the same plan gives the same
sha256, which the evidence records."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from typing import Any

from imagegate import resources

PACKAGE = "_imagegate_probe"  # unlikely to shadow anything an image tests with find_spec
_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Bundle:
    data: bytes
    sha256: str


def build(plan: dict[str, Any]) -> Bundle:
    src = resources.probes_dir()
    members: dict[str, bytes] = {"__main__.py": (src / "__main__.py").read_bytes()}
    for path in sorted(src.glob("*.py")):
        if path.name != "__main__.py":
            members[f"{PACKAGE}/{path.name}"] = path.read_bytes()
    members["plan.json"] = json.dumps(plan, sort_keys=True, indent=1).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, members[name])
    data = buf.getvalue()
    return Bundle(data, hashlib.sha256(data).hexdigest())
