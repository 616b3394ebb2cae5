"""The evidence tree the docs show (docs/ci-gate.md, "Evidence") names every file a signed run
writes: a new file, or a renamed one, fails here until the docs say it. Real engine, real image."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import imagegate

pytestmark = pytest.mark.engine

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ci-gate.md"


def _tree() -> str:
    text = DOCS.read_text()
    start = text.index("    imagegate-runs/                       (--out)")
    return text[start : text.index("\n\n", start)]


def test_the_docs_name_every_file_a_signed_run_writes(images: dict[str, str], tmp_path: Path) -> None:
    assert imagegate("keygen", "--out", str(tmp_path / "k")).returncode == 0
    out = tmp_path / "out"
    r = imagegate("run", images["python"], "-p", "python", "--key", str(tmp_path / "k.key"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    (image_folder,) = out.iterdir()
    assert re.fullmatch(r"sha256-[0-9a-f]{64}", image_folder.name)
    (attempt,) = [p for p in image_folder.iterdir() if p.is_dir()]
    written = sorted(str(p.relative_to(attempt)) for p in attempt.rglob("*") if p.is_file())
    assert "attestation.dsse.json" in written and "statement.json" in written
    tree = _tree()
    assert "index.jsonl" in tree and (image_folder / "index.jsonl").is_file()
    unnamed = []
    for name in written:
        shown = re.sub(r"^controller-\d+\.", "controller-1.", name)
        stage = re.fullmatch(r"stages/\d\d-[a-z_]+/(.+)", shown)
        if (
            not (f"{{{stage.group(1)}," in tree or f",{stage.group(1)}" in tree)
            if stage
            else shown not in tree
        ):
            unnamed.append(name)
    assert not unnamed, f"written but not in docs/ci-gate.md's evidence tree: {unnamed}"
