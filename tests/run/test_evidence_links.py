"""The run store is never written through a link: a symbolic link or a folder planted where
`index.jsonl` or an image's folder goes stops the run before it starts (exit 3, named), and the
link's target is left as it was. Real engine, real image."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import imagegate


@pytest.fixture
def image_folder(engine: str, images: dict[str, str], tmp_path: Path) -> tuple[str, Path]:
    image = images["python"]
    image_id = subprocess.run(
        ["docker", "-H", engine, "image", "inspect", "-f", "{{.Id}}", image],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    return image, tmp_path / "out" / image_id.replace(":", "-")


def test_symlinked_index_is_refused_and_its_target_untouched(
    image_folder: tuple[str, Path], tmp_path: Path
) -> None:
    image, folder = image_folder
    folder.mkdir(parents=True)
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    (folder / "index.jsonl").symlink_to(target)
    r = imagegate("run", image, "-p", "python", "-o", str(tmp_path / "out"), "--no-sign")
    assert r.returncode == 3, r.stderr
    assert f"run index {folder / 'index.jsonl'}: a symbolic link; refusing to write through it" in r.stderr
    assert target.read_text() == "keep me\n"
    assert sorted(p.name for p in folder.iterdir()) == ["index.jsonl"]  # no attempt was started


def test_dangling_symlinked_index_is_not_created_through(
    image_folder: tuple[str, Path], tmp_path: Path
) -> None:
    image, folder = image_folder
    folder.mkdir(parents=True)
    target = tmp_path / "would-be-created.txt"
    (folder / "index.jsonl").symlink_to(target)
    r = imagegate("run", image, "-p", "python", "-o", str(tmp_path / "out"), "--no-sign")
    assert r.returncode == 3, r.stderr
    assert not target.exists()


def test_folder_in_place_of_the_index(image_folder: tuple[str, Path], tmp_path: Path) -> None:
    image, folder = image_folder
    (folder / "index.jsonl").mkdir(parents=True)
    r = imagegate("run", image, "-p", "python", "-o", str(tmp_path / "out"), "--no-sign")
    assert r.returncode == 3, r.stderr
    assert f"run index {folder / 'index.jsonl'}: not a file; refusing" in r.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["index.jsonl"]


def test_symlinked_image_folder_is_refused(image_folder: tuple[str, Path], tmp_path: Path) -> None:
    image, folder = image_folder
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder.parent.mkdir(parents=True)
    folder.symlink_to(elsewhere)
    r = imagegate("run", image, "-p", "python", "-o", str(tmp_path / "out"), "--no-sign")
    assert r.returncode == 3, r.stderr
    assert f"evidence folder {folder}: a symbolic link; refusing to write through it" in r.stderr
    assert list(elsewhere.iterdir()) == []


def test_a_clean_store_still_appends(image_folder: tuple[str, Path], tmp_path: Path) -> None:
    image, folder = image_folder
    for _ in range(2):
        r = imagegate("run", image, "-p", "python", "-o", str(tmp_path / "out"), "--no-sign", "-q")
        assert r.returncode == 0, r.stderr
    assert len((folder / "index.jsonl").read_text().splitlines()) == 2
    assert not os.path.islink(folder / "index.jsonl")
