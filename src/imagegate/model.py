"""Results as data: stage statuses, tokens, the verdict and its exit code (docs/design.md, "Stages and the verdict")."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Side = Literal["inside", "outside"]


class Status(str, enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"  # the check ran and the image is wrong
    ERROR = "ERROR"  # the check could not run (timeout, crash, missing interpreter)
    DEFERRED = "DEFERRED"  # not run here: needs what this environment lacks (a GPU), or --skip
    SKIPPED = "SKIPPED"  # a stage it needs did not pass, or nothing here to check (no image)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class EvidenceFile:
    """A file in the attempt folder, path relative to it."""

    path: str
    sha256: str
    size: int


@dataclass
class StageResult:
    id: str
    probe: str
    side: Side
    status: Status
    detail: str
    duration_s: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)
    evidence: list[EvidenceFile] = field(default_factory=list)
    # When it began, in seconds from the run's start, as the runner saw it (stages run side by
    # side: a timeline draws each at its start); None where nobody watched it begin (a Pod's log).
    started_s: float | None = None

    @property
    def token(self) -> str:
        return token(self.id, self.status)


def token(stage_id: str, status: Status) -> str:
    return f"{stage_id.upper()}_{status.value}"


def verdict(stages: Iterable[StageResult]) -> str:
    """FAIL > ERROR > PASS; deferred stages (none failed or errored) give
    CPU_PASS_<IDS>_DEFERRED, e.g. CPU_PASS_GPU_CLI_DEFERRED: every stage that ran passed, and
    those named did not run (no GPU here, or left out with --skip), so `complete` can run them.
    A stage the user skipped is DEFERRED, never counted as passed. What a verdict earns for
    admission is its levels (`levels`), decided by which stages ran and passed. A run where
    nothing ran is ERROR: an empty pipeline proves nothing."""
    stages = list(stages)
    if not stages:
        return "ERROR"
    statuses = {s.status for s in stages}
    if Status.FAIL in statuses:
        return "FAIL"
    if Status.ERROR in statuses:
        return "ERROR"
    deferred = [s.id.upper() for s in stages if s.status is Status.DEFERRED]
    if not deferred:
        if all(s.status is Status.SKIPPED for s in stages):
            return "ERROR"
        return "PASS"
    return "CPU_PASS_" + "_".join(deferred) + "_DEFERRED"


USER_SKIP = "--skip "  # how a plan records a stage the user left out (plan.PlannedStage.skipped)


def recorded_needs(plan: Mapping[str, Any]) -> dict[str, list[str]]:
    """Stage id -> the ids it needs, from a plan as recorded (plan.json, a statement's plan)."""
    return {
        str(st.get("id")): [str(n) for n in st.get("needs") or []]
        for st in plan.get("stages") or []
        if isinstance(st, dict)
    }


def waiting_on_deferred(
    stages: Iterable[StageResult], needs: Mapping[str, Iterable[str]]
) -> dict[str, list[str]]:
    """SKIPPED stage id -> the DEFERRED stages it waited on, directly or through another stage
    skipped the same way: checks that never ran for want of a deferred one (`complete` runs
    them with it). `needs`: stage id -> the ids it needs; `stages` in plan order."""
    stages = list(stages)
    status = {s.id: s.status for s in stages}
    causes: dict[str, list[str]] = {}
    for s in stages:  # plan order: what a stage needs comes before it
        if s.status is not Status.SKIPPED:
            continue
        unmet = [n for n in needs.get(s.id, ()) if status.get(n) is not Status.PASS]
        found: list[str] = []
        for n in unmet:
            if status.get(n) is Status.DEFERRED:
                found.append(n)
            elif n in causes:
                found += causes[n]
            else:
                break  # skipped for another reason too (a FAIL, stop_on_fail): not deferral's doing
        else:
            if found:
                causes[s.id] = list(dict.fromkeys(found))
    return causes


# The levels a signed verdict reaches (SLSA reserves the SLSA_ prefix), decided by what ran:
# CPU = the verdict is accepted, at least one stage that needs no GPU ran, and every such stage
# ran and passed; GPU = CPU, and the pipeline has GPU stages (`requires: [gpu]`), every one of
# which ran on a GPU and passed (in this attempt or, carried, in the one it completes).
LEVEL_CPU = "IMAGEGATE_CPU"
LEVEL_GPU = "IMAGEGATE_GPU"


def levels(verdict_token: str, stages: Iterable[tuple[Status, bool]]) -> list[str]:
    """`stages`: each stage's (status, whether it is a GPU stage). A stage skipped (--skip, a
    stage it needs not passing, nothing to check here) or deferred never counts as passed."""
    try:
        if exit_code(verdict_token) != EXIT_ACCEPTED:
            return []
    except ValueError:
        return []
    stages = list(stages)
    cpu = [st for st, gpu in stages if not gpu]
    gpu = [st for st, gpu in stages if gpu]
    if not cpu or any(st is not Status.PASS for st in cpu):
        return []
    if gpu and all(st is Status.PASS for st in gpu):
        return [LEVEL_CPU, LEVEL_GPU]
    return [LEVEL_CPU]


EXIT_ACCEPTED = 0
EXIT_REJECTED = 1
EXIT_UNDECIDED = 2
EXIT_USAGE = 3


def exit_code(verdict_token: str, *, require_complete: bool = False) -> int:
    if verdict_token == "PASS":
        return EXIT_ACCEPTED
    if verdict_token == "FAIL":
        return EXIT_REJECTED
    if verdict_token == "ERROR":
        return EXIT_UNDECIDED
    if verdict_token.endswith("_DEFERRED"):
        return EXIT_REJECTED if require_complete else EXIT_ACCEPTED
    raise ValueError(f"unknown verdict {verdict_token!r}")


@dataclass(frozen=True)
class ImageFacts:
    """What the driver learned about the image it ran. `config_digest` is the image ID
    (sha256 of the config blob); `manifest_digest` is known only for pushed/pulled images, and
    is the manifest whose config ran, never an index; `index_digest` is the index it was chosen
    from, when the reference named one; `subject_note` says why no manifest digest is known
    for an image the engine knows from a registry."""

    reference: str
    config_digest: str | None
    manifest_digest: str | None = None
    repo_digests: tuple[str, ...] = ()
    platform: str | None = None
    repository: str | None = None
    index_digest: str | None = None
    subject_note: str | None = None


@dataclass
class RunRecord:
    """Everything one attempt produced; the attestation and every report are built from it."""

    attempt_id: str
    attempt_dir: str
    pipeline: Mapping[str, Any]  # name, version, sha256, source
    plan: Mapping[str, Any]
    image: ImageFacts
    environment: dict[str, Any]  # driver, engine, gpu, python, ...
    stages: list[StageResult]
    started_at: str
    finished_at: str
    verdict: str
    imagegate_version: str
    bundle_sha256: str | None = None
    # A completion (`imagegate complete`): the earlier attempt it completes, linked by the sha256
    # of that attempt's signed envelope (manifests/acceptance-v1.md, `completes`).
    completes: dict[str, Any] | None = None
