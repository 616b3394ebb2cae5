"""find_spec: module entry points exist.

`importlib.util.find_spec("a.b")` imports `a` (its side effects run; a missing parent raises
ModuleNotFoundError instead of returning None), and any stray folder on sys.path satisfies a
name as a namespace package. The controller runs us from an empty working directory, and
namespace-only hits are reported as such (and fail unless the pipeline allows them).
"""

from __future__ import annotations

import importlib.util
import os
import sys


def _provides(dist, top: str) -> bool:
    try:
        tops = (dist.read_text("top_level.txt") or "").split()
    except Exception:
        tops = []
    if tops:
        return top in tops
    for f in dist.files or []:
        head = str(f).split("/")[0]
        if head in (top, top + ".py") or (head.startswith(top + ".") and head.endswith((".so", ".pyd"))):
            return True
    return False


def _distributions_of(name: str):
    """The installed distributions that provide `name`'s top-level package. Cheapest first: a
    distribution named like the module, then every top_level.txt, and only then RECORD files
    (a large image has hundreds of distributions; reading every RECORD costs seconds)."""
    top = name.split(".")[0]
    try:
        import importlib.metadata as md
    except ImportError:  # pragma: no cover - Python < 3.8
        return []

    def rec(dist):
        return {"name": dist.metadata["Name"], "version": dist.version}

    for guess in dict.fromkeys([top, top.replace("_", "-")]):
        try:
            dist = md.distribution(guess)
        except Exception:
            continue
        if _provides(dist, top):
            return [rec(dist)]
    found, unlisted = [], []
    for dist in md.distributions():
        try:
            tops = (dist.read_text("top_level.txt") or "").split()
        except Exception:
            tops = []
        if not tops:
            unlisted.append(dist)
        elif top in tops:
            found.append(rec(dist))
    if not found:
        found = [rec(d) for d in unlisted if _provides(d, top)]
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
        # Nothing checked is no pass: SKIPPED counts neither for nor against a level.
        return {
            "status": "SKIPPED",
            "detail": "no modules to check (give them with --module)",
            "data": {"modules": []},
        }
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
