"""Rebuild a RunRecord from an attempt folder's stored evidence, so that any report can be
rendered again later, anywhere: the statement as signed (the payload of the attempt's DSSE
envelope; `statement.json` only where the attempt is unsigned), and from `run.json` and each
stage's `result.json` only what matches the sha256 the statement lists for it. What vouches for
the statement, and what differs from it, is the `Provenance` every format shows."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from imagegate._support import jsontypes as j
from imagegate._support.jsontypes import JsonObject
from imagegate.attest import dsse
from imagegate.attest.envelopes import read_envelopes
from imagegate.attest.keys import PublicKey
from imagegate.attest.sign import DSSE_FILE
from imagegate.attest.statement import read_stage
from imagegate.domain.evidence import sha256_file
from imagegate.domain.results import ImageFacts, RunRecord, StageResult
from imagegate.errors import UsageError
from imagegate.oci import untrusted_json
from imagegate.report import view
from imagegate.report.provenance import Provenance, Signature

STATEMENT = "statement.json"


# Evidence files are ours, but a folder can be edited after the run: read them within bounds.
MAX_JSON_BYTES = 64 << 20


def _read_json(path: Path) -> object:
    try:
        return untrusted_json.loads(untrusted_json.read_file(path, max_bytes=MAX_JSON_BYTES))
    except OSError as e:
        raise UsageError(f"{path}: cannot read it ({e.strerror})") from e
    except untrusted_json.UntrustedJSONError as e:
        raise UsageError(f"{path}: cannot read it: {e}") from e


def statement_text(attempt_dir: Path) -> str:
    """The stored statement as written by the run: the signed bytes are not re-serialised."""
    path = attempt_dir / STATEMENT
    if not path.is_file():
        raise UsageError(
            f"{attempt_dir}: not an attempt folder (no {STATEMENT})",
            hint="give OUT/<image>/<attempt> as written by `imagegate run -o OUT`",
        )
    try:
        return untrusted_json.read_file(path, max_bytes=MAX_JSON_BYTES).decode("utf-8")
    except (OSError, untrusted_json.UntrustedJSONError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read it: {e}") from e


def _signed_copy(path: Path, sha256: str, differs: list[str]) -> object:
    """An evidence file's JSON, only when it is the file the statement lists (its sha256);
    otherwise None, and the difference is said."""
    if not path.is_file():
        return None
    stored = _read_json(path)  # bounded: a hostile file is an input error naming it
    if sha256_file(path) != sha256:
        differs.append(f"{path.name} in {path.parent}: differs from its sha256 in the statement: not shown")
        return None
    return stored


def _stage(raw: object, root: Path, differs: list[str]) -> StageResult:
    """The statement's stage (attest.statement.read_stage), with its `data` (e.g. the layer
    counts) from its result.json, only where that file is the one the statement lists."""
    stage = read_stage(raw)
    data = {k: v for k, v in stage.data.items() if k == "from_attempt"}
    for f in stage.evidence:
        if Path(f.path).name == "result.json":
            stored = _signed_copy(root / f.path, f.sha256, differs)
            if isinstance(stored, dict) and isinstance(stored.get("data"), dict):
                data = {**stored["data"], **data}
    return dataclasses.replace(stage, data=data)


@dataclass(frozen=True)
class Loaded:
    record: RunRecord
    statement: JsonObject  # the one the record is built from: as signed, where it was
    provenance: Provenance


def load_attempt(attempt_dir: Path) -> RunRecord:
    """A RunRecord equal (for every report) to the one the run had in memory."""
    return read_attempt(attempt_dir).record


def read_attempt(attempt_dir: Path, key: PublicKey | None = None) -> Loaded:
    """The attempt's statement as signed, checked with `key` when given, and what vouches for it."""
    copy = _statement(statement_text(attempt_dir).encode(), attempt_dir / STATEMENT)
    signed = _signed_statement(attempt_dir, key)
    if isinstance(signed, Provenance):  # unsigned, or an envelope that cannot be read
        statement, provenance = copy, signed
    else:
        statement, provenance = signed
        provenance = Provenance(provenance.signature, provenance.fingerprint, differs=copy != statement)
    differs: list[str] = []
    record = _record(statement, attempt_dir, differs)
    if differs:
        provenance = Provenance(provenance.signature, provenance.fingerprint, provenance.differs, (*differs,))
    return Loaded(record, statement, provenance)


def _statement(raw: bytes, where: Path) -> JsonObject:
    try:
        statement = untrusted_json.loads(raw, max_bytes=MAX_JSON_BYTES)
    except untrusted_json.UntrustedJSONError as e:
        raise UsageError(f"{where}: cannot read it: {e}") from e
    pred = statement.get("predicate") if isinstance(statement, dict) else None
    if not isinstance(pred, dict) or "verdict" not in pred:
        raise UsageError(f"{where}: not an imagegate acceptance statement")
    assert isinstance(statement, dict)
    return statement  # parsed JSON: an object of JSON values


def _signed_statement(attempt_dir: Path, key: PublicKey | None) -> tuple[JsonObject, Provenance] | Provenance:
    """The envelope's payload and whether `key` verifies it; a Provenance alone where there is
    no envelope, or none that can be read."""
    fingerprint = key.fingerprint if key else None
    path = attempt_dir / DSSE_FILE
    if not path.is_file():
        return Provenance("unsigned", fingerprint)
    try:
        (envelope,) = read_envelopes(path)
        if envelope.payload_type != dsse.INTOTO_PAYLOAD_TYPE:
            raise UsageError(f"{path}: payloadType {envelope.payload_type!r} is not an in-toto statement")
        statement = _statement(envelope.payload, path)
    except (UsageError, ValueError) as e:
        why = str(e) if isinstance(e, UsageError) else f"{path}: holds more than one envelope"
        return Provenance("unreadable", fingerprint, problems=(why,))
    signature: Signature = "not checked"
    if key is not None:
        signature = "verified" if envelope.verified_by(key) else "failed"
    return statement, Provenance(signature, fingerprint)


def _as_dict(value: object) -> dict[str, object]:
    """`dict(value or {})`, as the record has always taken an object of the statement (an
    array of pairs too); what is no iterable reads as absent."""
    return dict(value) if value and isinstance(value, Iterable) else {}


def _record(statement: JsonObject, attempt_dir: Path, differs: list[str]) -> RunRecord:
    pred = j.obj(statement["predicate"])  # an object holding a verdict (_statement)
    listed = {str(f.get("path")): str(f.get("sha256")) for f in j.objects(pred.get("evidence"))}
    run_facts = _signed_copy(attempt_dir / "run.json", listed.get("run.json", ""), differs)
    img = j.obj(pred.get("image"))
    # run.json holds the environment as the runner saw it; the predicate adds derived keys.
    env = j.obj(run_facts).get("environment")
    completes = pred.get("completes")
    return RunRecord(
        attempt_id=str(j.path(pred, "attempt", "id") or attempt_dir.name),
        attempt_dir=str(attempt_dir),
        pipeline=_as_dict(pred.get("pipeline")),
        plan=_as_dict(pred.get("plan")),
        image=ImageFacts(
            reference=str(img.get("reference") or "?"),
            config_digest=j.text(img.get("configDigest")),
            manifest_digest=j.text(img.get("manifestDigest")),
            repo_digests=tuple(d for d in view.each(img.get("repoDigests")) if isinstance(d, str)),
            platform=j.text(img.get("platform")),
            repository=j.text(img.get("repository")),
            index_digest=j.text(img.get("indexDigest")),
            subject_note=j.text(img.get("subjectNote")),
        ),
        environment=dict(env) if isinstance(env, dict) else _as_dict(pred.get("environment")),
        stages=[_stage(s, attempt_dir, differs) for s in view.each(pred.get("stages"))],
        started_at=str(pred.get("startedOn") or ""),
        finished_at=str(pred.get("finishedOn") or ""),
        verdict=str(pred["verdict"]),
        imagegate_version=str(j.path(pred, "imagegate", "version") or "?"),
        bundle_sha256=j.text(pred.get("bundleSha256")),
        completes=completes if isinstance(completes, dict) else None,
    )


# How `imagegate run` names an attempt folder (evidence.Attempt): its UTC time, then a random tail.
ATTEMPT_NAME = re.compile(r"^\d{8}T\d{6}\.\d{3}Z-[0-9a-f]{6}$")


def resolve_attempt(path: Path) -> Path:
    """An attempt folder as given, or the latest attempt of an image folder (OUT/<image>/):
    attempt names start with their UTC time, so the last in name order is the newest. Any other
    folder is refused, never searched: a report must be of the attempt the user meant."""
    if (path / STATEMENT).is_file():
        return path
    if not path.is_dir():
        raise UsageError(
            f"{path}: no such folder", hint="give OUT/<image>/<attempt> as written by `imagegate run -o OUT`"
        )
    try:
        children = list(path.iterdir())
    except OSError as e:
        raise UsageError(f"{path}: cannot list it ({e.strerror})") from e
    attempts = sorted(p for p in children if ATTEMPT_NAME.match(p.name) and (p / STATEMENT).is_file())
    if not attempts:
        raise UsageError(
            f"{path}: neither an attempt folder (no {STATEMENT}) nor an image's folder of attempts",
            hint="give OUT/<image>/<attempt>, or OUT/<image> for its latest attempt, "
            "as written by `imagegate run -o OUT`",
        )
    return attempts[-1]
