"""The in-image inventory stage's data → packages to audit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.utils import canonicalize_name

from imagegate.vulns.findings import Package


def packages(data: Mapping[str, Any]) -> list[Package]:
    """One Package per (canonical name, version), with every folder it is installed in: a
    shadowed copy is still on disk, so it is audited too."""
    folders: dict[tuple[str, str], list[str]] = {}
    names: dict[tuple[str, str], str] = {}
    for d in data.get("distributions") or []:
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
