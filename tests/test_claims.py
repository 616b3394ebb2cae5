"""Every figure and framework version README.md and docs/ state is backed, and says what its
source says today. The figures are found in the pages themselves (any number with a unit, counts
of runs, versions), so a new one cannot be written without an entry in docs/claims.yaml: a record
and the value in it, a limit or default in the code and the code that applies it (read from the
syntax tree, tests/claims_code.py), a real-framework run at today's pipeline and probes, a block
copied verbatim from a record, or a reasoned exemption. Each record in benchmarks/records is
listed in its README."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import claims_code
from tests.real.test_records import stale

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "docs" / "claims.yaml"
# What counts as a figure: a number with a unit (a ratio; a duration from µs to weeks, written
# out or as a timeout's `90s`, `5m`, `1h`; a size from B to TiB, Kubernetes' Mi and Gi too, or a
# rate of one; a percentage; FLOP/s, Hz, W; cores and GPUs), a number of seconds or minutes
# written in words, a count of runs, a framework version, a three-part version.
_NUMBER = r"~?\d+(?:\.\d+)?"
FIGURE = re.compile(
    r"(?<![\w.])(?:"
    r"\d+(?:\.\d+)?\s?[x×](?![\w])"
    rf"|{_NUMBER} ?(?:µs|us|ns|ms|s|sec|seconds?|min|minutes?|m|h|hours?|days?|weeks?)\b(?!-)"
    rf"|{_NUMBER} ?(?:B|bytes?|KB|kB|KiB|MB|MiB|GB|GiB|TB|TiB|Ki|Mi|Gi)(?:/s)?(?![\w-])"
    r"|\d+[kg](?![\w.-])"  # an engine's memory limit: 8g
    rf"|{_NUMBER} ?%"
    rf"|{_NUMBER} ?(?:[KMGTP]?FLOP/?s|[KMG]?Hz|W|cores?|CPUs?|GPUs?)(?![\w-])"
    r"|\b(?:one|two|three|four|five|six|seven|ten|fifteen|twenty|thirty|sixty) (?:seconds?|minutes?|hours?|days?|weeks?)\b"
    r"|\d+ (?:interrupted )?runs\b(?!/)"
    r"|(?:vLLM|SGLang|vllm|sglang|nixl) \d+\.\d+(?:\.\d+)?"
    r"|(?<![-\w.])\d+\.\d+\.\d+(?![.\d])"
    r")"
)


def table() -> dict[str, Any]:
    """docs/claims.yaml, read anew (a test may edit it); libyaml's parser: the check runs in CI."""
    loaded: dict[str, Any] = yaml.load(TABLE.read_text(), Loader=yaml.CSafeLoader)
    return loaded


def normal(text: str) -> str:
    """Whitespace collapsed: README lines wrap anywhere."""
    return " ".join(text.split())


def readme_text(readme: str | None = None) -> str:
    """README.md and docs/*.md, one text (a claim is found wherever it moved). The command
    reference, docs/commands.md, is written from --help (scripts/readme-help.py): its defaults
    are claims too."""
    if readme is not None:
        return normal(readme)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return normal("\n\n".join(p.read_text() for p in pages))


WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "ten": 10}
WORDS |= {"fifteen": 15, "twenty": 20, "thirty": 30, "sixty": 60}


def number(figure: str) -> tuple[float, int]:
    """The figure's number and its decimals: '0.88×' -> (0.88, 2), '94 s' -> (94.0, 0)."""
    if (word := figure.split()[0]) in WORDS:
        return float(WORDS[word]), 0
    digits = re.search(r"\d+(?:\.\d+)?", figure)
    assert digits, figure
    text = digits.group()
    return float(text), len(text.partition(".")[2])


# One of each unit in the unit of its kind: bytes, seconds, a fraction. A unit of no kind here
# (×, TFLOP/s, a count) is its own; a rate is its size a second.
UNITS: dict[str, float] = {"B": 1, "byte": 1, "bytes": 1, "%": 0.01, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
UNITS |= {"KB": 1e3, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
UNITS |= {
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
}
UNITS |= {"min": 60, "minute": 60, "minutes": 60, "hour": 3600, "hours": 3600, "day": 86400, "days": 86400}
UNITS |= {"second": 1, "seconds": 1, "week": 604800, "weeks": 604800}


def unit_size(unit: str) -> float:
    return UNITS.get(unit.removesuffix("/s"), 1)


def in_units(figure: str, means: str | None = None) -> float:
    """The figure in the unit of its kind: '64 KiB' -> 65536, '10 minutes' -> 600, '1 %' -> 0.01;
    `means` reads its unit otherwise ('6m' of memory is 6 MiB, not minutes)."""
    unit = means or re.sub(r"^~?(?:\d+(?:\.\d+)?|[a-z]+)\s?", "", figure)
    return number(figure)[0] * unit_size(unit)


def code_problem(fig: dict[str, Any]) -> str | None:
    """Why a `constant` or `literal` entry does not hold: the place is gone, its value is not
    `value`, `value` is not the figure, or (a constant) no place named in `used` applies it."""
    place = fig.get("constant") or fig["literal"]
    want = fig["value"]
    try:
        if "literal" in fig:
            found = claims_code.literals(place)
            if not any(same(f, want) for f in found):
                return f"{fig['figure']!r}: no {want!r} written in {place}"
        elif not same(got := claims_code.constant(place), want):
            return f"{fig['figure']!r}: {place} is {got!r}, not {want!r}"
    except claims_code.NotFound as e:
        return f"{fig['figure']!r}: {e}"
    size = unit_size(fig.get("unit", ""))
    values = want if isinstance(want, list) else [want]
    if isinstance(want, str):  # a command-line default as written: '100GiB', '8g'
        if fig["figure"].replace(" ", "") != want:
            return f"{fig['figure']!r} is not {want!r}"
    elif not any(
        math.isclose(v * size, in_units(fig["figure"], fig.get("means")), rel_tol=1e-9) for v in values
    ):
        return f"{fig['figure']!r} is not {want!r}{' ' + fig['unit'] if 'unit' in fig else ''}"
    if "literal" in fig:
        return None  # written where it is applied
    if (unread := claims_code.parameter_read(place)) is not None:
        return f"{fig['figure']!r}: {unread}"
    uses = [u for u in fig.get("used", []) if isinstance(u, str)]
    if not uses and not claims_code.is_parameter(place):
        return f"{fig['figure']!r}: {place} needs `used`: the code that applies it"
    name = claims_code.split(place)[1][-1]
    for use in uses:
        if (why := claims_code.applied(use, name)) is not None:
            return f"{fig['figure']!r}: not applied where it is used: {why}"
    return used(fig)


def same(got: Any, want: Any) -> bool:
    if isinstance(want, list):
        return isinstance(got, tuple) and len(got) == len(want) and all(map(same, got, want))
    if isinstance(want, float) or isinstance(got, float):
        return isinstance(got, int | float) and math.isclose(got, want, rel_tol=1e-12)
    return bool(got == want and type(got) is type(want))


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
    if "constant" in fig or "literal" in fig:
        return code_problem(fig)
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
        if isinstance(where, str):
            continue  # a place in Python, read by code_problem
        path = ROOT / where["source"]
        if not path.is_file() or not re.search(where["regex"], path.read_text(), re.M):
            return f"{fig['figure']!r}: not applied where it is used: {where['regex']!r} finds nothing in {where['source']}"
    return None


def check(readme: str, claims: dict[str, Any]) -> list[str]:
    """Every problem: a figure of README.md no claim covers, a claim whose text is gone, a
    figure its source contradicts, a block no longer verbatim in its record."""
    text = readme_text(readme)
    covered: list[tuple[int, int, set[str]]] = []
    problems = []
    for claim in claims["claims"]:
        said = normal(claim["readme"])
        # the same passage may stand on several pages (a default in README.md and --help)
        spans = [(m.start(), m.end()) for m in re.finditer(re.escape(said), text)]
        if not spans:
            problems.append(f"not in README.md or docs/ any more: {said[:90]!r}")
            continue
        if "illustration" in claim or "quoted" in claim:
            covered += [(a, b, {"*"}) for a, b in spans]
            continue
        if "verbatim" in claim:
            block = normal(claim["readme"])
            if block not in normal((ROOT / claim["verbatim"]).read_text()):
                problems.append(f"not verbatim in {claim['verbatim']}: {said[:90]!r}")
            covered += [(a, b, {"*"}) for a, b in spans]
            continue
        figures = claim.get("figures", [])
        for fig in figures:
            if fig["figure"] not in said:
                problems.append(f"{fig['figure']!r} is not in its claim {said[:90]!r}")
            elif why := problem(fig):
                problems.append(f"{said[:60]!r}: {why}")
        covered += [(a, b, {f["figure"] for f in figures}) for a, b in spans]
    for m in FIGURE.finditer(text):
        if not any(a <= m.start() < b and ("*" in figs or m.group() in figs) for a, b, figs in covered):
            problems.append(
                f"a figure docs/claims.yaml does not back: {text[max(0, m.start() - 60) : m.end() + 20]!r}"
            )
    return problems


def test_every_readme_figure_and_version_holds() -> None:
    problems = check(readme_text(), table())
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("table_too", [False, True], ids=["README alone", "README and table"])
def test_a_figure_edited_away_from_its_record_fails(table_too: bool) -> None:
    """0.97x is the root cache record's warm-run ratio: written as 0.90x it fails, whether the
    table's text is left as it was (the claim is gone) or edited along (the record says 0.97)."""
    old, new = "the whole warm run 0.97x", "the whole warm run 0.90x"
    readme = readme_text()
    assert old in readme
    claims = table()
    if table_too:
        for claim in claims["claims"]:
            claim["readme"] = normal(claim["readme"]).replace(old, new)
            for fig in claim.get("figures", []):
                fig["figure"] = fig["figure"].replace("0.97x", "0.90x")
    problems = check(normal(readme).replace(old, new), claims)
    record = "benchmarks/records/2026-12-01-1629-bench_root_cache.json"
    expected = f"'0.90x': {record} says 0.97" if table_too else "not in README.md or docs/ any more"
    assert any(expected in p for p in problems), problems


def test_a_new_figure_without_a_source_fails() -> None:
    problems = check(readme_text() + " It is 2.5x faster than X.", table())
    assert any("2.5x" in p and "does not back" in p for p in problems), problems


def entries(figure: str) -> list[dict[str, Any]]:
    """The table's `constant` entries for a figure."""
    return [
        f
        for c in table()["claims"]
        for f in c.get("figures", [])
        if f["figure"] == figure and "constant" in f
    ]


# Realistic bugs in the code behind a documented limit or default, each with the figure whose
# entry must then fail and why: the constant changed, the limit widened or dropped at the call
# that applies it (the constant left as it was), a default no longer read.
MUTANTS = [
    (
        "64 KiB",
        "src/imagegate/oci/registry.py",
        "MAX_ERROR_BYTES = 64 << 10",
        "MAX_ERROR_BYTES = 640 << 10",
        "is 655360, not 65536",
    ),
    (
        "64 KiB",
        "src/imagegate/oci/registry.py",
        "read_capped(resp, MAX_ERROR_BYTES,",
        "read_capped(resp, 1 << 30,",
        "no call read_capped",
    ),
    (
        "64 KiB",
        "src/imagegate/oci/registry.py",
        "read_capped(resp, MAX_ERROR_BYTES,",
        "read_capped(resp, MAX_ERROR_BYTES * 16,",
        "no call",
    ),
    (
        "1 MiB",
        "src/imagegate/oci/registry.py",
        "            MAX_TOKEN_BYTES,\n",
        "            MAX_MANIFEST_BYTES,\n",
        "no call read_capped",
    ),
    ("16 MiB", "src/imagegate/attest/attach.py", "min(MAX_ENVELOPE_BYTES, left)", "left", "no call min"),
    (
        "100 GiB",
        "src/imagegate/cli/cache.py",
        '    "100GiB", "--max-size",',
        '    "1TiB", "--max-size",',
        "'1TiB'",
    ),
    (
        "10 minutes",
        "src/imagegate/kube/podrun.py",
        "waits.clock() + waits.gone_timeout_s",
        "waits.clock() + 3600",
        "not referred to",
    ),
    (
        "15 s",
        "src/imagegate/report/progress.py",
        "console, every\n        self._next = every",
        "console, 60.0\n        self._next = 60.0",
        "never reads",
    ),
    ("1 %", "probes/gpu_worker.py", '"tolerance": TOLERANCE,', '"tolerance": 0.1,', "not referred to"),
    (
        "256",
        "src/imagegate/attest/attach.py",
        "if n > MAX_ATTESTATIONS:",
        "if n > 100 * MAX_ATTESTATIONS:",
        "not itself compared",
    ),
    (
        "4.8 TB/s",
        "probes/gpu_preflight.py",
        '"H200": {"bf16_tflops": 989.0, "hbm_gbps": 4800.0',
        '"H200": {"bf16_tflops": 989.0, "hbm_gbps": 3350.0',
        "is 3350.0, not 4800.0",
    ),
    (
        "8g",
        "src/imagegate/cli/_accept.py",
        'Option("8g", "--memory"',
        'Option("4g", "--memory"',
        "is '4g', not '8g'",
    ),
    (
        "2 minutes",
        "src/imagegate/kube/podrun.py",
        "FINISH_GRACE_S = 120.0",
        "FINISH_GRACE_S = 60.0",
        "is 60.0, not 120.0",
    ),
    (
        "2 s",
        "src/imagegate/_support/deadline.py",
        "d.remaining() + GRACE_S",
        "d.remaining() + 30",
        "not referred to",
    ),
    (
        "2 GB",
        "benchmarks/bench_layers.py",
        "if args.size < MIN_SIZE_GB:",
        "if args.size < 0:",
        "compared",
    ),
]


@pytest.mark.parametrize(
    ("figure", "path", "old", "new", "why"), MUTANTS, ids=[f"{m[0]}: {m[4]}" for m in MUTANTS]
)
def test_a_limit_changed_or_no_longer_applied_fails(
    figure: str, path: str, old: str, new: str, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each mutant of the code behind a documented limit makes its entry fail, naming why; the
    code as it is passes."""
    target = ROOT / path
    figs = entries(figure)
    assert figs and all(problem(f) is None for f in figs)
    text = target.read_text()
    assert text.count(old) == 1, old
    real = claims_code.source
    monkeypatch.setattr(claims_code, "source", lambda p: text.replace(old, new) if p == target else real(p))
    problems = [problem(f) or "" for f in figs]
    assert any(why in p for p in problems), problems


def test_a_figure_edited_away_from_its_constant_fails() -> None:
    """'64 KiB of an error' written as 128 KiB, the table edited along: the code's 65536 is not
    128 KiB."""
    (fig,) = [f for f in entries("64 KiB") if f["constant"].endswith("MAX_ERROR_BYTES")]
    assert problem(fig) is None
    assert problem({**fig, "figure": "128 KiB"}) == "'128 KiB' is not 65536"


def test_a_module_constant_without_its_use_fails() -> None:
    """An entry that names a module's constant but not the code applying it is refused: a value
    defined and never used promises nothing."""
    (fig,) = [f for f in entries("64 KiB") if f["constant"].endswith("MAX_ERROR_BYTES")]
    assert "needs `used`" in (problem({k: v for k, v in fig.items() if k != "used"}) or "")


@pytest.mark.parametrize(
    "said",
    [
        "a 512 KiB buffer",
        "at 2 GB/s",
        "on 3 cores",
        "in 30 min",
        "every 5m",
        "after two minutes",
        "at 1530 MHz",
        "a 8g limit",
        "limits 512Mi",
        "for 2 weeks",
        "within 5 ms",
        "up to 40 %",
        "3 days old",
    ],
)
def test_a_new_figure_of_any_unit_without_a_source_fails(said: str) -> None:
    problems = check(f"It takes {said}.", {"claims": []})
    assert any("does not back" in p and said in p for p in problems), problems


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
