"""The bundle: one zipapp file = the in-image controller + probes + the plan (plan.json).

Which probes it holds is the probe registry's word (pipeline/probes.py): every inside probe's
module and its helpers, beside the controller's own modules. A module of the probes folder that
no one names, or one the registry names that is not there, stops the build: the registry and
the in-image side never diverge silently.

Built deterministically (fixed timestamps, sorted members) so the same plan gives the same
sha256, which the evidence records."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass

from imagegate._support import resources
from imagegate.errors import ImagegateError
from imagegate.pipeline.probes import PROBES, Probe

PACKAGE = "_imagegate_probe"  # unlikely to shadow anything an image tests with find_spec
_EPOCH = (1980, 1, 1, 0, 0, 0)
# The controller's own modules (probes/): in every bundle. __main__ is the zipapp's entry.
CONTROLLER = ("__main__", "__init__", "controller", "stage", "capture")


class RegistryMismatch(ImagegateError):
    """The probe registry and the probes folder disagree (an installation or development error)."""


@dataclass(frozen=True)
class Bundle:
    data: bytes
    sha256: str


def modules(registry: Mapping[str, Probe] = PROBES) -> tuple[str, ...]:
    """The in-image modules a bundle holds, by name: the controller's, then each inside probe's
    module and helpers in registry order. Raises RegistryMismatch when the probes folder has a
    module none of them names, or lacks one they name."""
    named = list(CONTROLLER)
    for probe in registry.values():
        if probe.side == "inside":
            named += [n for n in (probe.name, *probe.helpers) if n not in named]
    folder = resources.probes_dir()
    present = {path.stem for path in folder.glob("*.py")}
    missing = [f"{n}.py" for n in named if n not in present]
    unnamed = [f"{n}.py" for n in sorted(present - set(named))]
    if missing or unnamed:
        said = [f"missing from {folder}: {', '.join(missing)}"] if missing else []
        said += [f"in {folder} but no probe's module or helper: {', '.join(unnamed)}"] if unnamed else []
        raise RegistryMismatch(
            "the probe registry and the in-image probes disagree: " + "; ".join(said),
            hint="register each in-image probe in imagegate/pipeline/probes.py (its `helpers` too), "
            "with its module in probes/",
        )
    return tuple(named)


def build(plan: Mapping[str, object], registry: Mapping[str, Probe] = PROBES) -> Bundle:
    src = resources.probes_dir()
    members: dict[str, bytes] = {}
    for name in modules(registry):
        member = f"{name}.py" if name == "__main__" else f"{PACKAGE}/{name}.py"
        members[member] = (src / f"{name}.py").read_bytes()
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
