"""Where a documented limit or default lives in the code, and where the code applies it: read from
the syntax tree (ast), never imported, so a probe, a benchmark or a script is read the same way as
the package and nothing runs.

A place is `module:qualname`: the module dotted as it is imported (`imagegate.oci.registry`, found
under src/; `probes.serve`, `benchmarks.bench_serve` from the repository root), the qualname as
Python spells it (`MAX_ERROR_BYTES`, `RegistryClient._request`, `Limits.tmpfs_bytes`,
`Progress.__init__.every`), and for a mapping its keys (`LIMITS["H200"]["hbm_gbps"]`)."""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

Scope = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.LShift: operator.lshift,
    ast.Pow: operator.pow,
}


class NotFound(Exception):
    """A place the code no longer has, or an expression that is not a plain value."""


def module_file(module: str) -> Path:
    rel = Path(*module.split(".")).with_suffix(".py")
    for base in (ROOT / "src", ROOT):
        if (base / rel).is_file():
            return base / rel
    raise NotFound(f"no module {module} (neither src/{rel} nor {rel})")


def source(path: Path) -> str:
    """A file's text (the tests put a changed one in its place)."""
    return path.read_text()


_PARSED: dict[tuple[Path, str], ast.Module] = {}


def tree(module: str) -> ast.Module:
    path = module_file(module)
    text = source(path)
    if (path, text) not in _PARSED:  # each module is named by many entries
        _PARSED[path, text] = ast.parse(text)
    return _PARSED[path, text]


def split(place: str) -> tuple[str, list[str], list[str | int]]:
    """'m.n:A.b["k"][11]' -> ('m.n', ['A', 'b'], ['k', 11])."""
    module, _, qual = place.partition(":")
    path, _, keys = qual.partition("[")
    found = re.findall(r'\[(?:"([^"]*)"|(\d+))\]', "[" + keys) if keys else []
    return module, path.split("."), [text if not digits else int(digits) for text, digits in found]


def _child(scope: Scope, name: str) -> Scope | None:
    for node in scope.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node
    return None


def scope_of(module: ast.Module, names: list[str]) -> Scope:
    """The class or function a qualname names."""
    scope: Scope = module
    for name in names:
        found = _child(scope, name)
        if found is None:
            raise NotFound(f"no {'.'.join(names)}")
        scope = found
    return scope


def _assigned(scope: Scope, name: str) -> ast.expr | None:
    """The expression `name` is given in this scope's own body (a tuple assignment unpacked)."""
    for node in scope.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return node.value
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == name:
                    return node.value
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    for t, v in zip(target.elts, node.value.elts, strict=True):
                        if isinstance(t, ast.Name) and t.id == name:
                            return v
    return None


def _parameter_default(fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> ast.expr | None:
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    for arg, default in zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True):
        if arg.arg == name:
            return default
    for arg, kw_default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        if arg.arg == name:
            return kw_default
    return None


def definition(place: str) -> tuple[ast.Module, Scope, ast.expr]:
    """The module, the scope and the expression that give `place` its value: a module's or a
    class's assignment (a pydantic `Field(default=...)` or a typer `Option(default, ...)` gives its
    default), or a parameter's default."""
    module, names, _ = split(place)
    parsed = tree(module)
    scope = scope_of(parsed, names[:-1])
    if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
        expr = _parameter_default(scope, names[-1])
    else:
        expr = _assigned(scope, names[-1])
    if expr is None:
        raise NotFound(f"{place}: not assigned (or no such parameter default)")
    called = getattr(expr, "func", None)
    if isinstance(expr, ast.Call) and isinstance(called, ast.Name):
        if called.id == "Field":  # pydantic: the field's default
            expr = next((k.value for k in expr.keywords if k.arg == "default"), expr)
        elif called.id in ("Option", "Argument") and expr.args:  # typer: a command-line default
            expr = expr.args[0]
    return parsed, scope, expr


def value(expr: ast.expr, module: ast.Module) -> Any:
    """A plain value: literals, arithmetic on them, tuples, dicts, and the module's own names."""
    if isinstance(expr, ast.Constant):
        return expr.value
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
        return -value(expr.operand, module)
    if isinstance(expr, ast.BinOp) and type(expr.op) in _BINARY:
        return _BINARY[type(expr.op)](value(expr.left, module), value(expr.right, module))
    if isinstance(expr, ast.Tuple | ast.List):
        return tuple(value(e, module) for e in expr.elts)
    if isinstance(expr, ast.Dict):
        return {value(k, module): value(v, module) for k, v in zip(expr.keys, expr.values, strict=True) if k}
    if isinstance(expr, ast.Name) and (named := _assigned(module, expr.id)) is not None:
        return value(named, module)
    raise NotFound(f"not a plain value: {ast.unparse(expr)}")


def constant(place: str) -> Any:
    """What the code gives `place` (keys, if any, looked up in the mapping it is)."""
    parsed, _, expr = definition(place)
    got = value(expr, parsed)
    for key in split(place)[2]:
        got = got[key]
    return got


def literals(place: str) -> list[Any]:
    """Every plain value written in a function's body (a literal and arithmetic on literals)."""
    module, names, _ = split(place)
    parsed = tree(module)
    found = []
    for node in ast.walk(scope_of(parsed, names)):
        if isinstance(node, ast.Constant | ast.BinOp):
            try:
                found.append(value(node, parsed))
            except (NotFound, TypeError):
                continue
    return found


def _named(node: ast.AST, name: str) -> bool:
    """`name`, `module.name`, or "name" (a parameter read by its key from a mapping)."""
    return (
        (isinstance(node, ast.Name) and node.id == name)
        or (isinstance(node, ast.Attribute) and node.attr == name)
        or (isinstance(node, ast.Constant) and node.value == name)
    )


def _walk_code(node: ast.AST) -> list[ast.AST]:
    """The nodes under `node`, those of f-strings left out: a limit named in a message is not
    applied by it."""
    found: list[ast.AST] = []
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.JoinedStr):
            found += [child, *_walk_code(child)]
    return found


def _user(module: str, names: list[str]) -> ast.AST:
    """The function or class a use names, or a module-level statement assigning the name."""
    parsed = tree(module)
    try:
        return scope_of(parsed, names)
    except NotFound:
        if len(names) == 1 and (expr := _assigned(parsed, names[0])) is not None:
            return expr
        raise


def applied(use: str, name: str) -> str | None:
    """Why `use` does not apply `name`, or None. `use` is 'module:Qual.name' (the function, or
    the class, refers to `name` somewhere, its parameters' defaults included), 'module:Qual.name:
    compared' (a comparison there has `name` itself on one side: `n > LIMIT`, not `n > 2 * LIMIT`)
    or 'module:Qual.name: callee(arg)': a call to `callee` there is given `arg` (`name` when the
    parentheses are empty) itself as an argument, not some expression of it."""
    place, _, call = use.partition(": ")
    module, names, _ = split(place)
    try:
        scope = _user(module, names)
    except NotFound as e:
        return f"{use}: {e}"
    if not call:
        if any(_named(n, name) for n in _walk_code(scope)):
            return None
        return f"{name} is not referred to in {place} (a message naming it does not apply it)"
    if call == "compared":
        for node in _walk_code(scope):
            if isinstance(node, ast.Compare) and any(_named(o, name) for o in [node.left, *node.comparators]):
                return None
        return f"{name} is not itself compared with in {place}"
    callee, _, arg = call.rstrip(")").partition("(")
    arg = arg or name
    for node in ast.walk(scope):
        if (
            isinstance(node, ast.Call)
            and _named(node.func, callee.rpartition(".")[2])
            and any(_named(a, arg) for a in [*node.args, *(k.value for k in node.keywords)])
        ):
            return None
    return f"no call {callee}(…{arg}…) in {place}"


def parameter_read(place: str) -> str | None:
    """A parameter's default is applied only if the function reads the parameter."""
    module, names, _ = split(place)
    scope = scope_of(tree(module), names[:-1])
    if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    reads = [
        n for stmt in scope.body for n in ast.walk(stmt) if isinstance(n, ast.Name) and n.id == names[-1]
    ]
    return None if reads else f"{place}: the function never reads the parameter"


def is_parameter(place: str) -> bool:
    module, names, _ = split(place)
    return isinstance(scope_of(tree(module), names[:-1]), ast.FunctionDef | ast.AsyncFunctionDef)
