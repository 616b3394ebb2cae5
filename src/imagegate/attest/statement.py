"""The in-toto Statement v1 with imagegate's acceptance predicate
(manifests/acceptance-v1.schema.json, specified in manifests/acceptance-v1.md)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from imagegate._support.names import PREDICATE_TYPE as PREDICATE_TYPE
from imagegate.domain.evidence import sha256_file
from imagegate.domain.results import EvidenceFile, RunRecord, Side, StageResult, Status
from imagegate.errors import InternalError
from imagegate.pipeline.probes import PROBES, FactRules

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"

# Files of an attempt folder that are not evidence: the statement itself and what signs it.
NOT_EVIDENCE = ("statement.json",)
NOT_EVIDENCE_PREFIXES = ("attestation.", "vsa.", "testresult.")


def environment_digest(env: Any) -> str:
    """sha256 of the predicate's `environment` as canonical JSON: a verifier recomputes it, so
    the subject of an image-less run is still bound to something checkable."""
    return hashlib.sha256(canonical_json(env)).hexdigest()


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def subject(record: RunRecord) -> tuple[list[dict[str, Any]], str]:
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
            return [{"name": name, "digest": {algo: hexd}}], kind
    return [{"name": name, "digest": {"sha256": environment_digest(environment(record))}}], "environment"


def _gpu_present(env: dict[str, Any]) -> bool | None:
    gpu = env.get("gpu")
    if isinstance(gpu, dict) and isinstance(gpu.get("present"), bool):
        return bool(gpu["present"])
    return None


def _gpu_granted(env: dict[str, Any]) -> bool:
    """The runner's own fact (runner.gpu_granted), beside the image's word (`gpuPresent`)."""
    grant = env.get("gpus_granted")
    return isinstance(grant, dict) and grant.get("granted") is True


def attempt_evidence(record: RunRecord) -> list[dict[str, Any]]:
    """Every file of the attempt folder that no stage lists (plan, pipeline, bundle, controller
    output, run facts), with its sha256: together with the stages' files, all of the evidence."""
    root = Path(record.attempt_dir)
    if not root.is_dir():
        return []
    listed = {f.path for s in record.stages for f in s.evidence}
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if not p.is_file() or rel in listed or rel in NOT_EVIDENCE or rel.startswith(NOT_EVIDENCE_PREFIXES):
            continue
        out.append({"path": rel, "sha256": sha256_file(p), "size": p.stat().st_size})
    return out


def _key_isolation(env: dict[str, Any]) -> str | None:
    """How the probes were kept from the signing key (the driver's `key_isolation.method`):
    `none` where the environment under test could read it; None where the driver does not say."""
    facts = env.get("key_isolation")
    method = facts.get("method") if isinstance(facts, dict) else None
    return method if isinstance(method, str) else None


def environment(record: RunRecord) -> dict[str, Any]:
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


def stage_facts(stage_id: str, probe: str, data: dict[str, Any]) -> dict[str, Any]:
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
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in rules.items:
            out[key] = [_record(stage_id, probe, key, rules.items[key], item) for item in value or []]
        elif key in carried:
            out[key] = value
        elif key not in rules.evidence_only and key not in (*COMMON_EVIDENCE_ONLY, *COMMON_ELSEWHERE):
            raise InternalError(
                f"stage {stage_id}: probe {probe} reported the fact {key!r}, which the attestation "
                "does not know: it would be dropped",
                hint="this is a bug in imagegate: carry it or name it evidence-only in the probe's facts (pipeline/probes.py)",
            )
    return out


def _record(stage_id: str, probe: str, key: str, known: tuple[str, ...], item: Any) -> Any:
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


def predicate(record: RunRecord, subject_kind: str) -> dict[str, Any]:
    img = record.image
    return {
        "verdict": record.verdict,
        "pipeline": dict(record.pipeline),
        "plan": record.plan,
        "image": {
            "reference": img.reference,
            "repository": img.repository,
            "manifestDigest": img.manifest_digest,
            "configDigest": img.config_digest,
            "repoDigests": list(img.repo_digests),
            "platform": img.platform,
            "indexDigest": img.index_digest,
            "subjectDigest": subject_kind,
            **({"subjectNote": img.subject_note} if img.subject_note else {}),
        },
        "environment": environment(record),
        "stages": [
            {
                "id": s.id,
                "probe": s.probe,
                "side": s.side,
                "status": s.status.value,
                "token": s.token,
                "detail": s.detail,
                "durationSeconds": round(s.duration_s, 3),
                **({"startedSeconds": round(s.started_s, 3)} if s.started_s is not None else {}),
                "evidence": [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in s.evidence],
                **({"facts": f} if (f := _facts(s)) else {}),
                **({"fromAttempt": s.data["from_attempt"]} if s.data.get("from_attempt") else {}),
                **({"gpuGranted": True} if s.on_gpu else {}),
            }
            for s in record.stages
        ],
        "evidence": attempt_evidence(record),
        "bundleSha256": record.bundle_sha256,
        "attempt": {"id": record.attempt_id},
        "startedOn": record.started_at,
        "finishedOn": record.finished_at,
        "imagegate": {"version": record.imagegate_version},
        **({"completes": record.completes} if record.completes else {}),
    }


def _facts(s: StageResult) -> dict[str, Any]:
    carried = s.data.get("carried_facts")
    return dict(carried) if isinstance(carried, dict) else stage_facts(s.id, s.probe, s.data)


def build_statement(record: RunRecord) -> dict[str, Any]:
    subj, kind = subject(record)
    return {
        "_type": STATEMENT_TYPE,
        "subject": subj,
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate(record, kind),
    }


def evidence_files(statement: dict[str, Any]) -> list[dict[str, Any]]:
    """Every evidence file a statement lists (stages' and the attempt's), in order."""
    pred = statement.get("predicate") or {}
    files = [f for s in pred.get("stages") or [] for f in s.get("evidence") or []]
    return files + list(pred.get("evidence") or [])


def read_stage(raw: dict[str, Any]) -> StageResult:
    """A stage of a statement, as build_statement wrote it, read back (`report`, `complete`).
    The statement is read as untrusted: a field of the wrong kind reads as absent, an unknown
    status as ERROR, never a crash. `data` holds what the statement itself carries: the attempt
    a completion's result came from and the stage's facts; the stage's own `data` lives in its
    result.json, which the caller reads where it wants it."""
    try:
        status = Status(raw.get("status"))
    except ValueError:
        status = Status.ERROR
    side: Side = "outside" if raw.get("side") == "outside" else "inside"
    data: dict[str, Any] = {}
    if raw.get("fromAttempt"):
        data["from_attempt"] = str(raw["fromAttempt"])
    if isinstance(raw.get("facts"), dict) and raw["facts"]:
        data["carried_facts"] = raw["facts"]
    listed = raw.get("evidence")
    files: list[Any] = listed if isinstance(listed, list) else []
    evidence = [
        EvidenceFile(str(f.get("path")), str(f.get("sha256")), _int(f.get("size")))
        for f in files
        if isinstance(f, dict)
    ]
    return StageResult(
        id=str(raw.get("id", "?")),
        probe=str(raw.get("probe", "?")),
        side=side,
        status=status,
        detail=str(raw.get("detail", "")),
        duration_s=_seconds(raw.get("durationSeconds")) or 0.0,
        data=data,
        evidence=evidence,
        started_s=_seconds(raw.get("startedSeconds")),
        on_gpu=raw.get("gpuGranted") is True,
    )


def _seconds(value: Any) -> float | None:
    """A non-negative number of seconds, or None (absent, or not one)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 <= value < 1e9 else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
