#!/usr/bin/env python3
"""The structure's picture, drawn from the code: which part of src/imagegate imports which
(imports for annotations only left out, as the import contracts leave them), as a Mermaid graph
in docs/structure.md, with the figures the house is held to.

    python scripts/structure.py           # print the page
    python scripts/structure.py --write   # write docs/structure.md (tests/test_structure.py
                                          # fails when the page and the code differ)
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "imagegate"
PAGE = ROOT / "docs" / "structure.md"
# The rings, from the top: a part's row in the picture.
RINGS = {
    "cli": "CLI",
    "fleet": "fleet, cluster, reports",
    "report": "fleet, cluster, reports",
    "kube": "fleet, cluster, reports",
    "usecases": "use cases",
    "drivers": "drivers, outside stages",
    "stages": "drivers, outside stages",
    "attest": "libraries",
    "oci": "libraries",
    "rootfs": "libraries",
    "vulns": "libraries",
    "policies": "libraries",
    "domain": "domain",
    "pipeline": "pipeline",
    "_support": "support",
    "errors": "support",
}


def part(module: str) -> str | None:
    """The top-level part of src/imagegate a dotted module name is in."""
    names = module.split(".")
    if names[0] != "imagegate" or len(names) < 2:
        return None
    return names[1] if names[1] in RINGS else None


def _runtime_imports(tree: ast.Module) -> list[str]:
    """Every module imported, but not under `if TYPE_CHECKING:`."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for b in node.body for n in ast.walk(b)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return found


def edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        source = part("imagegate." + ".".join(rel.parts))
        if source is None:
            continue
        for name in _runtime_imports(ast.parse(path.read_text())):
            target = part(name)
            if target is not None and target != source:
                graph[source].add(target)
    return graph


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Each import that runs back up a ring (a part importing one drawn above it)."""
    rings = list(dict.fromkeys(RINGS.values()))
    return [
        f"{s} --> {t}"
        for s in sorted(graph)
        for t in sorted(graph[s])
        if rings.index(RINGS[t]) < rings.index(RINGS[s])
    ]


def page() -> str:
    graph = edges()
    up = upward(graph)
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "_version.py")  # made at install
    lines = [
        "# The structure, drawn from the code",
        "",
        "Written by `scripts/structure.py --write` from the imports in `src/imagegate` (imports for",
        "annotations only left out, as the import contracts leave them); `tests/test_structure.py`",
        "fails when this page and the code differ. Each arrow: the part imports the other.",
        "",
        "```mermaid",
        "flowchart TD",
    ]
    for ring in dict.fromkeys(RINGS.values()):
        members = [p for p, r in RINGS.items() if r == ring]
        lines.append(f'  subgraph "{ring}"')
        lines += [f"    {p}" for p in members]
        lines.append("  end")
    lines += [f"  {s} --> {t}" for s in sorted(graph) for t in sorted(graph[s])]
    lines += [
        "```",
        "",
        f"Modules at the top of the package: {len(top)} ({', '.join(top)}).",
        "",
        f"Imports that run back up a ring: {', '.join(up) if up else 'none'}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write docs/structure.md")
    args = parser.parse_args(argv)
    if args.write:
        PAGE.write_text(page())
        print(f"structure: {PAGE.relative_to(ROOT)} written")
    else:
        sys.stdout.write(page())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
