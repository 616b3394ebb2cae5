"""The mutation score of the modules behind the signature's promises, with cosmic-ray.

    python scripts/mutation.py gpu_worker rootfs_reuse      # mutation/<name>.toml each
    python scripts/mutation.py --all                         # every mutation/*.toml
    python scripts/mutation.py --record FILE gpu_worker      # the scores, merged into FILE (JSON)
    python scripts/mutation.py --check                       # is every recorded score still this code's?

Each mutation/<name>.toml is a cosmic-ray config (its `[cosmic-ray]` table: the module and the
test files that cover it) plus imagegate's own table: the functions to mutate (the ones that carry
a documented promise; the rest of the module waits for time) and the equivalent mutants, each
with why it changes nothing a user can see. cosmic-ray rewrites the module on disk for each
mutant, so a mutated probe reaches the image or sandbox it is copied into; a mutant switched by an
environment variable (mutmut 3's trampoline) would not cross into the container.

The score is killed / (all - equivalent); a mutant whose tests time out counts as killed (it
broke the run), one that does not even import as killed too (cosmic-ray's "incompetent").
Exit 0 when every module reached its goal, 1 when one did not, 3 on a usage error.

`--check` runs nothing: it reads the records (benchmarks/records/*-mutation*.json, the newest
entry per config) and says, per mutation/<name>.toml, whether its score still stands: recorded,
at or above the goal, for the functions the config names, and none of those functions changed
since the recorded commit (their source compared, so an edit elsewhere in the module keeps the
score). Exit 1 names each score that no longer stands and the command that measures it again
(tests/test_mutation_records.py runs the check in CI, so a score cannot fall silently).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "mutation"
GOAL = 0.90
# Where a module that a record names lives now: the loose modules moved into the rings
# (usecases, domain, _support), the fleet's into one package. The check follows the move and still compares the functions'
# source, so a moved module keeps its score only while those functions read the same.
MOVED = {
    f"src/imagegate/{old}.py": f"src/imagegate/{new}.py"
    for old, new in {
        "complete": "usecases/complete",
        "runner": "usecases/runner",
        "fleet": "fleet/judge",
        "domain/fleet": "fleet/judge",
        "attest/nodecheck": "fleet/node_statement",
        "kube/fleetrun": "fleet/jobs",
        "oci/digest": "domain/digest",
        "model": "domain/results",
        "gpus": "domain/gpus",
        "deadline": "_support/deadline",
        "interrupts": "_support/interrupts",
        "rootfs/model": "rootfs/root",
        "vulns/model": "vulns/findings",
        "pipeline/model": "pipeline/spec",
    }.items()
}
# Operators left out everywhere, to keep a module's run within its budget on 2 cores: a binary
# operator turned into each of the other twelve mostly repeats "this arithmetic is wrong" (the
# swaps that matter, + and -, * and /, stay); `is` for `==` is the same comparison on the small
# ints and interned strings these modules compare; the variable operators need per-name arguments.
EXCLUDED_OPERATORS = (
    r"core/ReplaceBinaryOperator_(?!Add_Sub|Sub_Add|Mul_Div|Div_Mul|FloorDiv_Mul)",
    r"core/ReplaceComparisonOperator_\w+_(Is|IsNot)$",
    r"core/ReplaceComparisonOperator_(Is|IsNot)_(?!Is|IsNot|Eq|NotEq)",
    r"core/Variable",
)


def _cosmic_ray(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "cosmic_ray.cli", *args], check=True, cwd=ROOT)


def _source_line(module: Path, line: int) -> str:
    return module.read_text().splitlines()[line - 1].strip()


def _is_equivalent(mutant: dict[str, Any], equivalent: list[dict[str, Any]]) -> str | None:
    """The reason given for an equivalent mutant, matched by function, operator and the line's
    text (not its number or occurrence, which move whenever the module is edited)."""
    for known in equivalent:
        if (
            known["function"] == mutant["function"]
            and known["operator"] == mutant["operator"]
            and known["line"] == mutant["line"]
        ):
            return str(known["why"])
    return None


def run(name: str) -> dict[str, Any]:
    import toml  # cosmic-ray's own TOML reader and writer (a dependency of it)
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    config = toml.loads((CONFIGS / f"{name}.toml").read_text())
    ours, theirs = config["imagegate"], config["cosmic-ray"]
    module = ROOT / theirs["module-path"]
    # The tests run with this interpreter (the worktree's own install), whatever `python` is first on PATH.
    argv = shlex.split(theirs["test-command"])
    if argv[0] == "python":
        argv[0] = sys.executable
    theirs["test-command"] = shlex.join(argv)
    excluded = re.compile("|".join(f"(?:{e})" for e in EXCLUDED_OPERATORS))
    functions = set(ours["functions"])
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        cfg, db = Path(tmp, "config.toml"), Path(tmp, "session.sqlite")
        cfg.write_text(toml.dumps({"cosmic-ray": theirs}))
        _cosmic_ray("init", str(cfg), str(db))
        with use_db(str(db), WorkDB.Mode.open) as work_db:
            for item in work_db.pending_work_items:
                spec = item.mutations[0]
                if spec.definition_name not in functions or excluded.match(spec.operator_name):
                    work_db.set_result(
                        item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="not in scope")
                    )
        pending = len(WorkDB(str(db), WorkDB.Mode.open).pending_work_items)
        print(f"{name}: {pending} mutants of {', '.join(sorted(functions))}", file=sys.stderr, flush=True)
        _cosmic_ray("exec", str(cfg), str(db))
        with use_db(str(db), WorkDB.Mode.open) as work_db:
            done = work_db.completed_work_items
    mutants = []
    for item, result in done:
        if result.worker_outcome == WorkerOutcome.SKIPPED:
            continue
        spec = item.mutations[0]
        mutant = {
            "function": spec.definition_name,
            "operator": spec.operator_name,
            "line": _source_line(module, spec.start_pos[0]),
            "lineno": spec.start_pos[0],
            "outcome": str(result.test_outcome.value if result.test_outcome else result.worker_outcome.value),
        }
        if result.test_outcome is not None and result.test_outcome.value == "survived":
            mutant["diff"] = result.diff
            why = _is_equivalent(mutant, ours.get("equivalent", []))
            if why is not None:
                mutant["outcome"], mutant["why"] = "equivalent", why
        mutants.append(mutant)
    counted = [m for m in mutants if m["outcome"] != "equivalent"]
    killed = [m for m in counted if m["outcome"] in ("killed", "incompetent")]
    errors = [m for m in counted if m["outcome"] not in ("killed", "incompetent", "survived")]
    score = len(killed) / len(counted) if counted else 1.0
    return {
        "module": theirs["module-path"],
        "functions": sorted(functions),
        "tests": theirs["test-command"].split(" -p no:cacheprovider ", 1)[-1],
        "all": len(mutants),
        "equivalent": len(mutants) - len(counted),
        "killed": len(killed),
        "survived": len(counted) - len(killed) - len(errors),
        "not_run": len(errors),
        "score": round(score, 4),
        "goal": GOAL,
        "passed": score >= GOAL,
        "survivors": sorted(
            (m for m in mutants if m["outcome"] != "killed" and m["outcome"] != "incompetent"),
            key=lambda m: m["lineno"],
        ),
    }


def markdown(record: dict[str, Any]) -> str:
    """The record in words: a row per module, then every mutant not killed, with why."""
    out = [
        "# Mutation score",
        "",
        f"{record['tool']}, `{record['command']}`. Score: killed ÷ (all − equivalent); goal ≥ {GOAL:.0%}.",
        "",
        "| module | functions mutated | tests run | commit, tree | killed / counted | score | goal |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in record["modules"].values():
        tree = "dirty" if r["dirty"] else "clean"
        out.append(
            f"| {r['module']} | {', '.join(r['functions'])} | {r['tests']} | {r['commit']}, {tree} | "
            f"{r['killed']} / {r['all'] - r['equivalent']} ({r['equivalent']} equivalent) | "
            f"{r['score']:.1%} | {'PASS' if r['passed'] else 'FAIL'} |"
        )
    import toml

    out += ["", "## The promises, and the test that fails when each is broken", ""]
    for name in record["modules"]:
        config = CONFIGS / f"{name}.toml"
        promises = toml.loads(config.read_text())["imagegate"].get("promises", []) if config.is_file() else []
        out += [f"- {name}: “{p['said']}”: `{p['test']}`" for p in promises]
    for name, r in record["modules"].items():
        if not r["survivors"]:
            continue
        out += ["", f"## {name}: not killed", ""]
        for m in r["survivors"]:
            why = f": {m['why']}" if "why" in m else ""
            out.append(
                f"- {m['outcome']}, `{m['function']}` line {m['lineno']}, {m['operator']}: `{m['line']}`{why}"
            )
    return "\n".join(out) + "\n"


def _commit() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()

    # The records this run writes are not the tree it tests.
    changed = git("status", "--porcelain", "--", ".", ":(exclude)benchmarks/records")
    return {"commit": git("rev-parse", "--short", "HEAD"), "dirty": bool(changed)}


RECORDS = ROOT / "benchmarks" / "records"


class _Behaviour(ast.NodeTransformer):
    """A function as it behaves: its type annotations and docstrings dropped, since no mutant
    of the code depends on them (typing a function keeps its score; changing a line does not)."""

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def _body(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> ast.AST:
        self.generic_visit(node)
        first = node.body[0] if node.body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            node.body = node.body[1:] or [ast.Pass()]
        if not isinstance(node, ast.ClassDef):
            node.returns = None
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _body

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is None:
            return ast.Pass()
        return ast.Assign(targets=[node.target], value=self.visit(node.value), lineno=node.lineno)


def _functions_source(text: str, names: set[str]) -> dict[str, list[str]]:
    """Each named function's (or class's) behaviour (_Behaviour), every definition of that name in
    the module."""
    found: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in names:
            found.setdefault(node.name, []).append(ast.dump(_Behaviour().visit(node)))
    return found


def newest_scores() -> dict[str, dict[str, Any]]:
    """Per config name, its newest recorded score (by when it was measured)."""
    newest: dict[str, dict[str, Any]] = {}
    for path in sorted(RECORDS.glob("*-mutation*.json")):
        for name, r in json.loads(path.read_text())["modules"].items():
            if name not in newest or r["at"] > newest[name]["at"]:
                newest[name] = {**r, "record": path.name}
    return newest


def check() -> list[str]:
    """What no longer stands: one line per config whose recorded score is missing, below the goal,
    for other functions, or for functions changed since it was measured."""
    import tomllib  # the check runs in CI's environment, without the mutation extra

    problems = []
    scores = newest_scores()
    for config in sorted(CONFIGS.glob("*.toml")):
        name = config.stem
        rerun = f"re-run: python scripts/mutation.py --record benchmarks/records/DATE-mutation.json {name}"
        cfg = tomllib.loads(config.read_text())
        functions = set(cfg["imagegate"]["functions"])
        r = scores.get(name)
        if r is None:
            problems.append(f"{name}: no recorded score; {rerun}")
            continue
        if not r["passed"] or r["dirty"]:
            why = "below the goal" if not r["passed"] else "measured on uncommitted changes"
            problems.append(f"{name}: the score in {r['record']} is {why}; {rerun}")
            continue
        module_now = MOVED.get(r["module"], r["module"])
        if set(r["functions"]) != functions or module_now != cfg["cosmic-ray"]["module-path"]:
            problems.append(f"{name}: {r['record']} measured other functions than the config names; {rerun}")
            continue
        then = subprocess.run(
            ["git", "show", f"{r['commit']}:{r['module']}"], cwd=ROOT, capture_output=True, text=True
        )
        if then.returncode != 0:
            problems.append(
                f"{name}: commit {r['commit']} of {r['record']} is not in this clone (a full clone has it)"
            )
            continue
        now = (ROOT / module_now).read_text()
        old, new = _functions_source(then.stdout, functions), _functions_source(now, functions)
        changed = sorted(f for f in functions if old.get(f) != new.get(f))
        if changed:
            problems.append(
                f"{name}: {', '.join(changed)} changed in {module_now} since {r['commit']} ({r['record']}); {rerun}"
            )
    return problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="names of mutation/<name>.toml")
    parser.add_argument("--all", action="store_true", help="every mutation/*.toml")
    parser.add_argument("--record", type=Path, help="merge the scores into this JSON record")
    parser.add_argument(
        "--check", action="store_true", help="run nothing: does every recorded score still stand?"
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for line in problems:
            print(f"mutation: {line}", file=sys.stderr)
        if not problems:
            print(f"mutation: every score stands ({len(list(CONFIGS.glob('*.toml')))} configs)")
        return 1 if problems else 0
    names = sorted(p.stem for p in CONFIGS.glob("*.toml")) if args.all else args.modules
    unknown = [n for n in names if not (CONFIGS / f"{n}.toml").is_file()]
    if not names or unknown:
        configs = ", ".join(sorted(p.stem for p in CONFIGS.glob("*.toml")))
        problem = f"no config mutation/{unknown[0]}.toml" if names else "no module named"
        print(f"mutation: {problem}; name one of: {configs} (or --all)", file=sys.stderr)
        return 3
    try:
        import cosmic_ray  # noqa: F401
    except ImportError:
        print(
            "mutation: cosmic-ray is not installed; install the extra: pip install -e '.[test,mutation]'",
            file=sys.stderr,
        )
        return 3
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    results = {}
    for name in names:
        where = _commit()  # each module's own: the tree may be committed to between modules
        results[name] = {
            **run(name),
            **where,
            "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        r = results[name]
        print(
            f"{name}: {r['killed']}/{r['all'] - r['equivalent']} killed ({r['score']:.0%}), "
            f"{r['equivalent']} equivalent, {r['survived']} survived",
            flush=True,
        )
        for m in r["survivors"]:
            print(
                f"  {m['outcome']}: {m['function']} line {m['lineno']} {m['operator']}: {m['line']}",
                flush=True,
            )
        if args.record:
            old = json.loads(args.record.read_text()) if args.record.is_file() else {"modules": {}}
            old["tool"] = "cosmic-ray " + __import__("importlib.metadata").metadata.version("cosmic-ray")
            old["command"] = "python scripts/mutation.py --record FILE MODULE..."
            old["modules"][name] = r
            args.record.write_text(json.dumps(old, indent=2) + "\n")
            args.record.with_suffix(".md").write_text(markdown(old))
    return 0 if all(r["passed"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
