"""One stage in its own process: read the stage (JSON the controller wrote), run the probe,
write its result JSON to the path given."""

from __future__ import annotations

import importlib
import json
import sys
import traceback


def main(argv) -> int:
    stage_path, result_path = argv[1], argv[2]
    with open(stage_path) as f:
        stage = json.load(f)
    try:
        probe = _probe(stage["probe"])
        result = probe.run(stage.get("params", {}))
    except Exception as e:  # a probe bug is an ERROR of the stage, with the traceback as evidence
        result = {
            "status": "ERROR",
            "detail": f"probe raised {type(e).__name__}: {str(e)[:300]}",
            "data": {"traceback": traceback.format_exc()},
        }
    with open(result_path, "w") as f:
        json.dump(result, f)
    return 0


def _probe(name):
    """The probe's module, by its name: the runner's registry (src/imagegate/pipeline/probes.py)
    decides which names a plan may hold and the bundle ships exactly their modules, so a new probe
    adds nothing here. One identifier names one module of this package, nothing else."""
    if not name.isidentifier() or name.startswith("_"):
        raise ValueError(f"unknown in-image probe {name!r}")
    try:
        mod = importlib.import_module("." + name, __package__)
    except ModuleNotFoundError as e:
        if e.name != f"{__package__}.{name}":
            raise  # the probe's own import failed: its ERROR, with the traceback
        raise ValueError(f"unknown in-image probe {name!r}") from None
    if not callable(getattr(mod, "run", None)):
        raise ValueError(f"unknown in-image probe {name!r}")
    return mod


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
