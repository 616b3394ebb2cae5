"""Where the files shipped beside the code are: in a checkout, the in-image probes/ and data/
(pipelines, manifests, policies) at the project root; in an installed wheel, all of them under
imagegate/_data/."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).parent.parent  # the package imagegate/, this module one folder below it


def _dir(name: str) -> Path:
    installed = _HERE / "_data" / name
    if installed.is_dir():
        return installed
    root = _HERE.parent.parent
    return root / name if name == "probes" else root / "data" / name


def probes_dir() -> Path:
    return _dir("probes")


def pipelines_dir() -> Path:
    return _dir("pipelines")


def builtin_pipelines() -> list[str]:
    """The built-in pipelines' names: their files, read where help is made (no pipeline model)."""
    return sorted(p.stem for p in pipelines_dir().glob("*.yaml"))


def manifests_dir() -> Path:
    return _dir("manifests")


def policies_dir() -> Path:
    return _dir("policies")
