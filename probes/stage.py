"""One stage in its own process: read the stage (JSON the controller wrote), run the probe,
write its result JSON to the path given."""

from __future__ import annotations

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
    if name == "pip_check":
        from . import pip_check as mod
    elif name == "find_spec":
        from . import find_spec as mod
    elif name == "cli":
        from . import cli as mod
    elif name == "av_roundtrip":
        from . import av_roundtrip as mod
    elif name == "inventory":
        from . import inventory as mod
    elif name == "gpu_preflight":
        from . import gpu_preflight as mod
    elif name == "serve":
        from . import serve as mod
    else:
        raise ValueError(f"unknown in-image probe {name!r}")
    return mod


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
