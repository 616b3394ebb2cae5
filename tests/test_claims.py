"""Every figure and framework version README.md states is backed, and says what its source says
today. The figures are found in README.md itself (ratios, seconds, sizes, vLLM/SGLang/nixl
versions, counts of runs), so a new one cannot be written without an entry in docs/claims.yaml:
a record and the value in it, a file and the constant in it, a real-framework run at today's
pipeline and probes, or a block copied verbatim from a record. Each record in benchmarks/records
is listed in its README."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.real.test_records import stale

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "docs" / "claims.yaml"
# What counts as a figure: a ratio, a duration (s, ms, h, days, minutes), a size (KB to TiB), a
# percentage, a count of runs, a framework version.
FIGURE = re.compile(
    r"(?<![\w.])(?:"
    r"\d+(?:\.\d+)?\s?[x×](?![\w])"
    r"|\d+(?:\.\d+)? ?(?:s|ms)\b(?!-)"
    r"|~?\d+(?:\.\d+)? ?(?:KB|kB|KiB|MB|MiB|GB|GiB|TB|TiB)\b"
    r"|\d+(?:\.\d+)? ?%"
    r"|\d+(?:\.\d+)? ?(?:h|hours?|days?)\b"
    r"|\d+ (?:interrupted )?runs\b"
    r"|\d+ minutes\b"
    r"|(?:vLLM|SGLang|vllm|sglang|nixl) \d+\.\d+(?:\.\d+)?"
    r"|(?<![-\w.])\d+\.\d+\.\d+(?![.\d])"
    r")"
)


def normal(text: str) -> str:
    """Whitespace collapsed: README lines wrap anywhere."""
    return " ".join(text.split())


# The pages a reader reads claims in: README.md and the docs, but the generated command
# reference (tests/cli/test_help.py checks it against --help) and the design notes (no claims).
NOT_CLAIMS = ("commands.md", "design.md")


def readme_text(readme: str | None = None) -> str:
    """README.md and docs/*.md, one text (a claim is found wherever it moved)."""
    if readme is not None:
        return normal(readme)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return normal("\n\n".join(p.read_text() for p in pages if p.name not in NOT_CLAIMS))


def number(figure: str) -> tuple[float, int]:
    """The figure's number and its decimals: '0.88×' -> (0.88, 2), '94 s' -> (94.0, 0)."""
    digits = re.search(r"\d+(?:\.\d+)?", figure)
    assert digits, figure
    text = digits.group()
    return float(text), len(text.partition(".")[2])


def source_value(fig: dict[str, Any]) -> Any:
    """What the source says for one figure: a record's value (`expr` over the JSON as `r`), or
    group 1 of `regex` in a file."""
    path = ROOT / fig["source"]
    if "expr" in fig:
        record = json.loads(path.read_text())
        try:
            return eval(
                fig["expr"], {"__builtins__": {"abs": abs, "max": max, "min": min, "sum": sum}}, {"r": record}
            )
        except (KeyError, IndexError, TypeError):
            return None  # the record holds no such value
    m = re.search(fig["regex"], path.read_text(), re.M)
    return m.group(1) if m else None


def problem(fig: dict[str, Any]) -> str | None:
    """Why one figure does not hold, or None."""
    if "real" in fig:
        return stale(*fig["real"])
    if not (ROOT / fig["source"]).is_file():
        return f"{fig['figure']!r}: {fig['source']} does not exist"
    value = source_value(fig)
    if value is None:
        return f"{fig['figure']!r}: {fig.get('regex') or fig['expr']!r} finds nothing in {fig['source']}"
    version = re.search(r"\d+\.\d+\.\d+", fig["figure"])
    if version:  # a version is a string: 0.5.5 is not 0.5.50
        return None if str(value) == version.group() else f"{fig['figure']!r}: {fig['source']} says {value}"
    want, decimals = number(fig["figure"])
    got = float(value) * fig.get("scale", 1)
    if fig.get("at_most"):  # "within 1 %": a bound the measured value stays under
        if got > want:
            return f"{fig['figure']!r}: {fig['source']} says {got:.4g}, over it"
    elif round(got, decimals) != want:
        return f"{fig['figure']!r}: {fig['source']} says {got:.{decimals}f} ({got:.4g} unrounded)"
    return used(fig)


def used(fig: dict[str, Any]) -> str | None:
    """A constant's value is no promise until the code applies it: each `used` entry, a file and
    a regex, must find the place that does (the read that is bounded by it, the rule that
    compares with it)."""
    for where in fig.get("used", []):
        path = ROOT / where["source"]
        if not path.is_file() or not re.search(where["regex"], path.read_text(), re.M):
            return f"{fig['figure']!r}: not applied where it is used: {where['regex']!r} finds nothing in {where['source']}"
    return None


def check(readme: str, table: dict[str, Any]) -> list[str]:
    """Every problem: a figure of README.md no claim covers, a claim whose text is gone, a
    figure its source contradicts, a block no longer verbatim in its record."""
    text = readme_text(readme)
    covered: list[tuple[int, int, set[str]]] = []
    problems = []
    for claim in table["claims"]:
        said = normal(claim["readme"])
        at = text.find(said)
        if at < 0:
            problems.append(f"not in README.md or docs/ any more: {said[:90]!r}")
            continue
        if "illustration" in claim:
            covered.append((at, at + len(said), {"*"}))
            continue
        if "verbatim" in claim:
            block = normal(claim["readme"])
            if block not in normal((ROOT / claim["verbatim"]).read_text()):
                problems.append(f"not verbatim in {claim['verbatim']}: {said[:90]!r}")
            covered.append((at, at + len(said), {"*"}))
            continue
        figures = claim.get("figures", [])
        for fig in figures:
            if fig["figure"] not in said:
                problems.append(f"{fig['figure']!r} is not in its claim {said[:90]!r}")
            elif why := problem(fig):
                problems.append(f"{said[:60]!r}: {why}")
        covered.append((at, at + len(said), {f["figure"] for f in figures}))
    for m in FIGURE.finditer(text):
        if not any(a <= m.start() < b and ("*" in figs or m.group() in figs) for a, b, figs in covered):
            problems.append(
                f"a figure docs/claims.yaml does not back: {text[max(0, m.start() - 60) : m.end() + 20]!r}"
            )
    return problems


def test_every_readme_figure_and_version_holds() -> None:
    problems = check(readme_text(), yaml.safe_load(TABLE.read_text()))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("table_too", [False, True], ids=["README alone", "README and table"])
def test_a_figure_edited_away_from_its_record_fails(table_too: bool) -> None:
    """0.97x is the root cache record's warm-run ratio: written as 0.90x it fails, whether the
    table's text is left as it was (the claim is gone) or edited along (the record says 0.97)."""
    old, new = "the whole warm run 0.97x", "the whole warm run 0.90x"
    readme = readme_text()
    assert old in readme
    table = yaml.safe_load(TABLE.read_text())
    if table_too:
        for claim in table["claims"]:
            claim["readme"] = normal(claim["readme"]).replace(old, new)
            for fig in claim.get("figures", []):
                fig["figure"] = fig["figure"].replace("0.97x", "0.90x")
    problems = check(normal(readme).replace(old, new), table)
    record = "benchmarks/records/2026-12-01-1629-bench_root_cache.json"
    expected = f"'0.90x': {record} says 0.97" if table_too else "not in README.md or docs/ any more"
    assert any(expected in p for p in problems), problems


def test_a_new_figure_without_a_source_fails() -> None:
    problems = check(readme_text() + " It is 2.5x faster than X.", yaml.safe_load(TABLE.read_text()))
    assert any("2.5x" in p and "does not back" in p for p in problems), problems


def test_a_limit_no_longer_applied_where_it_is_used_fails(tmp_path: Path) -> None:
    """The 64 KiB bound on an error answer: the constant left as it is but the read no longer
    bounded by it (the limit widened at the call) fails, naming the place."""
    table = yaml.safe_load(TABLE.read_text())
    (fig,) = [f for c in table["claims"] for f in c.get("figures", []) if f["figure"] == "64 KiB"]
    assert problem(fig) is None
    source = (ROOT / fig["source"]).read_text()
    call = "read_capped(resp, MAX_ERROR_BYTES"
    assert call in source
    widened = tmp_path / "registry.py"
    widened.write_text(source.replace(call, "read_capped(resp, 1 << 30"))
    moved = {**fig, "source": str(widened), "used": [{**u, "source": str(widened)} for u in fig["used"]]}
    assert "not applied where it is used" in (problem(moved) or ""), problem(moved)


def test_a_bound_a_measurement_went_over_fails(tmp_path: Path) -> None:
    """'within 1 %' of a baseline: a record whose largest difference is over 1 % fails, one under
    or at it holds (a bound, not a rounded equality: 0.5 % is within 1 %)."""
    record = tmp_path / "record.txt"
    fig = {"figure": "1 %", "source": str(record), "regex": r"largest difference ([\d.]+)", "at_most": True}
    for value, holds in (("0.5", True), ("1.0", True), ("1.2", False)):
        record.write_text(f"largest difference {value}\n")
        assert (problem(fig) is None) is holds, (value, problem(fig))


def test_every_record_is_listed_in_the_records_readme() -> None:
    listed = (ROOT / "benchmarks" / "records" / "README.md").read_text()
    records = sorted(p.name for p in (ROOT / "benchmarks" / "records").iterdir() if p.name != "README.md")
    assert [r for r in records if r not in listed] == []
