"""The house's shape, held: few modules at the top, the use cases in one package that prints
nothing, and no file name used for two things (the import contracts in pyproject.toml hold the
rings' directions)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.helpers import load_script

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "imagegate"
MAX_TOP_MODULES = 8
# The same name in two places, each for the same kind of thing (said why): anything else named
# twice outside cli/ (whose modules are the commands of the same names) is a new name to find.
SAME_THING = {
    "errors.py": "the errors of the product, and those of reading an image's source",
    "interface.py": "the interface a kind of adapter implements (drivers, image sources)",
    "registry.py": "the registry client, and the image source that reads through it",
    "load.py": "reading a file into its values: a pipeline file, an attempt folder",
}


def test_the_top_of_the_package_holds_few_modules() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


def test_the_use_cases_print_nothing() -> None:
    """What a use case has to say goes back to its caller (returned values, notify and alert
    callbacks); only the CLI writes to the terminal."""
    said = []
    for path in sorted((PACKAGE / "usecases").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                said.append(f"{path.name}:{node.lineno} print()")
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("stdout", "stderr")
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
            ):
                said.append(f"{path.name}:{node.lineno} sys.{node.attr}")
    assert said == []


def test_no_file_name_means_two_things() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] != "cli" and path.name not in ("__init__.py", "__main__.py"):
            where[path.name].append(str(rel))
    twice = {name: places for name, places in where.items() if len(places) > 1 and name not in SAME_THING}
    assert twice == {}


def test_no_import_runs_back_up_a_ring() -> None:
    """Each part imports only parts in its own ring or below it (scripts/structure.py RINGS)."""
    structure = load_script(PACKAGE.parents[1] / "scripts" / "structure.py")
    graph = structure.edges()
    assert graph, "no imports found: the picture would hold nothing"
    assert structure.upward(graph) == []
    graph["domain"].add("cli")  # the check itself sees an import that climbs
    assert structure.upward(graph) == ["domain --> cli"]


def test_the_structures_picture_is_the_codes() -> None:
    """docs/structure.md is drawn from the imports as they are (scripts/structure.py --write)."""
    structure = load_script(PACKAGE.parents[1] / "scripts" / "structure.py")
    assert structure.PAGE.read_text() == structure.page(), "run: python scripts/structure.py --write"
