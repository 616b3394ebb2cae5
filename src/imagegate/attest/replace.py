"""Which earlier attestations a new one supersedes, and the lock that makes a read-modify-write of
an image's attestations whole on one host. The rules, and why, are in docs/attestations.md ("Who
may replace what"): a write supersedes only what its writer can prove it superseded — the same
signer, verified, imagegate's, the same subject, predicate type and pipeline, and older."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import posixpath
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from imagegate._support.jsontypes import JsonMapping, obj
from imagegate.attest import dsse
from imagegate.attest.keys import PublicKey
from imagegate.attest.platforms import INDEX_PREDICATE_TYPE
from imagegate.attest.statement import PREDICATE_TYPE
from imagegate.attest.vsa import (
    TEST_RESULT_PREDICATE_TYPE,
    TIME_FIELD,
    VERIFIER_ID,
    VSA_PREDICATE_TYPE,
)
from imagegate.errors import NotVerified
from imagegate.oci import untrusted_json

PROBES_BUNDLE = "imagegate probes bundle"  # the test-result's second configuration entry
MAX_STATEMENT_BYTES = 16 << 20  # as an attestation layer's cap


@dataclass(frozen=True)
class Replaced:
    where: str  # "layer sha256:…" of the .att tag, or "referrer sha256:…"
    predicate_type: str
    outcome: str  # the verdict, verificationResult or result it said

    def describe(self) -> str:
        return f"{self.where} ({_short(self.predicate_type)} {self.outcome})"


@dataclass(frozen=True)
class Kept:
    """An earlier statement of the new one's predicate type left where it is, and why."""

    entry: Replaced
    why: str

    def describe(self) -> str:
        return f"{self.entry.describe()}: {self.why}"


@dataclass(frozen=True)
class Signed:
    """A statement whose envelope verified with a trusted key: the only kind written, and the
    signer whose earlier word it may supersede. Keyless, the key is the certificate's, made for
    one run: the signer is the certificate's identity, `proves` tells whether an earlier
    envelope with its bundle's verificationMaterial is that identity's (the bundle verified
    against the trusted root), and `who` names it."""

    envelope: dsse.Envelope
    statement: dict[str, object]
    signer: PublicKey
    proves: Callable[[dsse.Envelope, JsonMapping | None], bool] | None = None
    who: str = ""

    def named(self) -> str:
        return self.who or f"key {self.signer.fingerprint}"

    def made(self, old: dsse.Envelope, material: JsonMapping | None) -> bool:
        """`old` is this signer's word (a keyless one: only with a bundle that proves it)."""
        return self.proves(old, material) if self.proves is not None else old.verified_by(self.signer)


class NewerThere(NotVerified):
    """The statement is older than one of the same signer and pipeline already attached: an
    attach never puts an earlier word back over a later one (exit 1, nothing written)."""


def _short(predicate_type: str) -> str:
    return {
        PREDICATE_TYPE: "acceptance",
        INDEX_PREDICATE_TYPE: "index",
        VSA_PREDICATE_TYPE: "VSA",
        TEST_RESULT_PREDICATE_TYPE: "test-result",
    }.get(predicate_type, predicate_type)


def _dict(value: object) -> dict[str, object]:
    return obj(value)


def canonical_pipeline(source: str) -> str:
    """A pipeline's identity from how it was named: `builtin:NAME` as is (a bare built-in name
    becomes that), a file's path normalised (`./p/x.yaml` and `p//x.yaml` are `p/x.yaml`). Not
    its digest: an edited pipeline is the same pipeline, and its newer verdict must supersede."""
    if source.startswith("builtin:"):
        return source
    if "/" not in source and not source.endswith((".yaml", ".yml")):
        return f"builtin:{source}"
    return posixpath.normpath(source.replace("\\", "/"))


def pipeline_of(statement: JsonMapping) -> str | None:
    """The pipeline identity of an imagegate statement (canonical_pipeline of its source, else its
    name: what the VSA's `policy.uri` says), or None when it is not recognisably imagegate's."""
    kind = statement.get("predicateType")
    pred = _dict(statement.get("predicate"))
    named: object = None
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
    return canonical_pipeline(named) if isinstance(named, str) and named else None


def instant(text: object) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def when(statement: JsonMapping) -> datetime | None:
    """When the word was said, the order of one signer's statements: an acceptance when its run
    finished, an index statement when it was made (`finishedOn` both), a VSA and a test-result
    as the statement they were signed beside (their TIME_FIELD; a VSA without it, as an earlier
    imagegate wrote it, by `timeVerified`, the same instant for a run). None where the statement
    says no time (an earlier imagegate's test-result): older than one that says a time, and a
    new statement without one is never proven newer."""
    kind = statement.get("predicateType")
    pred = _dict(statement.get("predicate"))
    if kind in (PREDICATE_TYPE, INDEX_PREDICATE_TYPE):
        return instant(pred.get("finishedOn"))
    if kind in (VSA_PREDICATE_TYPE, TEST_RESULT_PREDICATE_TYPE):
        return instant(pred.get(TIME_FIELD) or pred.get("timeVerified"))
    return None


def newest_run(statement: JsonMapping) -> datetime | None:
    """An index statement's newest platform run: one made later from older runs says less."""
    runs = _dict(statement.get("predicate")).get("platforms")
    found = (
        [instant(e.get("finishedOn")) for e in runs if isinstance(e, dict)] if isinstance(runs, list) else []
    )
    return max((t for t in found if t is not None), default=None)


def outcome(statement: JsonMapping) -> str:
    pred = _dict(statement.get("predicate"))
    said = pred.get("verdict") or pred.get("verificationResult") or pred.get("result")
    return str(said) if said else "?"


def statement_of(envelope: dsse.Envelope) -> dict[str, object] | None:
    """The envelope's payload as a JSON object, or None."""
    try:
        st = untrusted_json.loads(envelope.payload, max_bytes=MAX_STATEMENT_BYTES)
    except untrusted_json.UntrustedJSONError:
        return None
    return st if isinstance(st, dict) else None


def subjects_of(statement: JsonMapping) -> list[str]:
    """A statement's subject digests as `algorithm:hex` (malformed entries are skipped)."""
    subjects = statement.get("subject")
    out: list[str] = []
    for s in subjects if isinstance(subjects, list) else []:
        digests = s.get("digest") if isinstance(s, dict) else None
        if isinstance(digests, dict):
            out += [f"{a}:{h}" for a, h in digests.items()]
    return out


def verified(envelope: dsse.Envelope, trusted: Sequence[PublicKey], source: str) -> Signed:
    """The new statement, checked before anything is written: its signature must verify with one
    of `trusted` and its payload be an in-toto statement. NotVerified (exit 1) otherwise."""
    signer = next((k for k in trusted if envelope.verified_by(k)), None)
    if signer is None:
        named = ", ".join(f"key {k.fingerprint}" for k in trusted) or "no key"
        raise NotVerified(
            f"{source}: its signature does not verify with {named}: signed with another key, or "
            "changed after signing; nothing attached",
            hint="pass the signer's public key: imagegate attach --key PUB ATTESTATION IMAGE",
        )
    statement = statement_of(envelope)
    if statement is None or envelope.payload_type != dsse.INTOTO_PAYLOAD_TYPE:
        raise NotVerified(f"{source}: not an in-toto statement; nothing attached")
    return Signed(envelope, statement, signer)


Action = Literal["replace", "keep", "newer", "same", "gone"]


@dataclass(frozen=True)
class Decision:
    action: Action  # replace it; keep it (why); it is newer (refuse the new); it is the new one;
    # gone: unreadable by anyone, its blob gone (dropped, said)
    entry: Replaced
    why: str = ""


def decide(
    new: Signed, old: dsse.Envelope | None, subject: str, where: str, material: JsonMapping | None = None
) -> Decision | None:
    """What `new` (about `subject`) does to an earlier `old` envelope found at `where` (with its
    bundle's verificationMaterial, where it came in one): None when it is no statement of
    `new`'s predicate type (not ours to judge, nothing to say)."""
    earlier = statement_of(old) if old is not None else None
    kind = new.statement.get("predicateType")
    if earlier is None or earlier.get("predicateType") != kind:
        return None
    assert old is not None
    entry = Replaced(where, str(kind), outcome(earlier))
    keep = _kept_because(new, old, earlier, subject, material)
    if keep is not None:
        return Decision("keep", entry, keep)
    if old.payload == new.envelope.payload:
        return Decision("same", entry)
    then, now = when(earlier), when(new.statement)
    if then is not None and then == now and outcome(earlier) == outcome(new.statement):
        return Decision("replace", entry)  # the same word at the same instant, signed again
    if now is None or (then is not None and then >= now) or _on_older_runs(new.statement, earlier):
        return Decision("newer", entry, _said_when(then))
    return Decision("replace", entry)


def _on_older_runs(new: JsonMapping, old: JsonMapping) -> bool:
    """An index statement made later than `old` but from runs all older than `old`'s newest."""
    if new.get("predicateType") != INDEX_PREDICATE_TYPE:
        return False
    mine, theirs = newest_run(new), newest_run(old)
    return theirs is not None and (mine is None or mine < theirs)


def _kept_because(
    new: Signed, old: dsse.Envelope, earlier: JsonMapping, subject: str, material: JsonMapping | None
) -> str | None:
    """Why an earlier statement of the same predicate type is not `new`'s to supersede, or None."""
    pipeline = pipeline_of(earlier)
    if pipeline is None:
        return "another tool's statement"
    if subject not in subjects_of(earlier):
        return "about another image"
    if pipeline != pipeline_of(new.statement):
        return f"another pipeline's ({pipeline})"
    if not new.made(old, material):
        return f"not signed by {new.named()}: another signer's word, or changed after signing"
    return None


def _said_when(moment: datetime | None) -> str:
    return f"said {moment.isoformat()}" if moment is not None else "says no time"


def refuse_if_newer(new: Signed, decisions: Sequence[Decision], source: str) -> None:
    """NewerThere naming the same signer's later word for the pipeline, when there is one."""
    newer = [d for d in decisions if d.action == "newer"]
    if newer:
        said = when(new.statement)
        named = ", ".join(f"{d.entry.describe()}, {d.why}" for d in newer)
        raise NewerThere(
            f"{source} ({_short(str(new.statement.get('predicateType')))} {outcome(new.statement)}, "
            f"{_said_when(said)}) is not newer than what {new.named()} already "
            f"attached for pipeline {pipeline_of(new.statement)}: {named}; nothing attached",
            hint="an earlier verdict never replaces a later one: attach the latest attempt",
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
