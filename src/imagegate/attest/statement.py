"""The in-toto Statement v1 with imagegate's acceptance predicate
(manifests/acceptance-v1.schema.json, specified in manifests/acceptance-v1.md)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from imagegate._support import jsontypes as j
from imagegate._support.jsontypes import JsonMapping, canonical_json
from imagegate._support.names import PREDICATE_TYPE as PREDICATE_TYPE
from imagegate.domain.evidence import sha256_file
from imagegate.domain.results import EvidenceFile, RunRecord, StageResult
from imagegate.domain.statements import STATEMENT_TYPE as STATEMENT_TYPE
from imagegate.domain.statements import Acceptance, ImageEntry, StageEntry, Statement, Subject
from imagegate.errors import InternalError
from imagegate.pipeline.probes import PROBES, FactRules

# Files of an attempt folder that are not evidence: the statement itself and what signs it.
NOT_EVIDENCE = ("statement.json",)
NOT_EVIDENCE_PREFIXES = ("attestation.", "vsa.", "testresult.")


def environment_digest(env: object) -> str:
    """sha256 of the predicate's `environment` as canonical JSON: a verifier recomputes it, so
    the subject of an image-less run is still bound to something checkable."""
    return hashlib.sha256(canonical_json(env)).hexdigest()


def subject(record: RunRecord) -> tuple[tuple[Subject, ...], str]:
    """Subject: the repository name and the digest of the manifest whose config ran (for a
    reference that names an index, the platform's manifest: the index digest is only recorded in
    the predicate, since admission would read it as covering every platform); an image never
    pushed, or whose manifest could not be found, has only its config digest, and then the
    subject uses it; a run in an environment without an image (the local driver) names the
    environment and uses the digest of its recorded facts. The predicate's `image.subjectDigest`
    says which."""
    img = record.image
    name = img.repository or img.reference
    for kind, value in (("manifest", img.manifest_digest), ("config", img.config_digest)):
        if value:
            algo, _, hexd = value.partition(":")
            return (Subject(name, {algo: hexd}),), kind
    return (Subject(name, {"sha256": environment_digest(environment(record))}),), "environment"


def _gpu_present(env: JsonMapping) -> bool | None:
    gpu = env.get("gpu")
    if isinstance(gpu, dict) and isinstance(gpu.get("present"), bool):
        return bool(gpu["present"])
    return None


def _gpu_granted(env: JsonMapping) -> bool:
    """The runner's own fact (runner.gpu_granted), beside the image's word (`gpuPresent`)."""
    grant = env.get("gpus_granted")
    return isinstance(grant, dict) and grant.get("granted") is True


def attempt_evidence(record: RunRecord) -> list[EvidenceFile]:
    """Every file of the attempt folder that no stage lists (plan, pipeline, bundle, controller
    output, run facts), with its sha256: together with the stages' files, all of the evidence."""
    root = Path(record.attempt_dir)
    if not root.is_dir():
        return list(record.pending_evidence)
    listed = {f.path for s in record.stages for f in s.evidence}
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if not p.is_file() or rel in listed or rel in NOT_EVIDENCE or rel.startswith(NOT_EVIDENCE_PREFIXES):
            continue
        out.append(EvidenceFile(rel, sha256_file(p), p.stat().st_size))
    out += [f for f in record.pending_evidence if f.path not in listed]
    return sorted(out, key=lambda f: Path(f.path).parts)


def _key_isolation(env: JsonMapping) -> str | None:
    """How the probes were kept from the signing key (the driver's `key_isolation.method`):
    `none` where the environment under test could read it; None where the driver does not say."""
    facts = env.get("key_isolation")
    method = facts.get("method") if isinstance(facts, dict) else None
    return method if isinstance(method, str) else None


def environment(record: RunRecord) -> dict[str, object]:
    env = dict(record.environment)
    return {
        **env,
        "driver": env.get("driver"),
        "engine": env.get("engine"),
        "gpuPresent": _gpu_present(env),
        "gpuGranted": _gpu_granted(env),
        "keyIsolation": _key_isolation(env),
    }


# What the runner and the in-image controller add to any stage's data.
COMMON_EVIDENCE_ONLY = ("stdout_bytes", "stderr_bytes", "traceback")
COMMON_CARRIED = ("ran_for_record", "survivors_killed")
# Carried beside the facts: a completion's `fromAttempt`, and the facts of an earlier result as
# the earlier (verified) statement says them, already in the predicate's form.
COMMON_ELSEWHERE = ("from_attempt", "carried_facts")

# The runner's own stages, beside the registry's probes (pipeline/probes.py names each probe's).
RUNNER_FACTS: dict[str, FactRules] = {
    "image_id": FactRules(carried=("image_id", "expected")),
    # The runner's own stage for an image refused before it could run (runner.refused_stage).
    "refusal": FactRules(
        carried=(
            "refused",
            "error",
            "hint",
            "source",
            "manifest_digest",
            "config",
            "layer",
            "entry",
            "problems",
            "layers_read",
        ),
    ),
}
FACTS: dict[str, FactRules] = {**{n: p.facts for n, p in PROBES.items()}, **RUNNER_FACTS}


def stage_facts(stage_id: str, probe: str, data: JsonMapping) -> dict[str, object]:
    """What a consumer of the attestation acts on, per probe, without opening the evidence:
    pip's problems, the modules found, the vulnerability findings. Every key a probe reports is
    either carried here or, named in FACTS, kept in the evidence: never dropped unseen."""
    rules = FACTS.get(probe)
    if rules is None:
        if not data:
            return {}
        raise InternalError(
            f"stage {stage_id}: probe {probe!r} reported facts ({', '.join(sorted(data))}) that the "
            "attestation has no rules for",
            hint="this is a bug in imagegate: give the probe its facts in pipeline/probes.py",
        )
    carried = (*COMMON_CARRIED, *rules.carried)
    out: dict[str, object] = {}
    for key, value in data.items():
        if key in rules.items:
            out[key] = [_record(stage_id, probe, key, rules.items[key], item) for item in _listed(value)]
        elif key in carried:
            out[key] = value
        elif key not in rules.evidence_only and key not in (*COMMON_EVIDENCE_ONLY, *COMMON_ELSEWHERE):
            raise InternalError(
                f"stage {stage_id}: probe {probe} reported the fact {key!r}, which the attestation "
                "does not know: it would be dropped",
                hint="this is a bug in imagegate: carry it or name it evidence-only in the probe's facts (pipeline/probes.py)",
            )
    return out


def _listed(value: object) -> list[object]:
    """A fact's records: a list (none when empty or absent); anything else is the item itself,
    which _record refuses as not a record."""
    if isinstance(value, list | tuple):
        return list(value)
    return [value] if value else []


def _record(stage_id: str, probe: str, key: str, known: tuple[str, ...], item: object) -> dict[str, object]:
    if not isinstance(item, dict):
        raise InternalError(
            f"stage {stage_id}: probe {probe} reported {key} entry {item!r}, not a record",
            hint="this is a bug in imagegate",
        )
    unknown = sorted(set(item) - set(known))
    if unknown:
        raise InternalError(
            f"stage {stage_id}: probe {probe} reported {key} with {', '.join(map(repr, unknown))}, which the "
            "attestation does not know: it would be dropped",
            hint="this is a bug in imagegate: add it to the probe's facts (pipeline/probes.py)",
        )
    return dict(item)


def predicate(record: RunRecord, subject_kind: str) -> Acceptance:
    img = record.image
    return Acceptance(
        verdict=record.verdict,
        pipeline=j.freeze_object(record.pipeline),
        plan=j.freeze_object(record.plan),
        image=ImageEntry(
            reference=img.reference,
            repository=img.repository,
            manifest_digest=img.manifest_digest,
            config_digest=img.config_digest,
            repo_digests=tuple(img.repo_digests),
            platform=img.platform,
            index_digest=img.index_digest,
            subject_digest=subject_kind,
            subject_note=img.subject_note,
        ),
        environment=j.freeze_object(environment(record)),
        stages=tuple(_entry(s) for s in record.stages),
        evidence=tuple(attempt_evidence(record)),
        bundle_sha256=record.bundle_sha256,
        attempt_id=record.attempt_id,
        started_on=record.started_at,
        finished_on=record.finished_at,
        imagegate_version=record.imagegate_version,
        completes=j.freeze_object(record.completes) if record.completes else None,
        reuses=j.freeze_object(record.reuses) if record.reuses else None,
    )


def _entry(s: StageResult) -> StageEntry:
    from_attempt = s.data.get("from_attempt")
    return StageEntry(
        id=s.id,
        probe=s.probe,
        side=s.side,
        status=s.status,
        token=s.token,
        detail=s.detail,
        duration_s=s.duration_s,
        evidence=tuple(s.evidence),
        started_s=s.started_s,
        facts=j.freeze_object(_facts(s)),
        from_attempt=str(from_attempt) if from_attempt else None,
        gpu_granted=s.on_gpu,
    )


def _facts(s: StageResult) -> dict[str, object]:
    carried = s.data.get("carried_facts")
    return dict(carried) if isinstance(carried, dict) else stage_facts(s.id, s.probe, s.data)


def build_statement(record: RunRecord) -> Statement[Acceptance]:
    subj, kind = subject(record)
    return Statement(subject=subj, predicate_type=PREDICATE_TYPE, predicate=predicate(record, kind))


def read_stage(raw: object) -> StageResult:
    """A stage of a statement, as build_statement wrote it, read back (`report`, `complete`).
    The statement is read as untrusted (StageEntry.from_json). `data` holds what the statement
    itself carries: the attempt a completion's result came from and the stage's facts; the
    stage's own `data` lives in its result.json, which the caller reads where it wants it."""
    return stage_result(StageEntry.from_json(raw))


def stage_result(e: StageEntry) -> StageResult:
    """A statement's stage as a result (StageEntry's fields; its facts as carried facts)."""
    data: dict[str, object] = {}
    if e.from_attempt:
        data["from_attempt"] = e.from_attempt
    if e.facts:
        data["carried_facts"] = dict(e.facts)
    return StageResult(
        id=e.id,
        probe=e.probe,
        side=e.side,
        status=e.status,
        detail=e.detail,
        duration_s=e.duration_s,
        data=data,
        evidence=list(e.evidence),
        started_s=e.started_s,
        on_gpu=e.gpu_granted,
    )


def evidence_files(statement: JsonMapping) -> list[dict[str, object]]:
    """Every evidence file a statement (as JSON, read back) lists, stages' and the attempt's, in
    order."""
    pred = j.obj(statement.get("predicate"))
    files = [f for s in j.objects(pred.get("stages")) for f in j.objects(s.get("evidence"))]
    return files + j.objects(pred.get("evidence"))
