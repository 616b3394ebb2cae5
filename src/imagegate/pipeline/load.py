"""Load pipeline files: YAML → strict model, with errors that name the file, the line, the key."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from imagegate import resources
from imagegate.errors import UsageError
from imagegate.pipeline.model import INSIDE_PROBES, OUTSIDE_PROBES, Pipeline

PROBE_TAGS = (*INSIDE_PROBES, *OUTSIDE_PROBES)


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
    raw = path.read_bytes()
    text = raw.decode("utf-8", errors="replace")
    return LoadedPipeline(parse(text, str(path)), source, hashlib.sha256(raw).hexdigest(), text)


def parse(text: str, filename: str = "<pipeline>") -> Pipeline:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{filename}:{mark.line + 1}" if mark is not None else filename
        raise UsageError(f"{where}: not valid YAML: {getattr(e, 'problem', e)}") from e
    if not isinstance(data, dict):
        raise UsageError(f"{filename}: a pipeline is a mapping with apiVersion: imagegate/v1 and stages")
    if data.get("apiVersion") != "imagegate/v1":
        line = _line_of(node, ("apiVersion",))
        raise UsageError(
            f"{filename}:{line}: apiVersion: expected 'imagegate/v1', got {data.get('apiVersion')!r}",
            hint="this imagegate reads imagegate/v1 pipelines",
        )
    try:
        return Pipeline.model_validate(data)
    except ValidationError as e:
        raise UsageError(_describe(e, node, filename)) from e


def _describe(err: ValidationError, node: yaml.Node | None, filename: str) -> str:
    lines = []
    for item in err.errors():
        loc = _yaml_loc(item["loc"])
        line = _line_of(node, loc)
        key = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in loc).replace(".[", "[")
        msg = item["msg"]
        if item["type"] == "extra_forbidden":
            msg = f"unknown key {loc[-1]!r}"
        elif item["type"] == "union_tag_invalid":
            bad = item["input"].get("probe") if isinstance(item["input"], dict) else item["input"]
            msg = f"unknown probe {bad!r}; known: {item['ctx']['expected_tags']}"
        lines.append(f"{filename}:{line}: {key or '(top)'}: {msg}")
    return "invalid pipeline:\n  " + "\n  ".join(lines)


def _yaml_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """Drop pydantic's union tag (…, 'stages', 2, 'cli', 'with', …) so the path follows the YAML."""
    out: list[Any] = []
    for i, part in enumerate(loc):
        if i >= 2 and loc[i - 2] == "stages" and isinstance(loc[i - 1], int) and part in PROBE_TAGS:
            continue
        out.append("with" if part == "with_" else part)
    return tuple(out)


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int:
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
