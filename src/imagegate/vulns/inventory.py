"""The in-image inventory stage's data → packages to audit."""

from __future__ import annotations

from packaging.utils import canonicalize_name

from imagegate._support.jsontypes import JsonMapping
from imagegate.vulns.findings import Package
from imagegate.vulns.strict import iterated, mapping


def packages(data: JsonMapping) -> list[Package]:
    """One Package per (canonical name, version), with every folder it is installed in: a
    shadowed copy is still on disk, so it is audited too."""
    folders: dict[tuple[str, str], list[str]] = {}
    names: dict[tuple[str, str], str] = {}
    for item in iterated(data.get("distributions") or []):
        d = mapping(item)
        name, version = d.get("name"), d.get("version")
        if not isinstance(name, str) or not isinstance(version, str) or not name or not version:
            continue
        key = (canonicalize_name(name), version)
        names.setdefault(key, name)
        loc = d.get("location")
        where = folders.setdefault(key, [])
        if isinstance(loc, str) and loc not in where:
            where.append(loc)
    return [Package(names[k], k[1], tuple(v)) for k, v in sorted(folders.items())]
