"""The admission policies shipped with imagegate (data/policies/, in an installed imagegate its
_data/policies: it carries the policies of its own version) and how `imagegate policies
write` fills them in: the public key, the images to guard, the freshness bound.

Each file is written so that a user can also fill it by hand (its comments say what to replace):
the key placeholder block, the example pattern `registry.example/`, the bound 168h, and
policy-controller's NOT_BEFORE. Filling replaces exactly those, and refuses a file that lacks one
(a policy edited without this module)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from imagegate._support import resources
from imagegate.errors import InternalError, UsageError
from imagegate.policies.attestors import (
    Signer,
    cluster_image_policy,
    cluster_policy,
    describe,
    image_validating_policy,
)


@dataclass(frozen=True)
class Policy:
    name: str  # the file's stem
    controller: str
    enforces: str


POLICIES = (
    Policy("kyverno-clusterpolicy", "Kyverno <= 1.19", "a fresh VSA per Pod"),
    Policy("kyverno-imagevalidatingpolicy", "Kyverno >= 1.17", "the same, in CEL"),
    Policy("policy-controller-clusterimagepolicy", "policy-controller", "the same; write daily"),
)
# What every one of them enforces, said once under the list.
ENFORCES = (
    "Each admits a Pod only if its image has an SLSA VSA signed by your key that\n"
    "passed at level IMAGEGATE_CPU (IMAGEGATE_GPU for a Pod that can reach a GPU),\n"
    "verified within --max-age (168h). policy-controller's bound is a date in the\n"
    "file (NOT_BEFORE): write that policy again each day."
)
NAMES = tuple(p.name for p in POLICIES)
# Each policy's key attestor rewritten as a keyless one (policies/attestors.py).
_KEYLESS = {
    "kyverno-clusterpolicy": cluster_policy,
    "kyverno-imagevalidatingpolicy": image_validating_policy,
    "policy-controller-clusterimagepolicy": cluster_image_policy,
}

PLACEHOLDER = "REPLACE WITH THE CONTENTS OF imagegate.pub"
_KEY_BLOCK = re.compile(
    rf"^( *)-----BEGIN PUBLIC KEY-----\n *{re.escape(PLACEHOLDER)}\n *-----END PUBLIC KEY-----$", re.M
)
# The example images as each controller writes a pattern: Kyverno's `*` matches any characters,
# slashes too; policy-controller's glob needs `**` for that (its `*` stops at a slash).
_EXAMPLE = '"registry.example/*"'
_EXAMPLE_PC = '"registry.example/**"'
_PATTERN = re.compile(r"[A-Za-z0-9._/:@*?-]+")
_SHIPPED_AGE = "168h"
_FLOOR = "NOT_BEFORE"


def text(name: str) -> str:
    """The shipped policy `name` (a NAMES entry) as it is in the package."""
    return (resources.policies_dir() / f"{name}.yaml").read_text(encoding="utf-8")


def check_names(names: list[str]) -> list[str]:
    """`names` in NAMES' order, all of them when none is given; an unknown one is refused."""
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise UsageError(f"no shipped policy {unknown[0]!r}", hint=f"one of {', '.join(NAMES)}")
    return [n for n in NAMES if n in names or not names]


def check_pattern(pattern: str) -> str:
    """An image pattern, as Kyverno reads it (`*` any characters, slashes too; `?` one)."""
    if not pattern.strip():
        raise UsageError("--image: the image pattern is empty", hint="e.g. --image 'registry.example/team/*'")
    if not _PATTERN.fullmatch(pattern):
        raise UsageError(
            f"--image {pattern!r}: not an image pattern",
            hint="letters, digits, . _ - / : @ and the wildcards * and ?, e.g. 'registry.example/team/*'",
        )
    return re.sub(r"\*+", "*", pattern)


def go_duration(age: timedelta) -> str:
    """`age` as Kyverno's time_since and CEL's duration() read it: whole hours, minutes or seconds."""
    seconds = int(age.total_seconds())
    if seconds <= 0 or seconds != age.total_seconds():
        raise UsageError(
            f"--max-age {age}: not a whole, positive number of seconds",
            hint="a policy needs a bound: e.g. 168h, 7d, 90m",
        )
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True)
class Filling:
    """What a written policy says in place of the shipped placeholders."""

    pem: str | None  # the public key, PEM (SubjectPublicKeyInfo); None when keyless
    pattern: str  # checked by check_pattern
    max_age: timedelta
    now: datetime  # UTC: policy-controller's NOT_BEFORE is now - max_age
    version: str
    keyless: Signer | None = None  # who must have signed, instead of a key

    @property
    def floor(self) -> str:
        return (self.now - self.max_age).strftime("%Y-%m-%dT%H:%M:%SZ")


def _replace(text: str, old: str, new: str, name: str) -> str:
    if old not in text:
        raise InternalError(f"shipped policy {name}: {old!r} is not in it to fill in")
    return text.replace(old, new)


def _header(name: str, f: Filling, age: str) -> str:
    whose = "your key" if f.keyless is None else "keyless"
    lines = [
        f"# written by imagegate {f.version} (imagegate policies write {name}): {whose}, the images",
        f"# {f.pattern}, VSAs verified within {age}.",
    ]
    if f.keyless is not None:
        lines.append(f"# Signed by {describe(f.keyless)}.")
        if name == "kyverno-clusterpolicy":
            lines.append(
                "# Its trusted root: the one Kyverno's TUF serves (the controller's --tufMirror, --tufRoot)."
            )
    if name.startswith("policy-controller"):
        lines.append(f"# NOT_BEFORE is rendered to {f.floor} (now - {age}): write this file again each day.")
    return "\n".join(lines) + "\n"


def fill(name: str, f: Filling) -> str:
    """The shipped policy `name` filled in with `f`, under a header naming imagegate's version."""
    body = text(name)
    if not _KEY_BLOCK.search(body):
        raise InternalError(f"shipped policy {name}: no public-key placeholder to fill in")
    if f.keyless is not None:
        body = _KEYLESS[name](body, f.keyless, name)
    else:
        key_lines = (f.pem or "").strip().splitlines()
        body = _KEY_BLOCK.sub(lambda m: "\n".join(m.group(1) + line for line in key_lines), body)
    age = go_duration(f.max_age)
    if name.startswith("policy-controller"):
        pc_pattern = json.dumps(f.pattern.replace("*", "**"))
        body = _replace(body, _EXAMPLE_PC, pc_pattern, name)
        body = _replace(body, f'>="{_FLOOR}"', f'>="{f.floor}"', name)
    else:
        body = _replace(body, _EXAMPLE, json.dumps(f.pattern), name)
        body = body.replace(f"{_SHIPPED_AGE} (7 days)", age)  # the comments' words for it
        body = _replace(body, _SHIPPED_AGE, age, name)
        body = body.replace("fresh within 7 days", f"fresh within {age}")
    return _header(name, f, age) + body


def write_files(texts: dict[str, str], folder: Path) -> list[Path]:
    """Each policy's text into folder/NAME.yaml (the folder made if missing)."""
    written = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, body in texts.items():
            path = folder / f"{name}.yaml"
            path.write_text(body, encoding="utf-8")
            written.append(path)
    except OSError as e:
        raise UsageError(
            f"--out {folder}: cannot write: {e.strerror}", hint="name a folder you can write"
        ) from e
    return written
