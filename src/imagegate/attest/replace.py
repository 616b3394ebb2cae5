"""Which earlier attestations a new one replaces, and the lock that makes a read-modify-write of
an image's attestations whole on one host.

Admission controllers read every attestation of a predicate type attached to an image (Kyverno's
image verifier refuses on the first whose conditions fail), so an earlier FAIL left beside a later
PASS refuses the image for ever. A new imagegate statement therefore replaces, for the same
subject, the earlier imagegate statements of the same predicate type and the same pipeline, as
`cosign attest --replace` drops earlier layers of the same predicate type; an attestation this
module cannot read as imagegate's (another tool's, another verifier's) or another pipeline's is
never touched."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from imagegate.attest.platforms import INDEX_PREDICATE_TYPE
from imagegate.attest.statement import PREDICATE_TYPE
from imagegate.attest.vsa import TEST_RESULT_PREDICATE_TYPE, VERIFIER_ID, VSA_PREDICATE_TYPE

PROBES_BUNDLE = "imagegate probes bundle"  # the test-result's second configuration entry


@dataclass(frozen=True)
class Replaced:
    where: str  # "layer sha256:…" of the .att tag, or "referrer sha256:…"
    predicate_type: str
    outcome: str  # the verdict, verificationResult or result it said

    def describe(self) -> str:
        return f"{self.where} ({_short(self.predicate_type)} {self.outcome})"


def _short(predicate_type: str) -> str:
    return {
        PREDICATE_TYPE: "acceptance",
        INDEX_PREDICATE_TYPE: "index",
        VSA_PREDICATE_TYPE: "VSA",
        TEST_RESULT_PREDICATE_TYPE: "test-result",
    }.get(predicate_type, predicate_type)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def pipeline_of(statement: Mapping[str, Any]) -> str | None:
    """The pipeline an imagegate statement names (its source, else its name: what the VSA's
    `policy.uri` says), or None when the statement is not recognisably imagegate's."""
    kind = statement.get("predicateType")
    pred = _dict(statement.get("predicate"))
    named: Any = None
    if kind in (PREDICATE_TYPE, INDEX_PREDICATE_TYPE):
        pipeline = _dict(pred.get("pipeline"))
        named = pipeline.get("source") or pipeline.get("name")
    elif kind == VSA_PREDICATE_TYPE:
        if _dict(pred.get("verifier")).get("id") == VERIFIER_ID:
            named = _dict(pred.get("policy")).get("uri")
    elif kind == TEST_RESULT_PREDICATE_TYPE:
        # A test-result carries no verifier: imagegate's names the pipeline and, at most, the
        # probes' bundle, and nothing else.
        config = pred.get("configuration")
        if (
            isinstance(config, list)
            and 1 <= len(config) <= 2
            and all(isinstance(c, dict) for c in config)
            and all(c.get("name") == PROBES_BUNDLE for c in config[1:])
        ):
            named = config[0].get("name")
    return named if isinstance(named, str) and named else None


def outcome(statement: Mapping[str, Any]) -> str:
    pred = _dict(statement.get("predicate"))
    said = pred.get("verdict") or pred.get("verificationResult") or pred.get("result")
    return str(said) if said else "?"


def replaces(new: Mapping[str, Any], old: Mapping[str, Any], old_subjects: list[str], subject: str) -> bool:
    """Whether `old` (whose subject digests are `old_subjects`) is an earlier imagegate statement
    that `new` replaces for `subject`: both imagegate's, the same predicate type, the same
    pipeline, and `old` about `subject`."""
    pipeline = pipeline_of(new)
    return (
        pipeline is not None
        and old.get("predicateType") == new.get("predicateType")
        and pipeline_of(old) == pipeline
        and subject in old_subjects
    )


def _lock_folder() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "imagegate", "locks")


@contextlib.contextmanager
def locked(image: str) -> Iterator[None]:
    """Held while an image's attestations are read, changed and written back, so that two
    attaches of one image on this host do not lose each other's writes (a registry has no
    conditional write). Across hosts nothing is held: docs/attestations.md says what can be lost.
    Where no lock file can be made (a read-only home) the write goes on unlocked, as it did."""
    name = hashlib.sha256(image.encode()).hexdigest() + ".lock"
    try:
        os.makedirs(_lock_folder(), exist_ok=True)
        fd = os.open(os.path.join(_lock_folder(), name), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
