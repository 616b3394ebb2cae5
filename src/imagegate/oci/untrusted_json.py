"""JSON from an image, an archive or a registry is untrusted: parsed with a size cap and a
nesting-depth check, so a hostile manifest is an input error, never a RecursionError from the
parser (CPython's recurses once per level) or gigabytes of memory."""

from __future__ import annotations

import json
import os
import re

from imagegate._support.files import FileRefused, read_regular

# Registries refuse manifests over 4 MiB; configs may be larger (long histories).
MAX_MANIFEST_BYTES = 4 << 20
MAX_DEPTH = 64  # OCI documents nest a handful of levels; configs a few more

_SPECIAL = re.compile(r'[\[\]{}"\\]')


class UntrustedJSONError(ValueError):
    """The document is too large, too deep, or not JSON; the message says which."""


def loads(raw: bytes | str, *, max_bytes: int = MAX_MANIFEST_BYTES, max_depth: int = MAX_DEPTH) -> object:
    """The parsed document, untrusted: the caller narrows what it reads (_support.jsontypes)."""
    if len(raw) > max_bytes:
        raise UntrustedJSONError(f"larger than {max_bytes} bytes ({len(raw)})")
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as e:
        raise UntrustedJSONError(f"not JSON (not UTF-8: {e})") from None
    if nesting_depth(text) > max_depth:
        raise UntrustedJSONError(f"nested more than {max_depth} levels deep")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise UntrustedJSONError(f"not JSON ({e})") from None


def read_file(path: str | os.PathLike[str], *, max_bytes: int) -> bytes:
    """A regular file's bytes, at most `max_bytes` of them read (a file that holds more raises
    UntrustedJSONError): never a FIFO or a device that would block or never end. OSError as is."""
    try:
        return read_regular(path, max_bytes=max_bytes)
    except FileRefused as e:
        raise UntrustedJSONError(str(e)) from None


def nesting_depth(text: str) -> int:
    """The deepest nesting of arrays and objects, outside strings; counted without recursion, in
    one pass over the characters that matter (a regular expression matching whole strings keeps
    a backtracking entry per character: gigabytes for a string of millions). On malformed text it
    may be off, which the parser then reports."""
    depth = deepest = 0
    in_string = False
    escaped = -1  # the index of a character a backslash escapes
    for m in _SPECIAL.finditer(text):
        i = m.start()
        if i == escaped:
            continue
        c = m.group()
        if in_string:
            if c == "\\":
                escaped = i + 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest
