"""The mutation scores (issue: tests that kill mutants) stand only for the code they measured:
`scripts/mutation.py --check` says when a mutated function changed since its score was recorded,
and CI runs it here, so a score cannot fall silently."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _mutation() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_script", ROOT / "scripts" / "mutation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_recorded_score_stands_for_this_code() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "mutation.py"), "--check"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


MODULE = """\
def promise(x):
    return x > 0


def other(x):
    return x
"""


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, ModuleType]:
    """A repository with one config, one module and its recorded score at the first commit."""
    m = _mutation()
    (tmp_path / "mutation").mkdir()
    (tmp_path / "records").mkdir()
    (tmp_path / "mod.py").write_text(MODULE)
    (tmp_path / "mutation" / "mod.toml").write_text(
        '[cosmic-ray]\nmodule-path = "mod.py"\n\n[imagegate]\nfunctions = ["promise"]\n'
    )

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=tmp_path, check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "first")
    score = {"module": "mod.py", "functions": ["promise"], "passed": True, "dirty": False,
             "commit": git("rev-parse", "--short", "HEAD"), "at": "2026-12-03T00:00:00+00:00"}  # fmt: skip
    (tmp_path / "records" / "2026-12-03-mutation.json").write_text(json.dumps({"modules": {"mod": score}}))
    monkeypatch.setattr(m, "ROOT", tmp_path)
    monkeypatch.setattr(m, "CONFIGS", tmp_path / "mutation")
    monkeypatch.setattr(m, "RECORDS", tmp_path / "records")
    return tmp_path, m


def test_a_score_stands_until_a_mutated_function_changes(repo: tuple[Path, ModuleType]) -> None:
    root, m = repo
    assert m.check() == []
    # an edit elsewhere in the module keeps the score
    (root / "mod.py").write_text(MODULE.replace("return x\n", "return -x\n"))
    assert m.check() == []
    # so does typing it, or a docstring: no mutant depends on them
    typed = 'def promise(x: int) -> bool:\n    """Said."""\n    y: int = x\n    return y > 0\n'
    (root / "mod.py").write_text(MODULE.replace("def promise(x):\n    return x > 0\n", typed))
    assert m.check() == [m.check()[0]] and "promise changed" in m.check()[0]  # y is new code
    (root / "mod.py").write_text(
        MODULE.replace("def promise(x):\n", 'def promise(x: int) -> bool:\n    """Said."""\n')
    )
    assert m.check() == []
    (root / "mod.py").write_text(MODULE.replace("x > 0", "x >= 0"))
    [problem] = m.check()
    assert problem.startswith("mod: promise changed in mod.py since ")
    assert "python scripts/mutation.py --record" in problem and problem.endswith(" mod")


def test_a_score_below_the_goal_for_other_functions_or_missing_does_not_stand(
    repo: tuple[Path, ModuleType],
) -> None:
    root, m = repo
    record = root / "records" / "2026-12-03-mutation.json"
    doc = json.loads(record.read_text())
    doc["modules"]["mod"]["passed"] = False
    record.write_text(json.dumps(doc))
    assert [p.split(";")[0] for p in m.check()] == [
        "mod: the score in 2026-12-03-mutation.json is below the goal"
    ]
    doc["modules"]["mod"] |= {"passed": True, "dirty": True}
    record.write_text(json.dumps(doc))
    assert "measured on uncommitted changes" in m.check()[0]
    doc["modules"]["mod"] |= {"dirty": False, "functions": ["other"]}
    record.write_text(json.dumps(doc))
    assert "measured other functions than the config names" in m.check()[0]
    # a newer record of the same config is the one that counts
    newer = dict(doc["modules"]["mod"], functions=["promise"], at="2026-12-04T00:00:00+00:00")
    (root / "records" / "2026-12-04-mutation.json").write_text(json.dumps({"modules": {"mod": newer}}))
    assert m.check() == []
    record.unlink()
    (root / "records" / "2026-12-04-mutation.json").unlink()
    assert m.check()[0].startswith("mod: no recorded score; re-run:")
