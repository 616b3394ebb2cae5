"""JSON as types: what a document read from a file or a server is before it is checked, and the
readers that narrow it. Code past a JSON edge holds typed values, never `Any`; an untrusted
field of the wrong kind reads as absent (these readers), never as a crash."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TypeAlias

JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None
JsonObject: TypeAlias = dict[str, JsonValue]
# For reading: covariant, so a dict[str, str] is one.
JsonMapping: TypeAlias = Mapping[str, object]


def obj(value: object) -> dict[str, object]:
    """`value` if it is a JSON object, else an empty one."""
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return value
    return {}


def items(value: object) -> list[object]:
    """`value` if it is a JSON array, else an empty one."""
    return list(value) if isinstance(value, list | tuple) else []


def objects(value: object) -> list[dict[str, object]]:
    """The objects of a JSON array (anything else in it is skipped)."""
    return [o for o in map(obj, items(value)) if o]


def text(value: object) -> str | None:
    """`value` if it is a string, else None."""
    return value if isinstance(value, str) else None


def integer(value: object) -> int | None:
    """`value` if it is an integer (a bool is not), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def number(value: object) -> float | None:
    """`value` if it is a number (a bool is not), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def strings(value: object) -> list[str]:
    """The strings of a JSON array (anything else in it is skipped)."""
    return [v for v in items(value) if isinstance(v, str)]


def path(value: object, *keys: str) -> object:
    """value[k1][k2]... through JSON objects; None where one is missing or not an object."""
    for key in keys:
        value = obj(value).get(key)
    return value


def freeze(value: object) -> JsonValue:
    """A plain JSON value from `value` (tuples to lists; anything not JSON as its str)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): freeze(v) for k, v in value.items()}
    if isinstance(value, Sequence):
        return [freeze(v) for v in value]
    return str(value)


def freeze_object(value: Mapping[str, object]) -> JsonObject:
    """A plain JSON object from a mapping (freeze, each value)."""
    return {str(k): freeze(v) for k, v in value.items()}


def canonical_json(obj: object) -> bytes:
    """A statement's bytes as they are signed and digested: keys sorted, no spaces, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()
