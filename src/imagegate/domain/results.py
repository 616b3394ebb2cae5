"""Results as data: stage statuses, tokens, the verdict and its exit code (docs/design.md, "Stages and the verdict")."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from imagegate._support import jsontypes as j
from imagegate.errors import EXIT_ACCEPTED, EXIT_REJECTED, EXIT_UNDECIDED

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
    data: dict[str, object] = field(default_factory=dict)
    evidence: list[EvidenceFile] = field(default_factory=list)
    # When it began, in seconds from the run's start, as the runner saw it (stages run side by
    # side: a timeline draws each at its start); None where nobody watched it begin (a Pod's log).
    started_s: float | None = None
    # The runner granted GPUs to the container or process this stage ran in, and saw them
    # (runner.gpu_granted): never the image's own report of a GPU.
    on_gpu: bool = False

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


def recorded_needs(plan: Mapping[str, object]) -> dict[str, list[str]]:
    """Stage id -> the ids it needs, from a plan as recorded (plan.json, a statement's plan)."""
    return {
        str(st.get("id")): [str(n) for n in j.items(st.get("needs"))] for st in j.objects(plan.get("stages"))
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
# CPU = the verdict is accepted, at least one stage checked something and passed, and every stage
# that needs no GPU and had something to check ran and passed; GPU = CPU, and the pipeline's GPU
# stages (`requires: [gpu]`) that had something to check, one at least, each ran and passed on
# GPUs the runner granted and saw (in this attempt or, carried, in the one it completes): the
# image's own word that it had a GPU never earns it.
LEVEL_CPU = "IMAGEGATE_CPU"
LEVEL_GPU = "IMAGEGATE_GPU"


@dataclass(frozen=True)
class Counted:
    """A stage as the levels see it. `waited`: SKIPPED while waiting on a deferred stage, a check
    that did not run; any other SKIPPED stage had nothing to check (no modules, no image here)
    and counts neither for nor against a level."""

    id: str
    status: Status
    gpu: bool = False  # a GPU stage: its plan `requires` gpu
    on_gpu: bool = False  # the runner granted GPUs where it ran, and saw them
    waited: bool = False

    @property
    def neutral(self) -> bool:
        return self.status is Status.SKIPPED and not self.waited

    @property
    def passed(self) -> bool:
        return self.status is Status.PASS and (self.on_gpu or not self.gpu)


def levels(verdict_token: str, stages: Iterable[Counted]) -> list[str]:
    """A stage skipped (--skip, a stage it waited on) or deferred never counts as passed; a GPU
    stage counts only where the runner gave it GPUs."""
    try:
        if exit_code(verdict_token) != EXIT_ACCEPTED:
            return []
    except ValueError:
        return []
    checked = [s for s in stages if not s.neutral]
    if not any(s.passed for s in checked) or not all(s.passed for s in checked if not s.gpu):
        return []
    gpu = [s for s in checked if s.gpu]
    if gpu and all(s.passed for s in gpu):
        return [LEVEL_CPU, LEVEL_GPU]
    return [LEVEL_CPU]


def unreached(stages: Iterable[Counted]) -> str:
    """Why a verdict reached no level, in words: the stages needing no GPU that did not run and
    pass (every stage when none passed), and those that had nothing to check."""
    stages = list(stages)
    none_passed = not any(s.passed for s in stages)
    missing = [s for s in stages if not s.neutral and not s.passed and (none_passed or not s.gpu)]
    parts = ["no stage checked something and passed"] if none_passed else []
    if missing:
        shown = ", ".join(
            f"{s.id} {s.status.value}" + (" without GPUs" * (s.gpu and not s.on_gpu)) for s in missing
        )
        parts.append(f"not run or not passed: {shown}")
    if empty := [s.id for s in stages if s.neutral]:
        parts.append(f"nothing to check: {', '.join(empty)}")
    return "no level reached (" + "; ".join(parts) + ")"


def gpu_stage_ids(plan: Mapping[str, object]) -> set[str]:
    """The GPU stages of a plan as recorded: those whose `requires` names gpu."""
    return {str(st.get("id")) for st in j.objects(plan.get("stages")) if "gpu" in j.items(st.get("requires"))}


def counted(stages: Sequence[StageResult], plan: Mapping[str, object]) -> list[Counted]:
    """`stages` (plan order) as the levels count them, by the plan they ran under (recorded). A
    stage that waited on deferred GPU stages alone counts as one of them: it needs a GPU too."""
    gpu = gpu_stage_ids(plan)
    waited = waiting_on_deferred(stages, recorded_needs(plan))
    out = []
    for s in stages:
        needs_gpu = s.id in gpu or (s.id in waited and set(waited[s.id]) <= gpu)
        out.append(Counted(s.id, s.status, needs_gpu, s.on_gpu, s.id in waited))
    return out


def accepted(verdict_token: str, reached: Sequence[str], *, require_complete: bool = False) -> int:
    """The exit code of a verdict that reached the levels `reached`: an accepted verdict that
    reached none is rejected (a run whose checks were all left out proves nothing)."""
    code = exit_code(verdict_token, require_complete=require_complete)
    return EXIT_REJECTED if code == EXIT_ACCEPTED and not reached else code


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
    pipeline: Mapping[str, object]  # name, version, sha256, source
    plan: Mapping[str, object]
    image: ImageFacts
    environment: dict[str, object]  # driver, engine, gpu, python, ...
    stages: list[StageResult]
    started_at: str
    finished_at: str
    verdict: str
    imagegate_version: str
    bundle_sha256: str | None = None
    # A completion (`imagegate complete`): the earlier attempt it completes, linked by the sha256
    # of that attempt's signed envelope (manifests/acceptance-v1.md, `completes`).
    completes: dict[str, object] | None = None
    # A reuse (`run --reuse`): the earlier attempt whose verified results it carries, linked the same
    # way (`reuses`); its times are that attempt's, the time its stages ran.
    reuses: dict[str, object] | None = None
    # Evidence the attempt writes together with the statement (run.json): listed in it before
    # it is on disk, since the statement is built first and everything is then written at once.
    pending_evidence: tuple[EvidenceFile, ...] = ()
