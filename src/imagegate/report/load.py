"""Rebuild a RunRecord from an attempt folder's stored evidence (`statement.json`, `run.json`,
each stage's `result.json`), so that any report can be rendered again later, anywhere."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from imagegate.errors import UsageError
from imagegate.model import EvidenceFile, ImageFacts, RunRecord, Side, StageResult, Status
from imagegate.oci import untrusted_json

STATEMENT = "statement.json"


# Evidence files are ours, but a folder can be edited after the run: read them within bounds.
MAX_JSON_BYTES = 64 << 20


def _read_json(path: Path) -> Any:
    try:
        return untrusted_json.loads(path.read_bytes(), max_bytes=MAX_JSON_BYTES)
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
    return path.read_text(encoding="utf-8")


def _stage(raw: dict[str, Any], root: Path) -> StageResult:
    evidence = [
        EvidenceFile(str(f["path"]), str(f["sha256"]), int(f["size"])) for f in raw.get("evidence") or []
    ]
    data: dict[str, Any] = {}
    # `data` (e.g. the layer table) is kept in the stage's result.json, not in the statement.
    for f in evidence:
        if Path(f.path).name == "result.json" and (root / f.path).is_file():
            stored = _read_json(root / f.path)
            if isinstance(stored, dict) and isinstance(stored.get("data"), dict):
                data = stored["data"]
    if raw.get("fromAttempt"):  # a completion's result carried over from the earlier attempt
        data["from_attempt"] = str(raw["fromAttempt"])
    try:
        status = Status(raw.get("status"))
    except ValueError:
        status = Status.ERROR
    side: Side = "outside" if raw.get("side") == "outside" else "inside"
    return StageResult(
        id=str(raw.get("id", "?")),
        probe=str(raw.get("probe", "?")),
        side=side,
        status=status,
        detail=str(raw.get("detail", "")),
        duration_s=float(raw.get("durationSeconds") or 0.0),
        data=data,
        evidence=evidence,
    )


def load_attempt(attempt_dir: Path) -> RunRecord:
    """A RunRecord equal (for every report) to the one the run had in memory."""
    try:
        statement = untrusted_json.loads(statement_text(attempt_dir), max_bytes=MAX_JSON_BYTES)
    except untrusted_json.UntrustedJSONError as e:
        raise UsageError(f"{attempt_dir / STATEMENT}: cannot read it: {e}") from e
    pred = statement.get("predicate") if isinstance(statement, dict) else None
    if not isinstance(pred, dict) or "verdict" not in pred:
        raise UsageError(f"{attempt_dir / STATEMENT}: not an imagegate acceptance statement")
    run_json = attempt_dir / "run.json"
    run_facts = _read_json(run_json) if run_json.is_file() else {}
    img = pred.get("image") or {}
    # run.json holds the environment as the runner saw it; the predicate adds derived keys.
    env = run_facts.get("environment") if isinstance(run_facts.get("environment"), dict) else None
    return RunRecord(
        attempt_id=str((pred.get("attempt") or {}).get("id") or attempt_dir.name),
        attempt_dir=str(attempt_dir),
        pipeline=dict(pred.get("pipeline") or {}),
        plan=dict(pred.get("plan") or {}),
        image=ImageFacts(
            reference=str(img.get("reference") or "?"),
            config_digest=img.get("configDigest"),
            manifest_digest=img.get("manifestDigest"),
            repo_digests=tuple(img.get("repoDigests") or ()),
            platform=img.get("platform"),
            repository=img.get("repository"),
        ),
        environment=dict(env if env is not None else pred.get("environment") or {}),
        stages=[_stage(s, attempt_dir) for s in pred.get("stages") or []],
        started_at=str(pred.get("startedOn") or ""),
        finished_at=str(pred.get("finishedOn") or ""),
        verdict=str(pred["verdict"]),
        imagegate_version=str((pred.get("imagegate") or {}).get("version") or "?"),
        bundle_sha256=pred.get("bundleSha256"),
        completes=pred["completes"] if isinstance(pred.get("completes"), dict) else None,
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
