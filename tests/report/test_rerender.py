"""`imagegate report`'s work (report.formats.rerender): an attempt's stored evidence rendered
again, to a file or stdout, never into an attempt folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagegate.errors import UsageError
from imagegate.report import formats


def test_table_and_json_from_the_stored_evidence(
    mixed_attempt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    formats.rerender(mixed_attempt, "table", tmp_path / "out" / "table.txt")
    table = (tmp_path / "out" / "table.txt").read_text()
    assert "vllm" in table and "\x1b[" not in table  # plain text, no terminal colours
    formats.rerender(mixed_attempt.parent, "json")  # an image folder: its latest attempt
    assert capsys.readouterr().out == (mixed_attempt / "statement.json").read_text()


def test_never_into_an_attempt_folder_nor_an_unwritable_path(mixed_attempt: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"inside the attempt folder .*whose files are evidence"):
        formats.rerender(mixed_attempt, "markdown", mixed_attempt / "summary.md")
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match=r"^writing .*file/r.md: ") as e:
        formats.rerender(mixed_attempt, "markdown", tmp_path / "file" / "r.md")
    assert e.value.hint == "check the --output path"
