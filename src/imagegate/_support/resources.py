"""Where the files shipped beside the code are: probes/, pipelines/, manifests/ at the project
root in a checkout, or under imagegate/_data/ in an installed wheel."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).parent.parent  # the package imagegate/, this module one folder below it


def _dir(name: str) -> Path:
    installed = _HERE / "_data" / name
    if installed.is_dir():
        return installed
    return _HERE.parent.parent / name


def probes_dir() -> Path:
    return _dir("probes")


def pipelines_dir() -> Path:
    return _dir("pipelines")


def builtin_pipelines() -> list[str]:
    """The built-in pipelines' names: their files, read where help is made (no pipeline model)."""
    return sorted(p.stem for p in pipelines_dir().glob("*.yaml"))


def manifests_dir() -> Path:
    return _dir("manifests")
