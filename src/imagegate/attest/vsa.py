"""The two standard statements signed beside imagegate's own, for consumers whose policies are
written against standard predicates and fixed scalar paths (Kyverno conditions, policy-controller
CUE): an SLSA Verification Summary v1 (https://slsa.dev/verification_summary/v1) and an in-toto
test-result v0.1 (https://in-toto.io/attestation/test-result/v0.1). Both are made from the signed
acceptance statement alone, so a completion, whose statement carries every stage and the final
verdict, repeats the whole final verdict in each of them: Kyverno evaluates only the first
attestation of a predicate type (kyverno#4116), and every one must be able to stand alone."""

from __future__ import annotations

import hashlib

from imagegate._support import jsontypes as j
from imagegate._support.jsontypes import JsonMapping, JsonObject, JsonValue
from imagegate.attest.statement import read_stage
from imagegate.domain.results import LEVEL_CPU as LEVEL_CPU  # where policies' tests and reports find them
from imagegate.domain.results import LEVEL_GPU as LEVEL_GPU
from imagegate.domain.results import USER_SKIP, Counted, Status, counted, exit_code, gpu_stage_ids, unreached
from imagegate.domain.results import levels as levels_of
from imagegate.domain.statements import RUN_FIELD as RUN_FIELD
from imagegate.domain.statements import TEST_RESULT_PREDICATE_TYPE as TEST_RESULT_PREDICATE_TYPE
from imagegate.domain.statements import TIME_FIELD as TIME_FIELD
from imagegate.domain.statements import VERIFIER_ID as VERIFIER_ID
from imagegate.domain.statements import VSA_PREDICATE_TYPE as VSA_PREDICATE_TYPE
from imagegate.domain.statements import Statement, Subject, TestResult, Vsa
from imagegate.errors import EXIT_ACCEPTED

# verifiedLevels when verification failed, as the VSA v1 spec says it ("or FAILED if policy
# verification failed"): never an empty list.
FAILED_LEVELS = ["FAILED"]
COMPLETION_LINK = "completes/attestation.dsse.json"  # where `complete` keeps the earlier envelope

# The readers below take a statement as JSON, as signed: the levels of one's own run and of one
# read from a registry are computed by the same lines from the same bytes.


def levels(statement: JsonMapping) -> list[str]:
    """The levels a signed acceptance reaches, from what ran (model.levels): never the verdict
    string itself, so that a policy names a level and not one of the many
    CPU_PASS_<stages>_DEFERRED spellings. A GPU stage is one whose planned `requires` names gpu;
    it counts as run on a GPU only where the statement says the runner granted it GPUs."""
    stages = counted_stages(statement)
    pred = j.obj(statement.get("predicate"))
    return [] if stages is None else levels_of(str(pred.get("verdict")), stages)


def no_level(statement: JsonMapping) -> str:
    """Why a signed acceptance reached no level, in words (model.unreached)."""
    stages = counted_stages(statement)
    return (
        "no level reached (a stage status imagegate does not write)" if stages is None else unreached(stages)
    )


def reach(statement: JsonMapping) -> tuple[list[str], str]:
    """The levels a signed acceptance reaches (levels), and why it reaches none (no_level)."""
    return levels(statement), no_level(statement)


def counted_stages(statement: JsonMapping) -> list[Counted] | None:
    """The statement's stages as the levels count them; None when one cannot be read (a status
    this imagegate does not write): such a statement earns nothing."""
    pred = j.obj(statement.get("predicate"))
    listed = j.items(pred.get("stages"))
    raw = j.objects(listed)
    if len(raw) != len(listed) or any(_status(st.get("status")) is None for st in raw):
        return None
    return counted([read_stage(st) for st in raw], _plan(pred))


def _plan(pred: JsonMapping) -> dict[str, object]:
    return j.obj(pred.get("plan"))


def _status(raw: object) -> Status | None:
    try:
        return Status(raw)
    except ValueError:
        return None


def stage_outcomes(pred: JsonMapping) -> JsonObject:
    """The stages by what happened to them, as the VSA lists them: ran (passed, failed, errored),
    did not run (deferred: no GPU here or --skip; skipped: a stage it needs did not pass), and
    which of them are GPU stages."""
    out: dict[str, list[str]] = {k: [] for k in ("passed", "failed", "deferred", "skipped")}
    key = {
        "PASS": "passed",
        "FAIL": "failed",
        "ERROR": "failed",
        "DEFERRED": "deferred",
        "SKIPPED": "skipped",
    }
    for st in j.items(pred.get("stages")):
        if isinstance(st, dict) and str(st.get("status")) in key:
            out[key[str(st.get("status"))]].append(str(st.get("id")))
    out["userSkipped"] = [
        str(st.get("id"))
        for st in j.items(_plan(pred).get("stages"))
        if isinstance(st, dict) and str(st.get("skipped") or "").startswith(USER_SKIP)
    ]
    out["gpuStages"] = sorted(gpu_stage_ids(_plan(pred)))
    return {k: list[JsonValue](v) for k, v in out.items()}


def resource_uri(statement: JsonMapping) -> str:
    """The image in containers/image transport syntax: `docker://REPO@DIGEST` for a pushed
    image, `docker-daemon:` for one known only by its config digest (its image ID)."""
    image = j.obj(j.path(statement, "predicate", "image"))
    kind = image.get("subjectDigest")
    name = image.get("repository") or image.get("reference") or j.objects(statement.get("subject"))[0]["name"]
    if kind == "manifest":
        return f"docker://{name}@{image['manifestDigest']}"
    if kind == "config":
        return f"docker-daemon:{name}@{image['configDigest']}"
    return f"local:{name}"


def pipeline_policy(pred: JsonMapping) -> JsonObject:
    """The VSA's `policy`: the pipeline that ran, by name (or file) and sha256."""
    pipeline = j.obj(pred.get("pipeline"))
    return {
        "uri": str(pipeline.get("source") or pipeline.get("name")),
        "digest": {"sha256": str(pipeline.get("sha256"))},
    }


def input_attestations(pred: JsonMapping, acceptance_uri: str, acceptance_bytes: bytes) -> list[JsonObject]:
    """The signed acceptance this summary rests on and, for a completion, the earlier attempt's
    envelope it links (by the sha256 the completion signed)."""
    out: list[JsonObject] = [
        {"uri": acceptance_uri, "digest": {"sha256": hashlib.sha256(acceptance_bytes).hexdigest()}}
    ]
    link = j.obj(pred.get("completes"))
    if link.get("envelopeSha256"):
        out.append({"uri": COMPLETION_LINK, "digest": {"sha256": str(link["envelopeSha256"])}})
    return out


def build_vsa(statement: JsonMapping, acceptance_uri: str, acceptance_bytes: bytes) -> Statement[Vsa]:
    """`acceptance_bytes` are the signed acceptance attestation as written (its DSSE file), the
    input attestation this summary rests on."""
    pred = j.obj(statement.get("predicate"))
    return summary(
        statement,
        time_verified=j.freeze(pred.get("finishedOn")),
        resource=resource_uri(statement),
        inputs=input_attestations(pred, acceptance_uri, acceptance_bytes),
        reached=levels(statement),
        # An extension (consumers ignore fields they do not know): what ran, so that a level
        # can be read back to the stages that earned it.
        run={"verdict": j.freeze(pred.get("verdict")), "stages": stage_outcomes(pred)},
    )


def summary(
    statement: JsonMapping,
    *,
    time_verified: JsonValue,
    resource: str,
    inputs: list[JsonObject],
    reached: list[str],
    run: JsonObject,
) -> Statement[Vsa]:
    """A VSA about `statement`'s subject, by imagegate, for its pipeline: PASSED with the levels
    `reached`, else FAILED (["FAILED"] as its levels); `run` goes in the extension field."""
    pred = j.obj(statement.get("predicate"))
    return Statement(
        subject=signed_subject(statement),
        predicate_type=VSA_PREDICATE_TYPE,
        predicate=Vsa(
            verifier_version=str(j.path(pred, "imagegate", "version")),
            time_verified=time_verified,
            resource_uri=resource,
            policy=pipeline_policy(pred),
            input_attestations=tuple(inputs),
            verification_result="PASSED" if reached else "FAILED",
            verified_levels=tuple(reached or FAILED_LEVELS),
            run=run,
            said_on=said_on(statement),
        ),
    )


def signed_subject(statement: JsonMapping) -> tuple[Subject, ...]:
    """The subject the standard statements repeat: the acceptance's, as it was signed."""
    return tuple(Subject.from_json(s) for s in j.items(statement.get("subject")))


def said_on(statement: JsonMapping) -> JsonValue:
    """The TIME_FIELD of the statements signed beside `statement`: its `finishedOn` (a run's
    end; an index statement's making, after every run it rests on)."""
    return j.freeze(j.path(statement, "predicate", "finishedOn"))


def _result(pred: JsonMapping) -> str:
    """PASSED: every stage ran and passed; FAILED: the verdict is not accepted; WARNED otherwise
    (stages deferred or skipped: the tests that did not run are not passed ones)."""
    verdict = str(pred.get("verdict"))
    try:
        accepted = exit_code(verdict) == EXIT_ACCEPTED
    except ValueError:
        return "FAILED"
    if not accepted:
        return "FAILED"
    every = all(isinstance(s, dict) and s.get("status") == "PASS" for s in j.items(pred.get("stages")))
    return "PASSED" if verdict == "PASS" and every else "WARNED"


def build_test_result(statement: JsonMapping) -> Statement[TestResult]:
    """in-toto test-result v0.1 (`_result`): PASSED when every stage passed, WARNED for an
    accepted verdict with stages that did not run (the deferred ones are the warned tests),
    FAILED otherwise; failed tests are the stages that failed or
    errored. `configuration`: the pipeline file and the probes' bundle, by digest."""
    pred = j.obj(statement.get("predicate"))
    by_status: dict[str, list[str]] = {}
    for s in j.objects(pred.get("stages")):
        by_status.setdefault(str(s.get("status")), []).append(str(s.get("id")))
    pipeline = pipeline_policy(pred)
    configuration: list[JsonObject] = [{"name": pipeline["uri"], "digest": pipeline["digest"]}]
    if pred.get("bundleSha256"):
        configuration.append(
            {"name": "imagegate probes bundle", "digest": {"sha256": str(pred["bundleSha256"])}}
        )
    return Statement(
        subject=signed_subject(statement),
        predicate_type=TEST_RESULT_PREDICATE_TYPE,
        predicate=TestResult(
            result=_result(pred),
            configuration=tuple(configuration),
            passed=tuple(by_status.get("PASS", [])),
            warned=tuple(by_status.get("DEFERRED", [])),
            failed=tuple(by_status.get("FAIL", []) + by_status.get("ERROR", [])),
            said_on=said_on(statement),
        ),
    )


def standard(
    statement: JsonMapping, acceptance_uri: str, acceptance_bytes: bytes
) -> tuple[Statement[Vsa], Statement[TestResult]]:
    """The standard statements of a run's acceptance as signed: its VSA and its test-result."""
    return build_vsa(statement, acceptance_uri, acceptance_bytes), build_test_result(statement)
