"""The signed statements as values: the in-toto Statement v1 and the predicates imagegate writes
(acceptance, SLSA VSA v1, in-toto test-result v0.1). Each is frozen, is built by attest/ from a
run's record, and turns into JSON (`to_json`) only where it is written or signed. `from_json`
reads one back as untrusted input: a field of the wrong kind reads as absent, never a crash; a
predicate's fields this version does not know are kept (`extra`), so what is read is what
is said again. The published schema (manifests/acceptance-v1.schema.json) is checked against
these in the tests; the run path loads no schema engine."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from imagegate._support import jsontypes as j
from imagegate._support.jsontypes import JsonObject, JsonValue
from imagegate._support.names import PREDICATE_TYPE
from imagegate.domain.results import EvidenceFile, Side, Status

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
VSA_PREDICATE_TYPE = "https://slsa.dev/verification_summary/v1"
TEST_RESULT_PREDICATE_TYPE = "https://in-toto.io/attestation/test-result/v0.1"
NODE_PREDICATE_TYPE = "https://imagegate.dev/attestations/node-check/v1"  # imagegate.fleet.node_statement
# SLSA's VSA v1: producers may add extension fields "using field names that are URIs".
RUN_FIELD = "https://imagegate.dev/attestations/vsa/run"
# When the word of a VSA or test-result was said (attest/replace.py `when`): the `finishedOn` of
# the statement it was signed beside. An extension field; in-toto consumers ignore unknown ones.
TIME_FIELD = "https://imagegate.dev/attestations/finishedOn"


class Predicate(Protocol):
    def to_json(self) -> JsonObject: ...


@dataclass(frozen=True)
class Subject:
    name: str
    digest: Mapping[str, str]

    def to_json(self) -> JsonObject:
        return {"name": self.name, "digest": dict(self.digest)}

    @classmethod
    def from_json(cls, raw: object) -> Subject:
        d = j.obj(raw)
        digest = {str(k): v for k, v in j.obj(d.get("digest")).items() if isinstance(v, str)}
        return cls(name=j.text(d.get("name")) or "", digest=digest)


P = TypeVar("P", bound=Predicate, covariant=True)


@dataclass(frozen=True)
class Statement(Generic[P]):
    """An in-toto Statement v1: what is signed (DSSE payload type application/vnd.in-toto+json)."""

    subject: tuple[Subject, ...]
    predicate_type: str
    predicate: P

    def to_json(self) -> JsonObject:
        return {
            "_type": STATEMENT_TYPE,
            "subject": [s.to_json() for s in self.subject],
            "predicateType": self.predicate_type,
            "predicate": self.predicate.to_json(),
        }

    @classmethod
    def from_json(cls, raw: object) -> Statement[Predicate]:
        """Any statement; its predicate typed where imagegate knows the type, else kept as it is."""
        d = j.obj(raw)
        kind = j.text(d.get("predicateType")) or ""
        reader = READERS.get(kind, RawPredicate.from_json)
        return Statement(
            subject=tuple(Subject.from_json(s) for s in j.objects(d.get("subject"))),
            predicate_type=kind,
            predicate=reader(d.get("predicate")),
        )

    @property
    def acceptance(self) -> Acceptance | None:
        return self.predicate if isinstance(self.predicate, Acceptance) else None


@dataclass(frozen=True)
class RawPredicate:
    """A predicate of a type this module does not model (an index's, a mirror's), as JSON."""

    fields: JsonObject

    def to_json(self) -> JsonObject:
        return dict(self.fields)

    @classmethod
    def from_json(cls, raw: object) -> RawPredicate:
        return cls(_plain(j.obj(raw)))


def _plain(d: Mapping[str, object]) -> JsonObject:
    return {k: j.freeze(v) for k, v in d.items()}


def _evidence_json(f: EvidenceFile) -> JsonObject:
    return {"path": f.path, "sha256": f.sha256, "size": f.size}


def _evidence(raw: object) -> tuple[EvidenceFile, ...]:
    return tuple(
        EvidenceFile(str(f.get("path")), str(f.get("sha256")), j.integer(f.get("size")) or 0)
        for f in j.objects(raw)
    )


def _seconds(value: object) -> float | None:
    """A non-negative number of seconds, or None (absent, or not one)."""
    n = j.number(value)
    return n if n is not None and 0 <= n < 1e9 else None


@dataclass(frozen=True)
class StageEntry:
    """One stage as the acceptance predicate says it."""

    id: str
    probe: str
    side: Side
    status: Status
    token: str
    detail: str
    duration_s: float
    evidence: tuple[EvidenceFile, ...] = ()
    started_s: float | None = None
    facts: JsonObject = field(default_factory=dict)
    from_attempt: str | None = None
    gpu_granted: bool = False  # the runner granted GPUs to what this stage ran in, and saw them

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "id": self.id,
            "probe": self.probe,
            "side": self.side,
            "status": self.status.value,
            "token": self.token,
            "detail": self.detail,
            "durationSeconds": round(self.duration_s, 3),
        }
        if self.started_s is not None:
            out["startedSeconds"] = round(self.started_s, 3)
        out["evidence"] = [_evidence_json(f) for f in self.evidence]
        if self.facts:
            out["facts"] = dict(self.facts)
        if self.from_attempt:
            out["fromAttempt"] = self.from_attempt
        if self.gpu_granted:
            out["gpuGranted"] = True
        return out

    @classmethod
    def from_json(cls, raw: object) -> StageEntry:
        """Untrusted: an unknown status reads as ERROR, a field of the wrong kind as absent."""
        d = j.obj(raw)
        try:
            status = Status(d.get("status"))
        except ValueError:
            status = Status.ERROR
        return cls(
            id=str(d.get("id", "?")),
            probe=str(d.get("probe", "?")),
            side="outside" if d.get("side") == "outside" else "inside",
            status=status,
            token=str(d.get("token", "")),
            detail=str(d.get("detail", "")),
            duration_s=_seconds(d.get("durationSeconds")) or 0.0,
            evidence=_evidence(d.get("evidence")),
            started_s=_seconds(d.get("startedSeconds")),
            facts=_plain(j.obj(d.get("facts"))),
            from_attempt=str(d["fromAttempt"]) if d.get("fromAttempt") else None,
            gpu_granted=d.get("gpuGranted") is True,
        )


@dataclass(frozen=True)
class ImageEntry:
    """The image the run covered, and which of its digests the subject carries."""

    reference: str
    repository: str | None
    manifest_digest: str | None
    config_digest: str | None
    repo_digests: tuple[str, ...]
    platform: str | None
    index_digest: str | None
    subject_digest: str  # manifest, config or environment
    subject_note: str | None = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "reference": self.reference,
            "repository": self.repository,
            "manifestDigest": self.manifest_digest,
            "configDigest": self.config_digest,
            "repoDigests": list(self.repo_digests),
            "platform": self.platform,
            "indexDigest": self.index_digest,
            "subjectDigest": self.subject_digest,
        }
        if self.subject_note:
            out["subjectNote"] = self.subject_note
        return out

    @classmethod
    def from_json(cls, raw: object) -> ImageEntry:
        d = j.obj(raw)
        return cls(
            reference=j.text(d.get("reference")) or "",
            repository=j.text(d.get("repository")),
            manifest_digest=j.text(d.get("manifestDigest")),
            config_digest=j.text(d.get("configDigest")),
            repo_digests=tuple(j.strings(d.get("repoDigests"))),
            platform=j.text(d.get("platform")),
            index_digest=j.text(d.get("indexDigest")),
            subject_digest=j.text(d.get("subjectDigest")) or "",
            subject_note=j.text(d.get("subjectNote")),
        )


# The acceptance predicate's fields, in the order they are written; anything else is `extra`.
_ACCEPTANCE_FIELDS = (
    "verdict", "pipeline", "plan", "image", "environment", "stages", "evidence", "bundleSha256",
    "attempt", "startedOn", "finishedOn", "imagegate", "completes", "reuses",
)  # fmt: skip


@dataclass(frozen=True)
class Acceptance:
    """imagegate's acceptance predicate (manifests/acceptance-v1.md)."""

    verdict: str
    pipeline: JsonObject  # name, version, sha256, source
    plan: JsonObject  # the plan the run executed
    image: ImageEntry
    environment: JsonObject  # the driver's facts, with the runner's: gpuGranted, keyIsolation
    stages: tuple[StageEntry, ...]
    evidence: tuple[EvidenceFile, ...]  # the attempt's files that no stage lists
    bundle_sha256: str | None
    attempt_id: str
    started_on: str
    finished_on: str
    imagegate_version: str
    completes: JsonObject | None = None  # a completion's link to the earlier attempt
    reuses: JsonObject | None = None  # a reuse's link to the attempt whose results it carries
    extra: JsonObject = field(default_factory=dict)  # fields a newer imagegate wrote

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "verdict": self.verdict,
            "pipeline": dict(self.pipeline),
            "plan": dict(self.plan),
            "image": self.image.to_json(),
            "environment": dict(self.environment),
            "stages": [s.to_json() for s in self.stages],
            "evidence": [_evidence_json(f) for f in self.evidence],
            "bundleSha256": self.bundle_sha256,
            "attempt": {"id": self.attempt_id},
            "startedOn": self.started_on,
            "finishedOn": self.finished_on,
            "imagegate": {"version": self.imagegate_version},
        }
        if self.completes:
            out["completes"] = dict(self.completes)
        if self.reuses:
            out["reuses"] = dict(self.reuses)
        return {**out, **{k: v for k, v in self.extra.items() if k not in out}}

    @classmethod
    def from_json(cls, raw: object) -> Acceptance:
        d = j.obj(raw)
        completes, reuses = j.obj(d.get("completes")), j.obj(d.get("reuses"))
        return cls(
            verdict=j.text(d.get("verdict")) or "",
            pipeline=_plain(j.obj(d.get("pipeline"))),
            plan=_plain(j.obj(d.get("plan"))),
            image=ImageEntry.from_json(d.get("image")),
            environment=_plain(j.obj(d.get("environment"))),
            stages=tuple(StageEntry.from_json(s) for s in j.objects(d.get("stages"))),
            evidence=_evidence(d.get("evidence")),
            bundle_sha256=j.text(d.get("bundleSha256")),
            attempt_id=j.text(j.path(d, "attempt", "id")) or "",
            started_on=j.text(d.get("startedOn")) or "",
            finished_on=j.text(d.get("finishedOn")) or "",
            imagegate_version=j.text(j.path(d, "imagegate", "version")) or "",
            completes=_plain(completes) if completes else None,
            reuses=_plain(reuses) if reuses else None,
            extra=_plain({k: v for k, v in d.items() if k not in _ACCEPTANCE_FIELDS}),
        )

    def evidence_files(self) -> list[EvidenceFile]:
        """Every evidence file it lists (stages' and the attempt's), in order."""
        return [f for s in self.stages for f in s.evidence] + list(self.evidence)


@dataclass(frozen=True)
class Vsa:
    """An SLSA Verification Summary v1, with imagegate's two extension fields."""

    verifier_version: str
    time_verified: JsonValue
    resource_uri: str
    policy: JsonObject
    input_attestations: tuple[JsonObject, ...]
    verification_result: str  # PASSED or FAILED
    verified_levels: tuple[str, ...]
    run: JsonObject  # RUN_FIELD: the verdict and the stages behind the levels
    said_on: JsonValue  # TIME_FIELD

    def to_json(self) -> JsonObject:
        return {
            "verifier": {"id": VERIFIER_ID, "version": {"imagegate": self.verifier_version}},
            "timeVerified": self.time_verified,
            "resourceUri": self.resource_uri,
            "policy": dict(self.policy),
            "inputAttestations": [dict(i) for i in self.input_attestations],
            "verificationResult": self.verification_result,
            "verifiedLevels": list(self.verified_levels),
            "slsaVersion": "1.0",
            RUN_FIELD: dict(self.run),
            TIME_FIELD: self.said_on,
        }

    @classmethod
    def from_json(cls, raw: object) -> Vsa:
        d = j.obj(raw)
        return cls(
            verifier_version=j.text(j.path(d, "verifier", "version", "imagegate")) or "",
            time_verified=j.freeze(d.get("timeVerified")),
            resource_uri=j.text(d.get("resourceUri")) or "",
            policy=_plain(j.obj(d.get("policy"))),
            input_attestations=tuple(_plain(i) for i in j.objects(d.get("inputAttestations"))),
            verification_result=j.text(d.get("verificationResult")) or "",
            verified_levels=tuple(j.strings(d.get("verifiedLevels"))),
            run=_plain(j.obj(d.get(RUN_FIELD))),
            said_on=j.freeze(d.get(TIME_FIELD)),
        )


VERIFIER_ID = "https://imagegate.dev/verifier"


@dataclass(frozen=True)
class TestResult:
    """An in-toto test-result v0.1."""

    __test__ = False  # a value, not a pytest test class

    result: str  # PASSED, WARNED or FAILED
    configuration: tuple[JsonObject, ...]
    passed: tuple[str, ...]
    warned: tuple[str, ...]
    failed: tuple[str, ...]
    said_on: JsonValue  # TIME_FIELD

    def to_json(self) -> JsonObject:
        return {
            "result": self.result,
            "configuration": [dict(c) for c in self.configuration],
            "passedTests": list(self.passed),
            "warnedTests": list(self.warned),
            "failedTests": list(self.failed),
            TIME_FIELD: self.said_on,
        }

    @classmethod
    def from_json(cls, raw: object) -> TestResult:
        d = j.obj(raw)
        return cls(
            result=j.text(d.get("result")) or "",
            configuration=tuple(_plain(c) for c in j.objects(d.get("configuration"))),
            passed=tuple(j.strings(d.get("passedTests"))),
            warned=tuple(j.strings(d.get("warnedTests"))),
            failed=tuple(j.strings(d.get("failedTests"))),
            said_on=j.freeze(d.get(TIME_FIELD)),
        )


@dataclass(frozen=True)
class NodeCheck:
    """imagegate's node-check predicate (imagegate.fleet.node_statement): a node's check as a
    signed fact, its subject the node and each of its GPUs."""

    node: str
    gpus: tuple[str, ...]
    model: str
    verdict: str
    detail: str
    figures: Mapping[str, float]
    image: JsonObject  # the reference and digest of the image that ran the check
    attempt: str  # the id of the attempt it ran in
    checked_on: str
    version: str  # imagegate's

    def to_json(self) -> JsonObject:
        return {
            "node": self.node,
            "gpus": list(self.gpus),
            "model": self.model,
            "verdict": self.verdict,
            "detail": self.detail,
            "figures": dict(self.figures),
            "image": dict(self.image),
            "attempt": self.attempt,
            "checkedOn": self.checked_on,
            "imagegate": {"version": self.version},
        }

    @classmethod
    def from_json(cls, raw: object) -> NodeCheck:
        d = j.obj(raw)
        figures = {str(k): float(v) for k, v in j.obj(d.get("figures")).items() if isinstance(v, int | float)}
        return cls(
            node=j.text(d.get("node")) or "",
            gpus=tuple(j.strings(d.get("gpus"))),
            model=j.text(d.get("model")) or "",
            verdict=j.text(d.get("verdict")) or "",
            detail=j.text(d.get("detail")) or "",
            figures=figures,
            image=_plain(j.obj(d.get("image"))),
            attempt=j.text(d.get("attempt")) or "",
            checked_on=j.text(d.get("checkedOn")) or "",
            version=j.text(j.path(d, "imagegate", "version")) or "",
        )


READERS: dict[str, Callable[[object], Predicate]] = {
    PREDICATE_TYPE: Acceptance.from_json,
    VSA_PREDICATE_TYPE: Vsa.from_json,
    TEST_RESULT_PREDICATE_TYPE: TestResult.from_json,
    NODE_PREDICATE_TYPE: NodeCheck.from_json,
}
