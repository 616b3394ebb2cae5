"""The real framework images (tests/images/build.py's REAL_RECIPES, ~10 GB each), each built
on first use: a test of the blocking suite never waits for an image only the conformance tests
(`-m conformance`) run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class RealImages:
    """name -> `imagegate-test/NAME:latest`, built (or found by its recipe hash) when first asked."""

    def __init__(self) -> None:
        sys.path.insert(0, str(ROOT / "tests" / "images"))
        import build  # type: ignore[import-not-found]

        self.build, self.built = build, set[str]()

    def __getitem__(self, name: str) -> str:
        if name not in self.built:
            self.build.build(name)
            self.built.add(name)
        return f"imagegate-test/{name}:latest"


@pytest.fixture(scope="session")
def real(engine: str) -> RealImages:
    return RealImages()
