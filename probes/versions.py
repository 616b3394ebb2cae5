"""Just enough of PEP 440 to pick arguments by an installed version, without `packaging`.
Compares the release segment; a pre-release or dev release sorts before its release
(0.11.0rc1 < 0.11), a local label is ignored."""

from __future__ import annotations

import re

_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)(.*)$")


def parse(version: str):
    m = _RELEASE.match(version)
    if not m:
        raise ValueError(f"unparseable version {version!r}")
    release = [int(x) for x in m.group(1).split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    rest = m.group(2).split("+", 1)[0].lower()
    pre = bool(re.match(r"^[.\-_]?(a|b|c|rc|alpha|beta|pre|preview|dev)", rest))
    # (release, 0 for pre/dev so it sorts below the final release, 1 for final/post)
    return (tuple(release), 0 if pre else 1)


def matches(version: str, spec: str) -> bool:
    have = parse(version)
    for part in spec.split(","):
        m = re.match(r"^\s*(==|!=|>=|<=|>|<)\s*(\S+)\s*$", part)
        if not m:
            raise ValueError(f"bad specifier {part!r}")
        op, want = m.group(1), parse(m.group(2))
        # A bare "0.11" bound means the final release: 0.11.0rc1 is below >=0.11.
        ok = {
            "==": have[0] == want[0],
            "!=": have[0] != want[0],
            ">=": have >= want,
            "<=": have[0] <= want[0],
            ">": have[0] > want[0],
            "<": have < want,
        }[op]
        if not ok:
            return False
    return True
