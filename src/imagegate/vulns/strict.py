"""Readers that narrow an advisory's or an inventory's JSON (or YAML) where the audit uses a value
as a list or an object, failing as using it there always failed: a wrong kind is an error of the
stage (ERROR), never read as absent, so a malformed input cannot pass an audit that read nothing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from imagegate._support.jsontypes import JsonMapping


def _kind(value: object) -> str:
    """The type's name as Python's own messages give it (`int`, `datetime.date`)."""
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def iterated(value: object) -> Iterable[object]:
    """`value` as a for loop takes it; a number raises the TypeError iterating it raises."""
    if isinstance(value, Iterable):
        return value
    raise TypeError(f"'{_kind(value)}' object is not iterable")


def mapping(value: object, used: str = "get") -> JsonMapping:
    """`value` as an object whose method `used` is called; anything else raises the
    AttributeError calling it raises."""
    if isinstance(value, Mapping):
        return value
    raise AttributeError(f"'{_kind(value)}' object has no attribute '{used}'")
