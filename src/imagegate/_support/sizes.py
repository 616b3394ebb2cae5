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


# As the Docker SDK and engine read a memory limit: a number (decimals allowed), then one of
# b, k, m, g, optionally followed by b (`8g`, `8gb`, `512M`, `1.5g`); no `iB`, no `t`.
_MEMORY = re.compile(r"(\d+(?:\.\d+)?)(?:([kmg])b?|b)?", re.IGNORECASE)
MIN_MEMORY = 6 << 20  # engines refuse a smaller container memory limit


def parse_memory(text: str, option: str = "--memory") -> int:
    """A container memory limit, refused here as the engine would refuse it (before any work)."""
    m = _MEMORY.fullmatch(text.strip())
    if not m:
        raise UsageError(
            f"{option} {text!r}: not a memory size",
            hint="a number with an optional b, k, m or g suffix, e.g. 8g, 512m or 1073741824",
        )
    n = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
    if n < MIN_MEMORY:
        raise UsageError(f"{option} {text!r}: below the engines' minimum of 6m", hint="e.g. 8g or 512m")
    return n


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"
