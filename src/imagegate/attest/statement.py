"""The in-toto Statement v1 with imagegate's acceptance predicate."""

from __future__ import annotations

from typing import Any

from imagegate.model import RunRecord

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://imagegate.dev/attestations/acceptance/v1"


def subject(record: RunRecord) -> tuple[list[dict[str, Any]], str]:
    """Subject: the repository name and the manifest digest; an image never pushed has only its
    config digest, and then the subject uses it (the predicate says which)."""
    img = record.image
    name = img.repository or img.reference
    if img.manifest_digest:
        algo, _, hexd = img.manifest_digest.partition(":")
        return [{"name": name, "digest": {algo: hexd}}], "manifest"
    if img.config_digest:
        algo, _, hexd = img.config_digest.partition(":")
        return [{"name": name, "digest": {algo: hexd}}], "config"
    return [{"name": name, "digest": {}}], "none"


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
            "subjectDigest": subject_kind,
        },
        "environment": record.environment,
        "stages": [
            {
                "id": s.id,
                "probe": s.probe,
                "side": s.side,
                "status": s.status.value,
                "token": s.token,
                "detail": s.detail,
                "durationSeconds": round(s.duration_s, 3),
                "evidence": [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in s.evidence],
            }
            for s in record.stages
        ],
        "bundleSha256": record.bundle_sha256,
        "attempt": {"id": record.attempt_id},
        "startedOn": record.started_at,
        "finishedOn": record.finished_at,
        "imagegate": {"version": record.imagegate_version},
    }


def build_statement(record: RunRecord) -> dict[str, Any]:
    subj, kind = subject(record)
    return {
        "_type": STATEMENT_TYPE,
        "subject": subj,
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate(record, kind),
    }
