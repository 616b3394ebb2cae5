"""inventory: the installed distributions (name, version, location) of the image's python, read
with importlib.metadata so that no pip is needed. The vulnerability audit runs outside on this list."""

from __future__ import annotations

import re
import sys


def _text(dist, name):
    try:
        return (dist.read_text(name) or "").strip() or None
    except Exception:  # unreadable metadata files are recorded as missing, not fatal
        return None


def run(params: dict) -> dict:
    from importlib import metadata

    distributions, broken = [], []
    seen = set()
    # distributions() walks sys.path in order: the first copy of a name is the one imported, later
    # copies are shadowed but still on disk (and still audited).
    for dist in metadata.distributions():
        try:
            location = str(dist.locate_file(""))
        except Exception:
            location = None
        try:
            name = dist.metadata["Name"]
            version = dist.version
        except Exception as e:  # a damaged dist-info folder: say where it is, go on
            broken.append({"location": location, "error": "%s: %s" % (type(e).__name__, e)})
            continue
        if not name or not version:
            broken.append({"location": location, "error": "metadata without Name or Version"})
            continue
        key = re.sub(r"[-_.]+", "-", name).lower()  # PEP 503
        distributions.append(
            {
                "name": name,
                "version": version,
                "location": location,
                "installer": _text(dist, "INSTALLER"),
                "shadowed": key in seen,
            }
        )
        seen.add(key)
    data = {
        "python": sys.executable,
        "python_version": "%d.%d.%d" % sys.version_info[:3],
        "sys_path": [p for p in sys.path if p],
        "distributions": distributions,
        "broken": broken,
    }
    detail = "%d distributions" % len(distributions)
    if broken:
        detail += ", %d with unreadable metadata" % len(broken)
    return {"status": "PASS", "detail": detail, "data": data}
