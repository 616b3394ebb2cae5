"""Content digests (`algorithm:hex`), as the OCI image spec defines them."""

from __future__ import annotations

import hashlib
import re

from imagegate.errors import UsageError

# The registered algorithms of the OCI image spec; others are refused rather than guessed at.
_HEX_LEN = {"sha256": 64, "sha512": 128}
# A digest, as a regular expression (JSON Schema patterns take it as is); `is_digest` checks it.
PATTERN = "^(" + "|".join(f"{a}:[0-9a-f]{{{n}}}" for a, n in _HEX_LEN.items()) + ")$"
_DIGEST_RE = re.compile(PATTERN)


def is_digest(value: str) -> bool:
    """The one digest check: `sha256:` and 64 lowercase hex characters (or `sha512:` and 128)."""
    return _DIGEST_RE.fullmatch(value) is not None  # fullmatch: `$` alone lets a newline through


def short_digest(digest: str) -> str:
    """`sha256:0123456789ab…`: enough to tell digests apart in a sentence."""
    algo, _, hexd = digest.partition(":")
    return f"{algo}:{hexd[:12]}…" if hexd else digest


def check_digest(value: str, *, what: str = "digest") -> str:
    """Return `value` if it is a well-formed digest, else raise a UsageError naming `what`."""
    if not is_digest(value):
        raise UsageError(
            f"{what} {value!r} is not a digest",
            hint="write it as sha256: followed by 64 lowercase hex characters",
        )
    return value


def split_digest(value: str) -> tuple[str, str]:
    algorithm, _, hexpart = check_digest(value).partition(":")
    return algorithm, hexpart


def new_hasher(digest_or_algorithm: str) -> hashlib._Hash:
    """A hasher for the algorithm of `digest_or_algorithm` ("sha256" or "sha256:...")."""
    algorithm = digest_or_algorithm.partition(":")[0]
    if algorithm not in _HEX_LEN:
        raise UsageError(f"unsupported digest algorithm {algorithm!r}")
    return hashlib.new(algorithm)


def digest_of(data: bytes, algorithm: str = "sha256") -> str:
    h = new_hasher(algorithm)
    h.update(data)
    return f"{h.name}:{h.hexdigest()}"
