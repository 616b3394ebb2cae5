"""Sizes as options take them (--max-layer-size, --max-image-size, cache --max-size)."""

from __future__ import annotations

import pytest

from imagegate._support.sizes import gib, parse_size
from imagegate.errors import UsageError


@pytest.mark.parametrize(
    ("text", "expected"),
    [("64GiB", 64 << 30), ("500M", 500 << 20), ("1048576", 1 << 20), (" 2 kb ", 2048), ("1t", 1 << 40)],
)
def test_parse_size_binary_units(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["64 gigs", "1.5G", "-1M", ""])
def test_parse_size_refuses_what_is_not_a_size(text: str) -> None:
    with pytest.raises(UsageError, match=r"invalid size") as e:
        parse_size(text)
    assert e.value.hint == "write it like 64GiB, 500M or 1048576" and repr(text) in str(e.value)


def test_gib_for_sentences() -> None:
    assert gib(3 << 29) == "1.50 GiB"
