"""Load pipeline files: YAML → strict model, with errors that name the file, the line, the key."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from imagegate._support import resources
from imagegate._support.files import FileRefused, read_regular
from imagegate.errors import UsageError
from imagegate.pipeline.probes import PROBES
from imagegate.pipeline.spec import API_VERSION, Pipeline, StageGraphError

PROBE_TAGS = tuple(PROBES)
# Input bounds: a pipeline is a short file; beyond these it is a mistake or an attack, and is
# refused before it can cost a RecursionError or gigabytes of memory.
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_NODES = 100_000


@dataclass(frozen=True)
class LoadedPipeline:
    pipeline: Pipeline
    source: str  # "builtin:NAME" or the file path given
    sha256: str  # of the file's bytes
    text: str


def builtin_names() -> list[str]:
    return sorted(p.stem for p in resources.pipelines_dir().glob("*.yaml"))


def load(name_or_path: str) -> LoadedPipeline:
    """`-p` takes a built-in name or a file path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or "/" in name_or_path or path.exists():
        if not path.is_file():
            raise UsageError(
                f"pipeline file {name_or_path}: not found",
                hint=f"give a YAML file or a built-in name ({', '.join(builtin_names())})",
            )
        return _load_file(path, str(path))
    builtin = resources.pipelines_dir() / f"{name_or_path}.yaml"
    if not builtin.is_file():
        raise UsageError(
            f"pipeline {name_or_path!r}: no such built-in pipeline",
            hint=f"built-in pipelines: {', '.join(builtin_names())}; or give a path to a YAML file",
        )
    return _load_file(builtin, f"builtin:{name_or_path}")


def _load_file(path: Path, source: str) -> LoadedPipeline:
    try:
        raw = read_regular(path, max_bytes=MAX_FILE_BYTES)
    except OSError as e:
        raise UsageError(f"pipeline file {path}: cannot read it ({e.strerror})") from e
    except FileRefused as e:
        if "larger" not in str(e):
            raise UsageError(f"pipeline file {path}: cannot read it: {e}") from e
        raise UsageError(
            f"pipeline file {path}: larger than {MAX_FILE_BYTES // (1 << 20)} MiB",
            hint="a pipeline is a short list of stages; check that this is the file you meant",
        ) from e
    text = raw.decode("utf-8", errors="replace")
    return LoadedPipeline(parse(text, str(path)), source, hashlib.sha256(raw).hexdigest(), text)


def parse(text: str, filename: str = "<pipeline>") -> Pipeline:
    node, data = read_yaml(text, filename)
    if not isinstance(data, dict):
        raise UsageError(f"{filename}: a pipeline is a mapping with apiVersion: imagegate/v1 and stages")
    if data.get("apiVersion") != API_VERSION:
        line = line_of(node, ("apiVersion",))
        found = "missing" if "apiVersion" not in data else f"found {data['apiVersion']!r}"
        raise UsageError(
            f"{filename}:{line}: apiVersion: {found}, expected {API_VERSION!r}",
            hint=f"this imagegate reads {API_VERSION} pipelines",
        )
    try:
        return Pipeline.model_validate(data)
    except ValidationError as e:
        raise UsageError(_describe(e, node, filename)) from e


# A place in a YAML document (and in pydantic's errors): keys and list indexes, outermost first.
Loc: TypeAlias = tuple[int | str, ...]


def read_yaml(text: str, filename: str) -> tuple[yaml.Node | None, object]:
    """(node tree, data) of one YAML document written by a user: within the size, depth and
    alias bounds, no key twice in a mapping; anything else is a UsageError naming file and line."""
    if len(text) > MAX_FILE_BYTES:
        raise UsageError(f"{filename}: larger than {MAX_FILE_BYTES // (1 << 20)} MiB")
    node = _compose(text, filename)
    _check_tree(node, filename)
    if node is None:
        return None, None
    loader = yaml.SafeLoader(text)
    try:
        return node, loader.construct_document(node)
    except yaml.YAMLError as e:
        raise UsageError(_yaml_problem(e, filename)) from e
    finally:
        loader.dispose()


def _yaml_problem(e: yaml.YAMLError, filename: str) -> str:
    mark = getattr(e, "problem_mark", None)
    where = f"{filename}:{mark.line + 1}" if mark is not None else filename
    return f"{where}: not valid YAML: {getattr(e, 'problem', None) or e}"


def _compose(text: str, filename: str) -> yaml.Node | None:
    """The document's node tree. Nesting is measured on the event stream first (PyYAML's parser
    is iterative, its composer recursive): a deep file is an input error, not a RecursionError."""
    try:
        depth = 0
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    line = event.start_mark.line + 1 if event.start_mark else "?"
                    raise UsageError(
                        f"{filename}:{line}: nested more than {MAX_DEPTH} levels deep",
                        hint="a pipeline needs only a few levels; check that this is the file you meant",
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise UsageError(_yaml_problem(e, filename)) from e


def _check_tree(root: yaml.Node | None, filename: str) -> None:
    """Refuse duplicate keys (YAML would keep the last one silently: `requires: [gpu]` then
    `requires: []` makes a GPU stage a CPU one) and aliases that expand beyond a sane size or
    into themselves (a few lines of anchors can stand for billions of nodes)."""
    if root is None:
        return
    sizes: dict[int, int] = {}
    # Iterative post-order walk: (node, path, children done?).
    stack: list[tuple[yaml.Node, Loc, bool]] = [(root, (), False)]
    open_nodes: set[int] = set()
    while stack:
        node, path, done = stack.pop()
        if done:
            open_nodes.discard(id(node))
            children = _children(node)
            sizes[id(node)] = 1 + sum(sizes[id(c)] for _, c in children)
            if sizes[id(node)] > MAX_NODES:
                raise UsageError(
                    f"{filename}:{node.start_mark.line + 1}: expands to more than {MAX_NODES} values "
                    "(through anchors and aliases)",
                    hint="a pipeline needs far fewer; check that this is the file you meant",
                )
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_nodes:
            raise UsageError(f"{filename}:{node.start_mark.line + 1}: an alias refers to itself")
        open_nodes.add(id(node))
        stack.append((node, path, True))
        if isinstance(node, yaml.MappingNode):
            _check_duplicates(node, path, filename)
        for part, child in reversed(_children(node)):
            stack.append((child, (*path, part), False))


def _children(node: yaml.Node) -> list[tuple[int | str, yaml.Node]]:
    if isinstance(node, yaml.SequenceNode):
        return list(enumerate(node.value))
    if isinstance(node, yaml.MappingNode):
        out: list[tuple[int | str, yaml.Node]] = []
        for k, v in node.value:
            out.append(((k.value if isinstance(k, yaml.ScalarNode) else "?"), k))
            out.append(((k.value if isinstance(k, yaml.ScalarNode) else "?"), v))
        return out
    return []


def _check_duplicates(node: yaml.MappingNode, path: Loc, filename: str) -> None:
    first: dict[tuple[str, str], int] = {}
    for k, _ in node.value:
        if not isinstance(k, yaml.ScalarNode) or k.tag == "tag:yaml.org,2002:merge":
            continue  # `<<:` merges are meant to be overridden
        line = k.start_mark.line + 1
        if (k.tag, k.value) in first:
            raise UsageError(
                f"{filename}:{line}: {key_text((*path, k.value))}: duplicate key {k.value!r} "
                f"(first on line {first[(k.tag, k.value)]})",
                hint="YAML would silently keep only the last one; keep one of them",
            )
        first[(k.tag, k.value)] = line


def key_text(loc: Loc) -> str:
    return ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in loc).replace(".[", "[")


def _describe(err: ValidationError, node: yaml.Node | None, filename: str) -> str:
    lines = []
    for item in err.errors():
        error = (item.get("ctx") or {}).get("error")
        loc = error.loc if isinstance(error, StageGraphError) else _yaml_loc(item["loc"])
        line = line_of(node, loc)
        lines.append(f"{filename}:{line}: {key_text(loc) or '(top)'}: {message(item)}")
    return "invalid pipeline:\n  " + "\n  ".join(lines)


_KINDS = {
    "string": "text",
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "list": "a list",
    "dict": "a mapping",
    "model": "a mapping",
    "date": "a date (YYYY-MM-DD)",
}


_PATTERN_WORDS = {
    "id": "lowercase letters, digits and _, starting with a letter (at most 63)",
    "name": "letters, digits, '.', '_' and '-', starting with a letter or digit (at most 63)",
    "expect_config_digest": "sha256: and 64 lowercase hex digits",
}


def _found(value: object) -> str:
    if value is None:
        return "found nothing (an empty value)"
    if isinstance(value, dict):
        return "found a mapping"
    if isinstance(value, list):
        return "found a list"
    return f"found {value!r}"


def message(item: ErrorDetails) -> str:
    """pydantic's error in the product's words: what was expected, what was found."""
    kind, msg, ctx = item["type"], item["msg"], item.get("ctx") or {}
    loc = item["loc"]
    if kind == "extra_forbidden":
        return f"unknown key {loc[-1]!r}"
    if kind == "union_tag_invalid":
        bad = item["input"].get("probe") if isinstance(item["input"], dict) else item["input"]
        return f"unknown probe {bad!r}; known: {ctx['expected_tags']}"
    if kind == "union_tag_not_found":
        return f"missing key 'probe'; one of {', '.join(PROBE_TAGS)}"
    if kind == "missing":
        return "required, but missing"
    if kind == "value_error":
        return str(ctx.get("error", msg))
    base = kind.split("_")[0]
    if kind.endswith(("_type", "_parsing")) and base in _KINDS:
        return f"expected {_KINDS[base]}, {_found(item['input'])}"
    if kind == "literal_error":
        return f"expected {ctx.get('expected')}, {_found(item['input'])}"
    if kind == "string_pattern_mismatch":
        rule = _PATTERN_WORDS.get(str(loc[-1]), f"the pattern {ctx.get('pattern')}")
        return f"{item['input']!r} is not valid here: use {rule}"
    if kind == "too_short":
        return (
            "must not be empty"
            if ctx.get("min_length") == 1
            else f"needs at least {ctx.get('min_length')} items"
        )
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        words = {"greater_than_equal": "at least", "greater_than": "more than", "less_than_equal": "at most"}
        limit = next(iter(ctx.values()), "?")
        return f"must be {words.get(kind, 'less than')} {limit}, {_found(item['input'])}"
    return str(msg).replace("Input should be", "expected").replace("Value error, ", "")


def _yaml_loc(loc: Loc) -> Loc:
    """Drop pydantic's union tag (…, 'stages', 2, 'cli', 'with', …) so the path follows the YAML."""
    out: list[int | str] = []
    for i, part in enumerate(loc):
        if i >= 2 and loc[i - 2] == "stages" and isinstance(loc[i - 1], int) and part in PROBE_TAGS:
            continue
        out.append("with" if part == "with_" else part)
    return tuple(out)


def line_of(node: yaml.Node | None, loc: Loc) -> int:
    """1-based line of the deepest node along `loc` (the key's own line for mapping keys)."""
    line = node.start_mark.line + 1 if node is not None else 1
    for part in loc:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for k, v in node.value:
                if k.value == part:
                    line, node = k.start_mark.line + 1, v
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line
