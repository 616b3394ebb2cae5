"""Start-up: `--version`, the app's `--help`, every command's `--help` and shell completion answer
without importing the product's heavy layers (the pipeline models, OCI, attestation, drivers, the
use case) or their libraries. CI calls imagegate many times per image; each call pays its imports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_help import _commands
from tests.helpers import imagegate

# What a command that only prints may not import (a name, or a package and everything under it).
FORBIDDEN = (
    "pydantic",
    "cryptography",
    "docker",
    "httpx",
    "yaml",
    "imagegate.pipeline",
    "imagegate.oci",
    "imagegate.attest",
    "imagegate.drivers",
    "imagegate.usecases.accept",
    "imagegate.usecases.runner",
    "imagegate.kube",
)
# The console script's own entry point, then the modules loaded by the end written to a file:
# what was imported at all, whichever way the command left.
RUNNER = """
import atexit, os, sys
def dump():
    with open(os.environ["IMPORTED_TO"], "w") as f:
        f.write("\\n".join(sorted(sys.modules)))
atexit.register(dump)
sys.argv[0] = "imagegate"
from imagegate.cli import main
main()
"""


def forbidden_imports(
    args: list[str], tmp: Path, env: dict[str, str] | None = None, forbidden: tuple[str, ...] = FORBIDDEN
) -> tuple[int, list[str]]:
    """Run the real CLI with `args`; its exit code and the `forbidden` modules it imported."""
    out = tmp / "imported.txt"
    full_env = dict(os.environ, IMPORTED_TO=str(out), COLUMNS="200", **(env or {}))
    p = subprocess.run([sys.executable, "-c", RUNNER, *args], capture_output=True, text=True, env=full_env)
    imported = out.read_text().split()
    heavy = [m for m in imported if any(m == f or m.startswith(f + ".") for f in forbidden)]
    # The top of each forbidden tree is enough to name the culprit.
    return p.returncode, sorted(m for m in heavy if "." not in m or m.rsplit(".", 1)[0] not in heavy)


def _paths() -> list[list[str]]:
    return [[], *[p for p in _commands() if p]]


def test_version_imports_nothing_heavy(tmp_path: Path) -> None:
    assert forbidden_imports(["--version"], tmp_path) == (0, [])


@pytest.mark.parametrize("path", _paths(), ids=lambda p: " ".join(p) or "imagegate")
def test_help_imports_nothing_heavy(path: list[str], tmp_path: Path) -> None:
    assert forbidden_imports([*path, "--help"], tmp_path) == (0, [])


@pytest.mark.parametrize(
    ("shell", "words", "cword"),
    [
        ("complete_bash", "imagegate ", "1"),  # the commands
        ("complete_bash", "imagegate run --d", "2"),  # a command's options
        ("complete_bash", "imagegate run --driver ", "3"),  # an option's choices
        ("complete_zsh", "imagegate pod ", "2"),  # a group's commands
    ],
)
def test_completion_imports_nothing_heavy(shell: str, words: str, cword: str, tmp_path: Path) -> None:
    # Completion loads every command module: what it offers is declared there.
    env = {"_IMAGEGATE_COMPLETE": shell, "COMP_WORDS": words, "COMP_CWORD": cword}
    assert forbidden_imports([], tmp_path, env) == (0, [])


@pytest.mark.parametrize("path", _paths()[1:], ids=" ".join)
def test_command_help_reads_as_the_parser_prints_it(path: list[str]) -> None:
    """`imagegate CMD --help` is printed without parsing (parsing alone imports pydantic through
    typer): the same text, to the byte, as the parser prints for the same request."""
    fast = imagegate(*path, "--help")
    # The app itself, called as the console script called it before: every word parsed.
    parser = "import sys; from imagegate.cli import app; app(args=sys.argv[1:], prog_name='imagegate')"
    env = dict(os.environ, COLUMNS="200")
    parsed = subprocess.run(
        [sys.executable, "-c", parser, *path, "--help"], capture_output=True, text=True, env=env
    )
    assert fast.returncode == 0 and parsed.returncode == 0, fast.stderr + parsed.stderr
    assert fast.stdout == parsed.stdout


@pytest.mark.parametrize(
    "env",
    [
        {"_IMAGEGATE_COMPLETE": ""},
        {"_OTHER_TOOL_COMPLETE": "complete_bash"},
        # `python -m imagegate` (as imagegate() runs it) is another program's name for typer
        {"_IMAGEGATE_COMPLETE": "complete_bash"},
    ],
)
def test_a_command_run_beside_a_completion_variable_still_checks_its_values(env: dict[str, str]) -> None:
    # Values are left unchecked only while typer completes; a command that runs checks them.
    r = imagegate("layers", "oci:/nonexistent", "--jobs", "many", env=env)
    assert r.returncode == 3 and "--jobs" in r.stderr and "integer" in r.stderr, r.stderr


# What a `run` of an image the engine holds loads before its first container, by the modules the
# command itself reaches: the verification, registries (httpx) and signing load when a stage
# verifies, a registry is read, or the attempt is signed, after the probes ran.
# A quiet or JSON run (CI's) draws nothing: no console, no progress, so no rich either.
RUN_PATH = (
    "import sys\n"
    "import imagegate.cli.run, imagegate.usecases.accept, imagegate.usecases.runner, imagegate.drivers.docker\n"
    "import imagegate.cli._checks, imagegate.drivers.select\n"
    "from imagegate.cli import _accept\n"
    "from imagegate.report import progress\n"
    "_accept.notifier(True)('said to no one')\n"
    "with progress.run_shown(True):\n"
    "    pass\n"
    "print(' '.join(sorted(m for m, mod in sys.modules.items() if mod is not None and m.split('.')[0] in ('httpx', 'cryptography', 'rich') "
    "or m in ('imagegate.oci.layercheck', 'imagegate.oci.registry', 'imagegate.attest.sign'))))\n"
)


def test_a_run_loads_verification_registries_signing_and_a_console_only_when_it_uses_them() -> None:
    p = subprocess.run([sys.executable, "-c", RUN_PATH], capture_output=True, text=True, check=True)
    assert p.stdout.split() == [], p.stdout


def test_a_registry_client_loads_no_console_nor_httpx_command_line() -> None:
    # httpx's package loads its own CLI (click, rich's progress and syntax, pygments) whenever they
    # are installed, as they are here beside typer: a registry read of a quiet run needs none.
    p = subprocess.run(
        [sys.executable, "-c", "import sys, imagegate.oci.registry, httpx\n"
         "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('rich', 'pygments', 'click'))))\n"
         "httpx.main()"],
        capture_output=True, text=True,
    )  # fmt: skip
    loaded, _, said = p.stdout.partition("\n")
    assert loaded == "", loaded
    # httpx's own stand-in for its CLI answers, so nothing of httpx was broken on the way
    assert p.returncode == 1 and "httpx[cli]" in said, p.stdout + p.stderr
