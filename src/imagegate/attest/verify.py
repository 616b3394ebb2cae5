"""Verify an acceptance attestation: the signature, the statement's form, the subject against the
image's digest, every evidence file's sha256 when the evidence folder is there, the verdict.
Every check is data (a `Check` in a `Report`); a mismatch names what differs. Only unreadable
input raises."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Literal

from imagegate._support.jsontypes import JsonMapping, freeze_object, items, obj, objects, path
from imagegate.attest import bundle, dsse
from imagegate.attest.envelopes import (
    MAX_ATTESTATION_BYTES,
    bundle_material,
    one_envelope,
    read_bounded,
    read_envelopes,
)
from imagegate.attest.keys import PublicKey
from imagegate.attest.statement import (
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    environment_digest,
    evidence_files,
)
from imagegate.domain.digest import is_digest, short_digest
from imagegate.domain.evidence import sha256_file
from imagegate.errors import UsageError
from imagegate.oci import untrusted_json

if TYPE_CHECKING:  # imported where used: verifying a file never loads the registry layers
    from imagegate.attest import attach
    from imagegate.attest.keyless import Expected
    from imagegate.attest.word import Scope
    from imagegate.oci.reference import Reference

CheckOutcome = Literal["ok", "failed", "skipped"]
# The keys an attestation, or any envelope of its chain, may be signed with: one, or several
# (a chain signed on two machines: the first attempt by CI, its completion on a GPU host).
Trusted = PublicKey | Sequence[PublicKey]
STATEMENT_COPY = "statement.json"  # the statement written beside the evidence, signed or not
MAX_CHAIN = 64  # completions of completions: far more than any real chain, bounded all the same


def keyring(trusted: Trusted) -> tuple[PublicKey, ...]:
    return (trusted,) if isinstance(trusted, PublicKey) else tuple(trusted)


def _named(ring: Sequence[PublicKey]) -> str:
    return " or ".join(f"key {k.fingerprint}" for k in ring) or "no key (none was given)"


@dataclass(frozen=True)
class Check:
    name: str  # signature, payloadType, statement, subject, evidence, statement.json, verdict
    outcome: CheckOutcome
    detail: str

    @property
    def ok(self) -> bool:
        return self.outcome != "failed"


@dataclass
class Report:
    source: str  # what was verified: a file, or a registry reference and layer
    checks: list[Check] = field(default_factory=list)
    statement: dict[str, object] | None = None
    predicate_type: str | None = None  # as the payload says, even when it is not ours
    signer: PublicKey | None = None  # the trusted key that verified the signature

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def verdict(self) -> str | None:
        pred = (self.statement or {}).get("predicate")
        return str(pred.get("verdict")) if isinstance(pred, dict) and "verdict" in pred else None

    def add(self, name: str, outcome: CheckOutcome, detail: str) -> None:
        self.checks.append(Check(name, outcome, detail))


def verify_envelope(
    envelope: dsse.Envelope,
    trusted: Trusted,
    *,
    source: str,
    predicate_type: str = PREDICATE_TYPE,
    image_digests: Sequence[str] = (),
    image_name: str | None = None,
    expect_verdict: str | None = None,
) -> Report:
    """`image_digests`: the image's digests (`sha256:...`, manifest and/or config) that the
    subject must name; empty: not checked. The evidence is checked by `check_evidence`."""
    rep = Report(source)
    if envelope.payload_type == dsse.INTOTO_PAYLOAD_TYPE:
        rep.add("payloadType", "ok", envelope.payload_type)
    else:
        rep.add(
            "payloadType", "failed", f"is {envelope.payload_type!r}, expected {dsse.INTOTO_PAYLOAD_TYPE!r}"
        )
    ring = keyring(trusted)
    rep.signer = next((k for k in ring if envelope.verified_by(k)), None)
    if rep.signer is not None:
        rep.add("signature", "ok", f"verified with key {rep.signer.fingerprint} ({rep.signer.algorithm})")
    else:
        rep.add(
            "signature",
            "failed",
            f"no signature verifies with {_named(ring)}: signed with another key, or the "
            "attestation was changed after signing",
        )
    statement = _statement(envelope, predicate_type, rep)
    if statement is None:
        return rep
    rep.statement = statement
    _check_subject(statement, image_digests, image_name, rep)
    if expect_verdict is not None:
        got = rep.verdict
        if got == expect_verdict:
            rep.add("verdict", "ok", got)
        else:
            rep.add("verdict", "failed", f"is {got}, expected {expect_verdict}")
    return rep


def _statement(envelope: dsse.Envelope, predicate_type: str, rep: Report) -> dict[str, object] | None:
    try:
        st = untrusted_json.loads(envelope.payload, max_bytes=MAX_ATTESTATION_BYTES)
    except untrusted_json.UntrustedJSONError as e:
        rep.add("statement", "failed", f"the payload is {e}")
        return None
    problems = []
    if not isinstance(st, dict):
        rep.add("statement", "failed", "the payload is not a JSON object")
        return None
    rep.predicate_type = str(st.get("predicateType"))
    if st.get("_type") != STATEMENT_TYPE:
        problems.append(f"_type is {st.get('_type')!r}, expected {STATEMENT_TYPE!r}")
    if st.get("predicateType") not in _verdict_types(predicate_type):
        problems.append(f"predicateType is {st.get('predicateType')!r}, expected {predicate_type!r}")
    subjects = st.get("subject")
    if not isinstance(subjects, list) or not subjects or not all(_subject_ok(s) for s in subjects):
        problems.append("subject is not a list of {name, digest} with at least one digest")
    if not isinstance(st.get("predicate"), dict):
        problems.append("predicate is not an object")
    if problems:
        rep.add("statement", "failed", "; ".join(problems))
        return None
    rep.add("statement", "ok", f"in-toto Statement v1, {st.get('predicateType')}")
    return st


def _verdict_types(predicate_type: str) -> tuple[str, ...]:
    """The predicate types accepted where `predicate_type` is asked for: a run's acceptance, or
    the statement about an index made from its platforms' runs (attest/platforms.py)."""
    from imagegate.attest.platforms import INDEX_PREDICATE_TYPE

    return (predicate_type, INDEX_PREDICATE_TYPE) if predicate_type == PREDICATE_TYPE else (predicate_type,)


def _subject_ok(s: object) -> bool:
    return isinstance(s, dict) and isinstance(s.get("digest"), dict) and bool(s["digest"])


def _subject_digests(statement: JsonMapping) -> list[str]:
    return [f"{a}:{h}" for s in objects(statement.get("subject")) for a, h in obj(s.get("digest")).items()]


def _check_subject(
    statement: JsonMapping, image_digests: Sequence[str], name: str | None, rep: Report
) -> None:
    subj = _subject_digests(statement)
    image = obj(path(statement, "predicate", "image"))
    kind = image.get("subjectDigest")
    # The subject must be the digest the predicate says it is (the signature covers both, so a
    # mismatch means the statement was made wrong, not changed in transit; still worth a name).
    expected = {
        "manifest": image.get("manifestDigest"),
        "index": image.get("indexDigest"),
        "config": image.get("configDigest"),
        "environment": "sha256:" + environment_digest(path(statement, "predicate", "environment")),
    }.get(str(kind))
    if expected is not None and expected not in subj:
        rep.add(
            "subject",
            "failed",
            f"subject {', '.join(subj)} is not the {kind} digest {expected} the predicate records",
        )
        return
    if not image_digests:
        of = f" ({kind} digest)" if kind else ""  # a VSA or test result names no kind
        rep.add("subject", "skipped", f"{', '.join(subj)}{of}; pass --image to check it")
        return
    from imagegate.attest.attach import matching_subject

    hit = matching_subject(subj, image_digests)
    what = name or "the image"
    if hit is not None:
        rep.add("subject", "ok", f"{hit} is {what}'s digest")
    else:
        rep.add(
            "subject",
            "failed",
            f"subject {', '.join(short_digest(d) for d in subj)} is not {what} "
            f"({', '.join(short_digest(d) for d in image_digests)})",
        )


def _safe_rel(path: object) -> str | None:
    if not isinstance(path, str) or not path:
        return None
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts or "\\" in path:
        return None
    return path


def listed_files(statement: JsonMapping) -> list[dict[str, object]]:
    """The files beside it that a statement vouches for, by sha256: an acceptance's evidence; a
    VSA's input attestations (the acceptance it summarises)."""
    from imagegate.attest.vsa import VSA_PREDICATE_TYPE

    if statement.get("predicateType") != VSA_PREDICATE_TYPE:
        return evidence_files(statement)
    inputs = items(path(statement, "predicate", "inputAttestations"))
    return [
        {"path": a.get("uri"), "sha256": (a.get("digest") or {}).get("sha256")}
        for a in inputs
        if isinstance(a, dict)
    ]


def check_evidence(statement: JsonMapping, root: Path, rep: Report) -> None:
    files = listed_files(statement)
    missing: list[str] = []
    bad = 0
    for f in files:
        rel = _safe_rel(f.get("path"))
        if rel is None:
            rep.add("evidence", "failed", f"{f.get('path')!r}: not a path inside the attempt folder")
            bad += 1
            continue
        p = root / rel
        if p.is_symlink() or not p.is_file():
            # A link could point at any file with the right hash; evidence is the file itself.
            missing.append(rel)
            continue
        got = sha256_file(p)
        if got != f.get("sha256"):
            rep.add(
                "evidence",
                "failed",
                f"{rel}: changed (sha256 {got[:16]}…, attested {str(f.get('sha256'))[:16]}…)",
            )
            bad += 1
    if missing:
        rep.add(
            "evidence",
            "failed",
            f"{', '.join(missing)}: missing from {root} ({len(missing)} of {len(files)} listed files)",
        )
    elif not bad:
        rep.add("evidence", "ok", f"{len(files)} files match their sha256 in {root}")
    _check_statement_copy(statement, root, rep)


def _check_statement_copy(statement: JsonMapping, root: Path, rep: Report) -> None:
    # statement.json is the readable copy of the attempt's own statement (acceptance, or an
    # index's); it must say what was signed. A VSA or test result beside it is another statement.
    copy = root / STATEMENT_COPY
    if not copy.is_file() or statement.get("predicateType") not in _verdict_types(PREDICATE_TYPE):
        return
    try:
        same = (
            untrusted_json.loads(read_bounded(copy, "statement"), max_bytes=MAX_ATTESTATION_BYTES)
            == statement
        )
    except (ValueError, UsageError):
        same = False
    if same:
        rep.add("statement.json", "ok", "the same statement as the signed payload")
    else:
        rep.add("statement.json", "failed", f"{copy} differs from the signed statement")


LINK_COPY = "completes/attestation.dsse.json"  # imagegate.usecases.complete keeps the earlier envelope here


def _subject_of(statement: JsonMapping) -> tuple[object, ...]:
    """What two attempts of one chain must share: the image's name and digest; for an environment
    without an image (run --here), its fingerprint."""
    pred = obj(statement.get("predicate"))
    if path(pred, "image", "subjectDigest") == "environment":
        fp = path(pred, "environment", "fingerprint", "sha256")
        return ("environment fingerprint", fp)
    subj = statement.get("subject") or []
    return ("subject", json.dumps(subj, sort_keys=True))


def _safe_id(attempt: object) -> bool:
    return isinstance(attempt, str) and bool(attempt) and "/" not in attempt and attempt not in (".", "..")


def _linked_envelope(attempt: object, want: str, root: Path) -> tuple[Path, bytes] | str:
    """The earlier attempt's envelope and where it was read, or why the link fails. It is looked
    for beside this attempt (where `complete` puts a completion by default) and in the copy the
    completion keeps as evidence: each that is there must be the linked one. The first place
    returned is beside, when it is there: the earlier attempt's folder, where its own link lies."""
    beside = root.parent / str(attempt) / "attestation.dsse.json" if _safe_id(attempt) else None
    places = [p for p in (beside, root / LINK_COPY) if p is not None and p.is_file()]
    if not places:
        return f"completes attempt {attempt}: its envelope is neither beside nor in {LINK_COPY}"
    first = b""
    for place in places:
        try:
            data = read_bounded(place)
        except UsageError as e:
            return f"completes attempt {attempt}: {e}"
        got = hashlib.sha256(data).hexdigest()
        if got != want:
            return (
                f"completes attempt {attempt}: {place} has sha256 {got[:16]}…, the link says {want[:16]}…: "
                "the earlier attestation was changed after the completion was signed"
            )
        first = first or data
    return places[0], first


@dataclass(frozen=True)
class _Link:
    report: Report  # the earlier envelope's own checks (signature, statement)
    place: Path  # where its envelope was read
    detail: str  # what held, for the `link` check


def _one_link(statement: JsonMapping, root: Path, ring: Sequence[PublicKey]) -> _Link | str:
    """The link from `statement` (in folder `root`) to the attempt it completes; a string: why
    it does not hold, naming that attempt."""
    link = obj(path(statement, "predicate", "completes"))
    want = str(link.get("envelopeSha256") or "")
    attempt = link.get("attempt")
    found = _linked_envelope(attempt, want, root)
    if isinstance(found, str):
        return found
    place, earlier_env = found
    try:
        env = one_envelope(earlier_env, place)
    except UsageError as e:  # a malformed earlier envelope: the link fails, named
        return f"completes attempt {attempt}: the earlier envelope is unreadable ({e})"
    sub = verify_envelope(env, ring, source=str(place))
    if not sub.ok or sub.statement is None or sub.signer is None:
        why = "; ".join(f"{c.name}: {c.detail}" for c in sub.failures)
        return f"completes attempt {attempt}: the earlier attestation does not verify: {why}"
    earlier_id = path(sub.statement, "predicate", "attempt", "id")
    if earlier_id != attempt:
        return f"the link names attempt {attempt}, the linked envelope is attempt {earlier_id}"
    a, b = _subject_of(statement), _subject_of(sub.statement)
    if a != b:
        return f"completes attempt {attempt}, about another {a[0]}: {b[1]} then, {a[1]} now"
    return _Link(
        sub,
        place,
        f"completes attempt {attempt} (verdict {sub.verdict}): its signature verified with key "
        f"{sub.signer.fingerprint}, envelope sha256 {want[:16]}… as linked, same {a[0]}",
    )


def check_link(statement: JsonMapping, root: Path, trusted: Trusted, rep: Report) -> None:
    """A completion (`imagegate complete`) names the attempt it completes by the sha256 of that
    attempt's envelope. Each envelope of the chain must be signed by one of the trusted keys (the
    detail names which), the earlier one must be the linked one byte for byte (where it lies
    beside, and the copy in the completion), and both must be about one subject. An earlier
    attempt that is itself a completion has its own link checked the same way, from its folder
    beside; where only the copy is here, that is said."""
    ring = keyring(trusted)
    held: list[str] = []
    for _ in range(MAX_CHAIN):
        step = _one_link(statement, root, ring)
        if isinstance(step, str):
            rep.add("link", "failed", "; ".join([*held, step]))
            return
        held.append(step.detail)
        statement = step.report.statement or {}
        further = path(statement, "predicate", "completes")
        if further is None:
            break
        if step.place == root / LINK_COPY:  # only the copy is here: no folder of its own
            held.append(
                f"its own link to attempt {obj(further).get('attempt')} not checked: its folder is not here"
            )
            break
        root = step.place.parent
    else:
        rep.add("link", "failed", f"a chain of more than {MAX_CHAIN} completions: not followed")
        return
    rep.add("link", "ok", "; ".join(held))


REUSE_COPY = "reuses/attestation.dsse.json"  # imagegate.usecases.reuse_attempt keeps the reused envelope here
# What a reuse carries of the attempt it reuses, each equal: the word and when it was made.
_CARRIED = ("verdict", "startedOn", "finishedOn")


def _carried(statement: JsonMapping) -> tuple[object, ...]:
    pred = obj(statement.get("predicate"))
    stages = [(s.get("id"), s.get("status"), s.get("detail")) for s in objects(pred.get("stages"))]
    return (*(pred.get(k) for k in _CARRIED), json.dumps(stages, sort_keys=True))


def _reuse_link(statement: JsonMapping, root: Path, ring: Sequence[PublicKey]) -> str:
    """Why the link of a reuse (`run --reuse`) holds (a sentence starting "ok: "), or why not."""
    link = obj(path(statement, "predicate", "reuses"))
    attempt, want = link.get("attempt"), str(link.get("envelopeSha256") or "")
    place = root / REUSE_COPY
    try:
        data = read_bounded(place)
        env = one_envelope(data, place)
    except UsageError as e:
        return f"reuses attempt {attempt}: {e}"
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        return f"reuses attempt {attempt}: {place} has sha256 {got[:16]}…, the link says {want[:16]}…"
    sub = verify_envelope(env, ring, source=str(place))
    if not sub.ok or sub.statement is None or sub.signer is None:
        return f"reuses attempt {attempt}: it does not verify: " + "; ".join(
            f"{c.name}: {c.detail}" for c in sub.failures
        )
    earlier = sub.statement
    if path(earlier, "predicate", "attempt", "id") != attempt:
        return f"the link names attempt {attempt}, the linked envelope is another"
    if _subject_of(earlier) != _subject_of(statement):
        return f"reuses attempt {attempt}, about another image"
    if _carried(earlier) != _carried(statement):
        return f"reuses attempt {attempt}, but says another verdict, time or stage result than it"
    return (
        f"ok: reuses attempt {attempt} (verdict {sub.verdict}, finished {path(earlier, 'predicate', 'finishedOn')}): "
        f"its signature verified with key {sub.signer.fingerprint}, envelope sha256 {want[:16]}… as linked, "
        "the same subject, verdict, times and stage results"
    )


def check_reuse(statement: JsonMapping, root: Path, trusted: Trusted, rep: Report) -> None:
    """A reuse names the attempt it answers from by its envelope's sha256, a copy of which it
    keeps: that copy must be the linked one, verify with a trusted key, be about the same subject
    and say the same verdict, times and stage results as the reuse carries."""
    said = _reuse_link(statement, root, keyring(trusted))
    rep.add("link", "ok" if said.startswith("ok: ") else "failed", said.removeprefix("ok: "))


def choose(reports: Iterable[Report], predicate_type: str = PREDICATE_TYPE) -> Report | None:
    """Of several attestations (a .jsonl file, an image's `.att`): the first that passes; else the
    first of our predicate type, whose failures explain why; else the first."""
    reports = list(reports)
    ours = [r for r in reports if r.predicate_type in _verdict_types(predicate_type)]
    return next((r for r in reports if r.ok), None) or next(iter(ours), None) or next(iter(reports), None)


def verify_in_folder(
    envelope: dsse.Envelope,
    trusted: Trusted,
    *,
    source: str,
    root: Path,
    evidence: bool = True,
    predicate_type: str = PREDICATE_TYPE,
    image_digests: Sequence[str] = (),
    image_name: str | None = None,
    expect_verdict: str | None = None,
) -> Report:
    """One envelope and its attempt folder `root`: the signature, the statement, the subject
    and the verdict (as `verify_envelope`), the link of a completion, every evidence file
    (unless `evidence=False`) and statement.json beside it."""
    rep = verify_envelope(
        envelope,
        trusted,
        source=source,
        predicate_type=predicate_type,
        image_digests=image_digests,
        image_name=image_name,
        expect_verdict=expect_verdict,
    )
    if rep.statement is None:
        return rep
    if path(rep.statement, "predicate", "completes") is not None:
        check_link(rep.statement, root, trusted, rep)
    if path(rep.statement, "predicate", "reuses") is not None:
        check_reuse(rep.statement, root, trusted, rep)
    if evidence:
        check_evidence(rep.statement, root, rep)
    else:
        listed = len(listed_files(rep.statement))
        rep.add("evidence", "skipped", f"{listed} listed files not checked (--signature-only)")
    return rep


def verify_file(
    path: Path,
    trusted: Trusted,
    *,
    image_digests: Sequence[str] = (),
    image_name: str | None = None,
    evidence_dir: Path | None = None,
    evidence: bool = True,
    expect_verdict: str | None = None,
    predicate_type: str = PREDICATE_TYPE,
    keyless: Expected | None = None,
) -> Report:
    """Verify an attestation file. The evidence the statement lists is checked in
    `evidence_dir`, else in the attestation's own folder; a listed file that is not there fails.
    `evidence=False` (signature only, asked for explicitly) records the evidence as skipped.
    `keyless`: who must have signed; each envelope's certificate is read from its bundle (the
    file, or the .sigstore.json beside it), and the keys in `trusted` count too."""
    reports = []
    envelopes = read_envelopes(path)
    for n, env in enumerate(envelopes, 1):
        material = bundle_material(path, env) if keyless is not None else None  # read only to be used
        ring, said = _ring(env, trusted, keyless, material)
        if keyless is not None:  # a completion's earlier envelopes may be the identity's too
            ring = (*ring, *linked_keys(env, evidence_dir or path.parent, keyless))
        rep = verify_in_folder(
            env,
            ring,
            source=str(path) if len(envelopes) == 1 else f"{path} line {n}",
            root=evidence_dir or path.parent,
            evidence=evidence,
            predicate_type=predicate_type,
            image_digests=image_digests,
            image_name=image_name,
            expect_verdict=expect_verdict,
        )
        if keyless is not None:
            _say_keyless(rep, said)
        reports.append(rep)
    chosen = choose(reports, predicate_type)
    assert chosen is not None  # read_envelopes never returns an empty list
    return chosen


def _ring(
    env: dsse.Envelope,
    trusted: Trusted,
    keyless: Expected | None,
    material: JsonMapping | None,
) -> tuple[tuple[PublicKey, ...], str]:
    """The keys `env` may verify with: `trusted`, and keyless, the key its bundle's certificate
    (in `material`, the bundle's verificationMaterial) certifies for the identity; with what
    the keyless check said."""
    ring = keyring(trusted)
    if keyless is None:
        return ring, ""
    proof = bundle.wrap(env, freeze_object(material or {}))
    key, said = keyless.verified_key(proof, env.payload_type, env.payload)
    return ((*ring, key) if key is not None else ring), said


def _proving(
    copies: Sequence[attach.FetchedEnvelope], trusted: Trusted, keyless: Expected | None
) -> tuple[attach.FetchedEnvelope, tuple[PublicKey, ...], str]:
    """Of one statement's copies, the first whose material proves the identity (keyless), else
    the first; with its keys and what the check said."""
    first = None
    for f in copies:
        ring, said = _ring(f.envelope, trusted, keyless, f.material)
        if keyless is None or len(ring) > len(keyring(trusted)):
            return f, ring, said
        first = first or (f, ring, said)
    assert first is not None
    return first


def certified(place: Path, env: dsse.Envelope, keyless: Expected) -> tuple[PublicKey | None, str]:
    """The key the certificate in the bundle beside `place` (the envelope's file) proves was the
    identity's, and what the check said."""
    proof = bundle.wrap(env, freeze_object(bundle_material(place, env) or {}))
    return keyless.verified_key(proof, env.payload_type, env.payload)


def linked_keys(env: dsse.Envelope, root: Path, keyless: Expected) -> tuple[PublicKey, ...]:
    """Keyless: the keys that the certificates of a completion's earlier envelopes prove were
    the identity's (each bundle beside its envelope, or copied beside the completion's copy), so
    that check_link can verify a chain the identity signed. Found by following the links, read
    unverified: check_link verifies every envelope of the chain with them."""
    found: list[PublicKey] = []
    for _ in range(MAX_CHAIN):
        earlier = _earlier(env, root)
        if earlier is None:
            return tuple(found)
        place, env = earlier
        key = certified(place, env, keyless)[0]
        found += [key] if key is not None else []
        root = place.parent
    return tuple(found)


def _earlier(env: dsse.Envelope, root: Path) -> tuple[Path, dsse.Envelope] | None:
    """The envelope `env` (in folder `root`) links as the one it completes, and where it lies;
    None when it links none, or that one is not there or not readable."""
    try:
        link = obj(
            path(untrusted_json.loads(env.payload, max_bytes=MAX_ATTESTATION_BYTES), "predicate", "completes")
        )
        found = _linked_envelope(link.get("attempt"), str(link.get("envelopeSha256") or ""), root)
        if isinstance(found, str):
            return None
        place, data = found
        return place, one_envelope(data, place)
    except (UsageError, ValueError):  # not JSON, not an envelope: no key from it
        return None


def _say_keyless(rep: Report, said: str) -> None:
    """The signature check of a keyless envelope names who signed (its key was made for one
    run), or why its certificate did not prove it."""
    for n, c in enumerate(rep.checks):
        if c.name == "signature":
            keyed = c.ok and not said.startswith("keyless")
            detail = c.detail if keyed else (said if c.ok else f"{c.detail}; keyless: {said}")
            rep.checks[n] = Check(c.name, c.outcome, detail)


def attestation_in(path: Path) -> Path:
    """What `verify PATH` checks: an attempt folder, or its statement.json, stands for the
    attestation signed in it. An attempt that holds none was not signed, and is said to be so
    rather than a file that cannot be read; any other path is the attestation itself."""
    from imagegate.attest import sign

    signed = sign.DSSE_FILE
    whole = path.is_dir() or path.name == STATEMENT_COPY
    folder = path if path.is_dir() else path.parent
    if whole and (folder / signed).is_file():
        return folder / signed
    named_signed = not path.exists() and path.name in sign.SIGNED_FILES
    unsigned = (folder / STATEMENT_COPY).is_file() and not (folder / signed).exists()
    if (whole or named_signed) and unsigned:
        raise UsageError(
            f"{folder}: this run was not signed (--no-sign): nothing to verify",
            hint=f"`imagegate report {folder}` shows its verdict, unsigned; run again without --no-sign to sign",
        )
    if path.is_dir():
        raise UsageError(f"{path}: not an attempt folder (no {signed}, no {STATEMENT_COPY})")
    return path


def verify(
    attestation: Path | None,
    trusted: Trusted,
    *,
    image: str | None = None,
    evidence_dir: Path | None = None,
    evidence: bool = True,
    expect_verdict: str | None = None,
    predicate_type: str = PREDICATE_TYPE,
    insecure: bool = False,
    scope: Scope | None = None,
    keyless: Expected | None = None,
) -> Report:
    """`imagegate verify`: the attestation file (its subject against `image` when given), or
    without a file the attestations attached to `image` in its registry, read in `scope`."""
    if attestation is None:
        if image is None:
            raise UsageError("nothing to verify", hint="pass an ATTESTATION file, or --image REF to fetch it")
        return verify_image(
            image,
            trusted,
            expect_verdict=expect_verdict,
            predicate_type=predicate_type,
            insecure=insecure,
            scope=scope,
            keyless=keyless,
        )
    attestation = attestation_in(attestation)
    name, digests = image_digests(image, insecure=insecure) if image else (None, [])
    return verify_file(
        attestation,
        trusted,
        image_digests=digests,
        image_name=name,
        evidence_dir=evidence_dir,
        evidence=evidence,
        expect_verdict=expect_verdict,
        predicate_type=predicate_type,
        keyless=keyless,
    )


def image_digests(image: str, *, insecure: bool = False) -> tuple[str, list[str]]:
    """(name, digests) of `--image` that the subject may name: a digest as written
    (`sha256:...`); a bare name the local engine holds: its ID, the digests it carries and, where
    those name an index, the manifest whose config it is; otherwise a registry reference
    resolved now (its manifest digest)."""
    from imagegate.attest import attach
    from imagegate.oci.registry import RegistryError

    if is_digest(image):
        return image, [image]
    ref = attach.parse_image(image)
    local = attach.engine_image(image)
    if local is not None:
        ran = local.ran_manifest(insecure=insecure) if local.repo_digests else None
        return f"{image} (local engine)", list(dict.fromkeys([*local.digests, *([ran] if ran else [])]))
    try:
        with attach.client_for(ref, insecure=insecure) as client:
            remote = attach.resolve(client, ref)
    except RegistryError as e:
        if attach.names_a_registry(image):
            raise
        raise attach.not_found_anywhere(image, e) from e
    return str(ref), list(remote.subject_digests)


def verify_image(
    image: str,
    trusted: Trusted,
    *,
    expect_verdict: str | None = None,
    predicate_type: str = PREDICATE_TYPE,
    insecure: bool = False,
    scope: Scope | None = None,
    keyless: Expected | None = None,
) -> Report:
    """Fetch the attestations attached to `image` in its registry and verify them: the word is
    the one `attest/word.py` takes (only trusted statements; by default as strict as the shipped
    ClusterPolicy), or, when none verifies, the one whose failures explain why. `keyless`: who
    must have signed; a referrer's bundle proves it (a `.att` layer carries no certificate)."""
    from imagegate.attest import attach, referrers
    from imagegate.attest.word import Scope, the_word
    from imagegate.oci.registry import RegistryError

    ref = attach.parse_image(image)
    local = attach.engine_image(image)
    if local is not None and not local.pushed_as(ref):
        # Built here and never pushed: no registry can hold its attestations; asking Docker Hub
        # for a bare name would only end in retries or an unrelated image.
        raise UsageError(
            f"image {image}: only in the local engine ({local.image_id}), never pushed to "
            f"{ref.registry}/{ref.repository}: attestations are read from the image's registry",
            hint=f"push it and pass the pushed reference, or verify the attestation file: "
            f"imagegate verify ATTESTATION --key KEY --image {image}",
        )
    try:
        with attach.client_for(ref, insecure=insecure) as client:
            remote = attach.resolve(client, ref)
            fetched = referrers.fetch_all(client, remote)
    except RegistryError as e:
        if attach.names_a_registry(image) or local is not None:
            raise
        raise attach.not_found_anywhere(image, e) from e
    if not fetched:
        return _none_attached(image, ref, remote)
    reports = _reports(
        fetched, trusted, keyless, remote.subject_digests, str(ref), predicate_type, expect_verdict
    )
    scope = scope or Scope()
    chosen = the_word(reports, scope)
    if chosen is None and scope.pipeline is not None:
        return _none_of_pipeline(f"{ref.registry}/{ref.repository}@{remote.digests[0]}", scope, len(reports))
    chosen = chosen or choose(reports, predicate_type)
    assert chosen is not None
    return chosen


def _reports(
    fetched: Sequence[attach.FetchedEnvelope],
    trusted: Trusted,
    keyless: Expected | None,
    digests: Sequence[str],
    name: str,
    predicate_type: str,
    expect_verdict: str | None,
) -> list[Report]:
    """Each statement read from the registry, once (the same one in both places is one), checked
    with `trusted` and, keyless, the key its bundle material (a referrer's, an `.att` layer's
    annotation) certifies for the identity: of the copies, the first whose material proves it,
    so a copy with its proof stripped or forged hides no other."""
    copies: dict[bytes, list[attach.FetchedEnvelope]] = {}
    for f in fetched:
        copies.setdefault(f.envelope.payload, []).append(f)
    reports = []
    for same in copies.values():
        f, ring, said = _proving(same, trusted, keyless)
        rep = verify_envelope(
            f.envelope,
            ring,
            source=f.source,
            predicate_type=predicate_type,
            image_digests=digests,
            image_name=name,
            expect_verdict=expect_verdict,
        )
        if keyless is not None:
            _say_keyless(rep, said)
        reports.append(rep)
    return reports


def _none_of_pipeline(pinned: str, scope: Scope, read: int) -> Report:
    rep = Report(pinned)
    rep.add(
        "attestation",
        "failed",
        f"none of the {read} statement(s) attached is pipeline {scope.pipeline}'s and verifies with the keys given",
    )
    return rep


def _none_attached(image: str, ref: Reference, remote: attach.RemoteImage) -> Report:
    """The failed report of an image with nothing attached, saying where it looked, and for an
    index, that a run attests the platform manifest that ran."""
    from imagegate.attest import attach

    pinned = f"{ref.registry}/{ref.repository}@{remote.digests[0]}"
    rep = Report(pinned)
    index = ""
    if remote.platforms:  # a run judges one platform: its statements name that manifest
        listed = ", ".join(f"{p} {d}" for p, d in remote.platforms)
        index = (
            f"; {image} names an index, and a run attests the platform manifest that ran "
            f"({listed}): verify --image {ref.registry}/{ref.repository}@<that digest>; a "
            f"statement about the index itself comes from its platforms' runs: imagegate "
            f"index {image} RUN..."
        )
    rep.add(
        "attestation",
        "failed",
        f"no attestation attached to {pinned} (tag {attach.attestation_tag(remote.digests[0])}, "
        f"nor as a referrer){index}",
    )
    return rep


@dataclass(frozen=True)
class SignedAttempt:
    """An attempt folder whose envelope verified: `statement` is the signed payload, `envelope`
    the very bytes that verified (what a statement built on it links and copies)."""

    dir: Path
    statement: dict[str, object]
    envelope: bytes
    signer: str  # the fingerprint of the trusted key its signature verified with


def certified_attempt(target: Path, keyless: Expected, *, use: str) -> PublicKey | None:
    """The key the certificate of an attempt's envelope (its bundle beside it) proves was the
    identity's: what `complete` verifies a keyless-signed earlier attempt with. None when the
    folder holds no envelope (load_attempt says so); refused (NotVerified, exit 1) when the
    certificate does not prove it, naming why."""
    from imagegate.attest.sign import DSSE_FILE
    from imagegate.errors import NotVerified

    envelope_path = (target if target.is_dir() else target.parent) / DSSE_FILE
    if not envelope_path.is_file():
        return None
    env = one_envelope(read_bounded(envelope_path), envelope_path)
    key, said = certified(envelope_path, env, keyless)
    if key is None:
        raise NotVerified(
            f"{envelope_path}: not signed by {keyless}, {use}: {said}",
            hint=f"check it with: imagegate verify {envelope_path} --identity … --issuer … --trusted-root …",
        )
    return key


def load_attempt(target: Path, trusted: Trusted, *, use: str, hint: str) -> SignedAttempt:
    """An attempt folder, or one of its attestation files: the folder must hold the signed
    envelope and statement.json, and must verify as `imagegate verify` checks it (the signature
    with a trusted key, the statement and statement.json, every evidence file's sha256, a
    completion's link). Refused otherwise (NotVerified, exit 1), naming the file, the check and
    what is not done with it (`use`: "so it is not completed"), before anything is built on it."""
    from imagegate.attest.sign import DSSE_FILE
    from imagegate.errors import NotVerified

    if not target.exists():
        raise UsageError(f"{target}: no such attempt folder or attestation", hint="give an attempt folder")
    folder = target if target.is_dir() else target.parent
    envelope_path = folder / DSSE_FILE
    missing = [p.name for p in (envelope_path, folder / "statement.json") if not p.is_file()]
    if missing:
        raise UsageError(
            f"{folder}: not a signed attempt (no {' and no '.join(missing)})",
            hint="give an attempt that was signed (run without --no-sign)",
        )
    data = read_bounded(envelope_path)  # read once: the bytes verified are the bytes linked
    envelope = one_envelope(data, envelope_path)
    rep = verify_in_folder(envelope, trusted, source=str(envelope_path), root=folder)
    if not rep.ok or rep.statement is None or rep.signer is None:
        failed = "; ".join(f"{c.name}: {c.detail}" for c in rep.failures)
        raise NotVerified(
            f"{envelope_path}: attempt {folder.name} does not verify, {use}: {failed}",
            hint=f"check it with: imagegate verify {envelope_path} --key PUB; {hint}",
        )
    return SignedAttempt(folder, rep.statement, data, rep.signer.fingerprint)


def accepts(
    report: Report, *, expect_verdict: str | None = None, require_complete: bool = False
) -> tuple[bool, str]:
    """Whether `imagegate verify` accepts what it verified, and the sentence that says why: a
    signature is not an acceptance. Our acceptance statement: its verdict by `run`'s exit-code
    rule (PASS and a deferred verdict accepted when they reach a level, the levels named; FAIL
    and ERROR not; --require-complete refuses a deferred one), or, with --expect-verdict, that
    verdict alone.
    An SLSA VSA: its verificationResult. Any other predicate: the checks alone."""
    from imagegate.attest.platforms import INDEX_PREDICATE_TYPE, index_levels
    from imagegate.attest.vsa import VSA_PREDICATE_TYPE, levels, no_level
    from imagegate.domain.results import exit_code
    from imagegate.errors import EXIT_ACCEPTED

    if not report.ok:
        return False, "NOT verified: " + "; ".join(f"{c.name}: {c.detail}" for c in report.failures)
    statement = report.statement or {}
    raw = statement.get("predicate")
    pred: dict[str, object] = obj(raw)
    verdict = report.verdict
    if verdict is not None:
        if expect_verdict is not None:  # its check is in the report, and passed
            return True, f"verified: verdict {verdict}, as expected"
        try:
            code = exit_code(verdict, require_complete=require_complete)
        except ValueError:
            return False, f"verified, but verdict {verdict!r} is not one imagegate writes: not accepted"
        of_index = report.predicate_type == INDEX_PREDICATE_TYPE
        got = index_levels(statement) if of_index else levels(statement)
        reached = ", ".join(got) or "no level"
        if code == EXIT_ACCEPTED and not got:  # a run whose checks were all left out proves nothing
            why = "no level every platform reached" if of_index else no_level(statement)
            return False, f"verified, but verdict {verdict} reaches no level: not accepted ({why})"
        if code == EXIT_ACCEPTED:
            return True, f"verified: verdict {verdict}, accepted (levels: {reached})"
        why = "--require-complete refuses a deferred verdict" if verdict.endswith("_DEFERRED") else "rejected"
        return False, f"verified, but verdict {verdict} is not accepted ({why}; levels: {reached})"
    if report.predicate_type == VSA_PREDICATE_TYPE:
        result = pred.get("verificationResult")
        named = ", ".join(str(x) for x in items(pred.get("verifiedLevels"))) or "no level"
        if result == "PASSED":
            return True, f"verified: verification summary PASSED (levels: {named})"
        return False, f"verified, but the verification summary says {result}: not accepted"
    return True, f"verified: {report.predicate_type} (no verdict to judge)"
