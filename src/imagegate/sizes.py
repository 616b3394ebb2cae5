"""Byte sizes as users write them on the command line (`64GiB`, `500M`, `1048576`) and as
sentences show them."""

from __future__ import annotations

import re

from imagegate.errors import UsageError

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes; binary units (k, m, g, t), an optional `iB` or `B`, any case."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if not m:
        raise UsageError(f"invalid size {text!r}", hint="write it like 64GiB, 500M or 1048576")
    return int(m.group(1)) * _UNITS[m.group(2)]


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"
