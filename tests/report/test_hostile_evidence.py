"""`imagegate report` reads an attempt folder that may have been edited since the run: a
hostile JSON file in it is an input error naming the file, never a RecursionError."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import imagegate

DEEP = "[" * 5000 + "]" * 5000


def test_deep_statement_or_result_is_named(here_run: Path) -> None:
    (attempt,) = [p.parent for p in here_run.glob("runs/*/*/statement.json")]
    result = sorted(attempt.glob("stages/*/result.json"))[0]
    result.write_text(DEEP)
    r = imagegate("report", str(attempt))
    assert r.returncode == 3, r.stderr
    assert f"{result}: cannot read it: nested more than 64 levels deep" in r.stderr
    (attempt / "statement.json").write_text(DEEP)
    r = imagegate("report", str(attempt))
    assert r.returncode == 3, r.stderr
    assert f"{attempt / 'statement.json'}: cannot read it: nested more than 64 levels deep" in r.stderr
    assert "Traceback" not in r.stderr
