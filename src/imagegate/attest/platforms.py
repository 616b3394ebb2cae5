"""Statements about a multi-platform index (docs/attestations.md, "An index"). Admission resolves
a tag to the index digest; a run judges one platform and its subject is that platform's
manifest. A statement whose subject is the index is the conjunction of statements about its
platforms: PASS only when every platform the index lists has a signed PASS; a FAIL or an ERROR
of any platform is the index's; otherwise the verdict names what did not run or was deferred,
platforms not run as `PLATFORM_<OS>_<ARCH>[_<VARIANT>]`, and is never PASS. Its levels are those
every platform reached: a platform not run reached none. The runs may come from different hosts
(an arm64 runner, an amd64 one): each is linked by the sha256 of its signed envelope.

Pure: the caller reads the index and verifies the runs (platforms.py, the use case)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from imagegate._support import jsontypes as j
from imagegate._support.jsontypes import JsonMapping, JsonObject, JsonValue
from imagegate.attest.vsa import (
    TEST_RESULT_PREDICATE_TYPE,
    levels,
    pipeline_policy,
    said_on,
    signed_subject,
    summary,
)
from imagegate.domain.digest import short_digest
from imagegate.domain.results import LEVEL_CPU, LEVEL_GPU, exit_code
from imagegate.domain.statements import RawPredicate, Statement, Subject, TestResult, Vsa
from imagegate.errors import EXIT_ACCEPTED, UsageError
from imagegate.oci.manifest import INDEX_TYPES, MANIFEST_TYPES, Index, parse_manifest

INDEX_PREDICATE_TYPE = "https://imagegate.dev/attestations/index/v1"
# buildx lists its provenance and SBOM manifests in the index as platform unknown/unknown with
# this annotation: they are no image that runs.
REFERENCE_TYPE_ANNOTATION = "vnd.docker.reference.type"
ATTESTATION_MANIFEST = "attestation-manifest"
MAX_PLATFORMS = 64  # an index listing more images than this is refused, not half-judged
PLATFORM_COPIES = "platforms"  # where the index attempt keeps each platform's envelope


@dataclass(frozen=True)
class Listed:
    platform: str  # os/architecture[/variant]
    digest: str  # its manifest


@dataclass(frozen=True)
class IndexListing:
    """The images an index lists, and the entries that are not images, with why."""

    platforms: tuple[Listed, ...]
    ignored: tuple[tuple[str, str], ...]  # (digest, why)


def list_platforms(raw: bytes, media_type: str | None, where: str) -> IndexListing:
    """The platform manifests of the index in `raw` (the bytes its digest was computed from):
    image manifests with a platform; attestation manifests (buildx's unknown/unknown entries),
    nested indexes and other artifacts are ignored, named. `where` names the index in errors."""
    doc = parse_manifest(raw, media_type, where)
    if not isinstance(doc, Index):
        raise UsageError(
            f"{where}: names an image manifest, not an index: a run's own statements are about it",
            hint="attach the run's statements to it (run --attach, or imagegate attach)",
        )
    found: list[Listed] = []
    ignored: list[tuple[str, str]] = []
    for d in doc.manifests:
        assert d.digest is not None  # parse_manifest refuses an index entry without one
        if d.annotations.get(REFERENCE_TYPE_ANNOTATION) == ATTESTATION_MANIFEST:
            ignored.append((d.digest, "an attestation manifest (vnd.docker.reference.type)"))
        elif d.media_type in INDEX_TYPES:
            ignored.append((d.digest, "a nested index (not followed)"))
        elif d.media_type and d.media_type not in MANIFEST_TYPES:
            ignored.append((d.digest, f"not an image manifest ({d.media_type})"))
        elif d.platform is None or "unknown" in (d.platform.os, d.platform.architecture):
            ignored.append((d.digest, "no platform: not an image a node runs"))
        else:
            found.append(Listed(str(d.platform), d.digest))
    if not found:
        raise UsageError(f"{where}: the index lists no platform image", hint="check the reference")
    if len(found) > MAX_PLATFORMS:
        raise UsageError(f"{where}: the index lists {len(found)} platform images, more than {MAX_PLATFORMS}")
    return IndexListing(tuple(found), tuple(ignored))


@dataclass(frozen=True)
class PlatformRun:
    """A verified run of one platform: its signed statement and the envelope's bytes."""

    statement: JsonMapping
    envelope: bytes
    source: str  # where it was read, for messages

    @property
    def predicate(self) -> dict[str, object]:
        return j.obj(self.statement.get("predicate"))

    @property
    def manifest_digest(self) -> str | None:
        image = j.obj(self.predicate.get("image"))
        return str(image["manifestDigest"]) if image.get("subjectDigest") == "manifest" else None


def platform_token(platform: str) -> str:
    """`linux/arm64/v8` as a verdict names it: PLATFORM_LINUX_ARM64_V8."""
    return "PLATFORM_" + re.sub(r"[^A-Z0-9]+", "_", platform.upper()).strip("_")


def _deferred_names(verdict: str) -> list[str]:
    """What a CPU_PASS_<names>_DEFERRED verdict names (stage ids, upper case, joined by _)."""
    return [verdict.removeprefix("CPU_PASS_").removesuffix("_DEFERRED")]


def index_verdict(verdicts: Sequence[str | None], platforms: Sequence[str]) -> str:
    """Each listed platform's verdict (None: not run), in the index's order: FAIL over ERROR
    (a verdict imagegate does not write counts as ERROR); then, with any platform deferred or
    not run, CPU_PASS_<what did not run>_DEFERRED; PASS only when every platform passed."""
    known = []
    for v in verdicts:
        try:
            exit_code(v or "PASS")
            known.append(v)
        except ValueError:
            known.append("ERROR")
    if "FAIL" in known:
        return "FAIL"
    if "ERROR" in known:
        return "ERROR"
    named: list[str] = []
    for v, p in zip(known, platforms, strict=True):
        if v is None:
            named.append(platform_token(p))
        elif v != "PASS":
            named += _deferred_names(v)
    named = list(dict.fromkeys(named))
    return "CPU_PASS_" + "_".join(named) + "_DEFERRED" if named else "PASS"


def common_levels(per_platform: Sequence[Sequence[str] | None]) -> list[str]:
    """The levels every platform reached (None: not run, so none)."""
    have = [set(x or ()) for x in per_platform]
    return [lv for lv in (LEVEL_CPU, LEVEL_GPU) if have and all(lv in h for h in have)]


def _pipeline(runs: Sequence[PlatformRun]) -> JsonObject:
    """The one pipeline every run ran (name and file digest); runs of different pipelines are
    no conjunction: refused, named."""
    seen = {
        (str(p.get("name")), str(p.get("sha256"))): p
        for r in runs
        if isinstance(p := r.predicate.get("pipeline"), dict)
    }
    if len(seen) != 1:
        named = ", ".join(f"{n} (sha256 {d[:12]}…)" for n, d in seen) or "none"
        raise UsageError(
            f"the runs used different pipelines ({named}): an index statement is about one pipeline",
            hint="run every platform with the same pipeline file",
        )
    return j.freeze_object(next(iter(seen.values())))


def build_index_statement(
    repository: str,
    reference: str,
    index_digest: str,
    listing: IndexListing,
    runs: Sequence[PlatformRun],
    *,
    finished_on: str,
    version: str,
) -> Statement[RawPredicate]:
    """The statement about the index `index_digest` (`repository` registry/repository) made
    from `runs`, each of which must be about a platform the index lists (its subject that
    platform's manifest), one run a platform."""
    by_digest = _runs_by_platform(reference, index_digest, listing, runs)
    pipeline = _pipeline(runs)
    entries = [_platform_entry(n, p, by_digest.get(p.digest)) for n, p in enumerate(listing.platforms)]
    verdict = index_verdict(
        [j.text(e.get("verdict")) for e in entries], [str(e["platform"]) for e in entries]
    )
    reached = common_levels([j.strings(e.get("levels")) if e["ran"] else None for e in entries])
    algo, _, hexd = index_digest.partition(":")
    return Statement(
        subject=(Subject(repository, {algo: hexd}),),
        predicate_type=INDEX_PREDICATE_TYPE,
        predicate=RawPredicate(
            j.freeze_object(
                {
                    "verdict": verdict,
                    "pipeline": pipeline,
                    "image": {
                        "reference": reference,
                        "repository": repository,
                        "indexDigest": index_digest,
                        "subjectDigest": "index",
                    },
                    "platforms": entries,
                    "notRun": [e["platform"] for e in entries if not e["ran"]],
                    "ignoredManifests": [{"digest": d, "why": why} for d, why in listing.ignored],
                    "levels": reached if verdict_accepted(verdict) else [],
                    # As of the oldest run it rests on: a freshness rule must not read old runs as new.
                    "verifiedOn": min(
                        (str(e["finishedOn"]) for e in entries if e.get("finishedOn")), default=finished_on
                    ),
                    "finishedOn": finished_on,
                    "imagegate": {"version": version},
                }
            )
        ),
    )


def _runs_by_platform(
    reference: str, index_digest: str, listing: IndexListing, runs: Sequence[PlatformRun]
) -> dict[str, PlatformRun]:
    """Each run by the platform manifest it judged: one a platform, each a platform the index lists."""
    if not runs:
        raise UsageError(f"{reference}: no run given: an index statement combines the runs of its platforms")
    by_digest: dict[str, PlatformRun] = {}
    listed = {p.digest: p.platform for p in listing.platforms}
    for run in runs:
        digest = run.manifest_digest
        if digest not in listed:
            names = ", ".join(f"{p.platform} {short_digest(p.digest)}" for p in listing.platforms)
            raise UsageError(
                f"{run.source}: a run of {digest or 'an image no registry manifest names'}, which "
                f"{reference} ({short_digest(index_digest)}) does not list: it lists {names}",
                hint="give runs of the index's platform manifests (run REPO@<platform digest>)",
            )
        if digest in by_digest:
            raise UsageError(
                f"{run.source} and {by_digest[digest].source}: two runs of {listed[digest]} ({short_digest(digest)})",
                hint="give one run a platform: the latest (a completion, where there is one)",
            )
        by_digest[digest] = run
    return by_digest


def _platform_entry(n: int, p: Listed, found: PlatformRun | None) -> JsonObject:
    """The index statement's entry for the index's nth platform: whether it ran, and its run's
    verdict, levels and the copy of its attestation."""
    entry: JsonObject = {"platform": p.platform, "manifestDigest": p.digest, "ran": found is not None}
    if found is not None:
        pred = found.predicate
        entry.update(
            verdict=str(pred.get("verdict")),
            levels=list[JsonValue](levels(found.statement)),
            attempt=str(j.path(pred, "attempt", "id")),
            finishedOn=j.freeze(pred.get("finishedOn")),
            attestation={
                "path": f"{PLATFORM_COPIES}/{n:02d}/attestation.dsse.json",
                "sha256": hashlib.sha256(found.envelope).hexdigest(),
            },
        )
    return entry


def verdict_accepted(verdict: str) -> bool:
    try:
        return exit_code(verdict) == EXIT_ACCEPTED
    except ValueError:
        return False


def index_levels(statement: JsonMapping) -> list[str]:
    """The levels a signed index statement reaches, recomputed from its platforms: those every
    listed platform's run reached, none when one did not run or the verdict is not accepted."""
    pred = j.obj(statement.get("predicate"))
    entries = j.objects(pred.get("platforms"))
    if not entries or not verdict_accepted(str(pred.get("verdict"))):
        return []
    return common_levels([j.strings(e.get("levels")) if e.get("ran") else None for e in entries])


def _by_outcome(pred: JsonMapping) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"passed": [], "failed": [], "deferred": [], "notRun": []}
    for e in j.objects(pred.get("platforms")):
        v = str(e.get("verdict"))
        key = (
            "notRun"
            if not e.get("ran")
            else "passed"
            if v == "PASS"
            else "failed"
            if v in ("FAIL", "ERROR")
            else "deferred"
        )
        out[key].append(str(e.get("platform")))
    return out


def build_index_vsa(statement: JsonMapping, acceptance_uri: str, acceptance_bytes: bytes) -> Statement[Vsa]:
    """The SLSA VSA of an index statement: its subject the index, `verifiedLevels` those every
    platform reached (["FAILED"] when none), `inputAttestations` the index statement and each
    platform's envelope, `timeVerified` as of the oldest platform run."""
    pred = j.obj(statement.get("predicate"))
    reached = index_levels(statement)
    inputs: list[JsonObject] = [
        {"uri": acceptance_uri, "digest": {"sha256": hashlib.sha256(acceptance_bytes).hexdigest()}}
    ]
    for e in j.objects(pred.get("platforms")):
        att = j.obj(e.get("attestation"))
        if e.get("ran") and att.get("sha256"):
            inputs.append({"uri": str(att.get("path")), "digest": {"sha256": str(att["sha256"])}})
    image = j.obj(pred.get("image"))
    return summary(
        statement,
        time_verified=j.freeze(pred.get("verifiedOn")),
        resource=f"docker://{image.get('repository')}@{image.get('indexDigest')}",
        inputs=inputs,
        reached=reached,
        run={"verdict": j.freeze(pred.get("verdict")), "platforms": j.freeze_object(_by_outcome(pred))},
    )


def build_index_test_result(statement: JsonMapping) -> Statement[TestResult]:
    """in-toto test-result of an index statement: each platform a test; PASSED when every one
    passed, FAILED when the verdict is not accepted, WARNED otherwise (deferred, or not run)."""
    pred = j.obj(statement.get("predicate"))
    outcomes = _by_outcome(pred)
    verdict = str(pred.get("verdict"))
    result = "PASSED" if verdict == "PASS" else "WARNED" if verdict_accepted(verdict) else "FAILED"
    policy = pipeline_policy(pred)
    return Statement(
        subject=signed_subject(statement),
        predicate_type=TEST_RESULT_PREDICATE_TYPE,
        predicate=TestResult(
            result=result,
            configuration=({"name": policy["uri"], "digest": policy["digest"]},),
            passed=tuple(outcomes["passed"]),
            warned=tuple(outcomes["deferred"] + outcomes["notRun"]),
            failed=tuple(outcomes["failed"]),
            said_on=said_on(statement),
        ),
    )
