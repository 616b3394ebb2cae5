"""find_spec: module entry points exist.

`importlib.util.find_spec("a.b")` imports `a` (its side effects run; a missing parent raises
ModuleNotFoundError instead of returning None), and any stray folder on sys.path satisfies a
name as a namespace package. The controller runs us from an empty working directory, and
namespace-only hits are reported as such (and fail unless the pipeline allows them).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys


def _distributions_of(name: str):
    top = name.split(".")[0]
    try:
        import importlib.metadata as md
    except ImportError:  # pragma: no cover - Python < 3.8
        return []
    found = []
    mapping = getattr(md, "packages_distributions", None)
    if mapping is not None:  # Python >= 3.10
        for dist_name in mapping().get(top, []):
            with contextlib.suppress(Exception):
                found.append({"name": dist_name, "version": md.version(dist_name)})
        return found
    for dist in md.distributions():  # Python 3.8/3.9: look at each distribution's files
        try:
            tops = (dist.read_text("top_level.txt") or "").split()
            if not tops:
                tops = [str(f).split("/")[0].split(".")[0] for f in (dist.files or [])]
        except Exception:
            continue
        if top in tops:
            found.append({"name": dist.metadata["Name"], "version": dist.version})
    return found


def check(name: str, allow_namespace) -> dict:
    rec = {"module": name}
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError as e:
        rec.update(found=False, reason="parent package %s is not installed" % (e.name or "?"))
        return rec
    except BaseException as e:  # a parent's __init__ raised: record it, do not crash
        if isinstance(e, KeyboardInterrupt):
            raise
        parent = name.rsplit(".", 1)[0]
        rec.update(
            found=False,
            error={"type": type(e).__name__, "message": str(e)[:2000]},
            reason=f"importing {parent} raised {type(e).__name__}: {str(e)[:300]}",
        )
        return rec
    if spec is None:
        rec.update(found=False, reason="not found")
        return rec
    namespace = spec.origin in (None, "namespace") and spec.submodule_search_locations is not None
    locations = list(spec.submodule_search_locations or [])
    rec.update(found=True, origin=spec.origin, namespace=namespace, search_locations=locations)
    dists = _distributions_of(name)
    if dists:
        rec["distribution"] = dists[0]["name"]
        rec["version"] = dists[0]["version"]
        if len(dists) > 1:
            rec["distributions"] = dists
    if namespace and name not in allow_namespace:
        rec["reason"] = "only a namespace package (no __init__.py), from {}".format(", ".join(locations))
    return rec


def run(params: dict) -> dict:
    modules = params.get("modules", [])
    allow = set(params.get("allow_namespace", []))
    if not modules:
        return {"status": "PASS", "detail": "no modules to check", "data": {"modules": []}}
    records = [check(m, allow) for m in modules]
    missing = [r for r in records if not r["found"]]
    namespace_only = [r for r in records if r["found"] and r.get("reason")]
    data = {"modules": records, "cwd": os.getcwd(), "sys_path": sys.path}
    if missing or namespace_only:
        parts = ["{}: {}".format(r["module"], r["reason"]) for r in missing + namespace_only]
        return {"status": "FAIL", "detail": "; ".join(parts), "data": data}
    found = ", ".join(
        "{}{}".format(r["module"], " ({})".format(r["version"]) if r.get("version") else "") for r in records
    )
    return {"status": "PASS", "detail": "found " + found, "data": data}
