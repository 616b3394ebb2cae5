"""The in-toto Statement v1 with imagegate's acceptance predicate
(manifests/acceptance-v1.schema.json, specified in manifests/acceptance-v1.md)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from imagegate.evidence import sha256_file
from imagegate.model import RunRecord

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://imagegate.dev/attestations/acceptance/v1"

# Files of an attempt folder that are not evidence: the statement itself and what signs it.
NOT_EVIDENCE = ("statement.json",)
NOT_EVIDENCE_PREFIXES = ("attestation.", "vsa.")


def environment_digest(env: Any) -> str:
    """sha256 of the predicate's `environment` as canonical JSON: a verifier recomputes it, so
    the subject of an image-less run is still bound to something checkable."""
    return hashlib.sha256(canonical_json(env)).hexdigest()


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def subject(record: RunRecord) -> tuple[list[dict[str, Any]], str]:
    """Subject: the repository name and the manifest digest; an image never pushed has only its
    config digest, and then the subject uses it; a run in an environment without an image (the
    local driver) names the environment and uses the digest of its recorded facts. The
    predicate's `image.subjectDigest` says which."""
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


def environment(record: RunRecord) -> dict[str, Any]:
    env = dict(record.environment)
    return {**env, "driver": env.get("driver"), "engine": env.get("engine"), "gpuPresent": _gpu_present(env)}


def _pick(items: Any, keys: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{k: i[k] for k in keys if k in i} for i in items or [] if isinstance(i, dict)]


def stage_facts(probe: str, data: dict[str, Any]) -> dict[str, Any]:
    """What a consumer of the attestation acts on, per probe, without opening the evidence:
    pip's problems, the modules found, the vulnerability findings. Bulky data (sys.path, the
    full inventory, raw output) stays in the evidence files, whose digests are listed."""
    if probe == "pip_check":
        keys: tuple[str, ...] = (
            "kind",
            "project",
            "version",
            "requirement",
            "dependency",
            "installed",
            "ignored",
            "line",
        )
        return {"problems": _pick(data.get("problems"), keys)} if "problems" in data else {}
    if probe == "find_spec":
        keys = ("module", "found", "namespace", "distribution", "version", "origin", "reason", "error")
        return {"modules": _pick(data.get("modules"), keys)} if "modules" in data else {}
    if probe == "vulns":
        keys = ("id", "aliases", "package", "version", "fixed", "severity", "state", "ignore")
        out = {"findings": _pick(data.get("findings"), keys)} if "findings" in data else {}
        if "source" in data:
            out["source"] = data["source"]
        return out
    if probe == "cli":
        keys = ("argv", "how", "platform", "platform_checked_against", "returncode", "version_choice", "raw")
        return {k: data[k] for k in keys if k in data}
    if probe == "gpu_preflight":
        return _gpu_facts(data)
    if probe == "av_roundtrip":
        keys = ("av_version", "codec", "width", "height", "decoded_frames", "decoded_widths")
        return {k: data[k] for k in keys if k in data}
    return {}


def _gpu_facts(data: dict[str, Any]) -> dict[str, Any]:
    """The node check's figures: the GPUs, the image's torch, TFLOP/s, the all-reduce."""
    facts = data.get("facts") or {}
    out: dict[str, Any] = {
        k: facts[k] for k in ("torch", "cuda_runtime", "arch_list", "driver") if k in facts
    }
    keys = ("index", "name", "capability", "total_memory_bytes", "free_memory_bytes", "uuid", "arch_coverage")
    if facts.get("devices") is not None:
        out["gpus"] = _pick(facts.get("devices"), keys)
    matmul = data.get("matmul") or {}
    if matmul.get("gpus"):
        mkeys = ("index", "size", "tflops", "finite", "relative_error", "tolerance", "seconds_per_matmul")
        out["matmul"] = _pick(matmul["gpus"], mkeys)
    ar = data.get("allreduce") or {}
    if ar.get("ranks"):
        akeys = ("rank", "world", "bytes", "busbw_gbps", "algbw_gbps", "sum_ok", "sum_checks")
        out["allreduce"] = _pick(ar["ranks"], akeys)
    elif ar.get("skipped") or ar.get("error"):
        out["allreduce"] = {k: ar[k] for k in ("skipped", "error") if k in ar}
    if data.get("unfit"):
        out["unfit"] = data["unfit"]
    return out


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
                "evidence": [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in s.evidence],
                **({"facts": f} if (f := stage_facts(s.probe, s.data)) else {}),
                **({"fromAttempt": s.data["from_attempt"]} if s.data.get("from_attempt") else {}),
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
