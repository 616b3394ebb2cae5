"""The two standard statements signed beside imagegate's own, for consumers whose policies are
written against standard predicates and fixed scalar paths (Kyverno conditions, policy-controller
CUE): an SLSA Verification Summary v1 (https://slsa.dev/verification_summary/v1) and an in-toto
test-result v0.1 (https://in-toto.io/attestation/test-result/v0.1). Both are made from the signed
acceptance statement alone, so a completion, whose statement carries every stage and the final
verdict, repeats the whole final verdict in each of them: Kyverno evaluates only the first
attestation of a predicate type (kyverno#4116), and every one must be able to stand alone."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from imagegate.attest.statement import STATEMENT_TYPE, read_stage
from imagegate.domain.results import LEVEL_CPU as LEVEL_CPU  # where policies' tests and reports find them
from imagegate.domain.results import LEVEL_GPU as LEVEL_GPU
from imagegate.domain.results import USER_SKIP, Counted, Status, counted, exit_code, gpu_stage_ids, unreached
from imagegate.domain.results import levels as levels_of
from imagegate.errors import EXIT_ACCEPTED

VSA_PREDICATE_TYPE = "https://slsa.dev/verification_summary/v1"
TEST_RESULT_PREDICATE_TYPE = "https://in-toto.io/attestation/test-result/v0.1"
VERIFIER_ID = "https://imagegate.dev/verifier"
# SLSA's VSA v1: producers may add extension fields "using field names that are URIs".
RUN_FIELD = "https://imagegate.dev/attestations/vsa/run"
# When the word of a VSA or test-result was said, for ordering one signer's statements
# (attest/replace.py `when`): the `finishedOn` of the statement it was signed beside. A VSA's
# `timeVerified` says an index's oldest run (what a freshness rule must read); a test-result has
# no time of its own. An extension field as above; in-toto consumers ignore unknown fields.
TIME_FIELD = "https://imagegate.dev/attestations/finishedOn"
# verifiedLevels when verification failed, as the VSA v1 spec says it ("or FAILED if policy
# verification failed"): never an empty list.
FAILED_LEVELS = ["FAILED"]
COMPLETION_LINK = "completes/attestation.dsse.json"  # where `complete` keeps the earlier envelope


def levels(statement: dict[str, Any]) -> list[str]:
    """The levels a signed acceptance reaches, from what ran (model.levels): never the verdict
    string itself, so that a policy names a level and not one of the many
    CPU_PASS_<stages>_DEFERRED spellings. A GPU stage is one whose planned `requires` names gpu;
    it counts as run on a GPU only where the statement says the runner granted it GPUs."""
    stages = counted_stages(statement)
    pred = statement.get("predicate") or {}
    return [] if stages is None else levels_of(str(pred.get("verdict")), stages)


def no_level(statement: Mapping[str, Any]) -> str:
    """Why a signed acceptance reached no level, in words (model.unreached)."""
    stages = counted_stages(statement)
    return (
        "no level reached (a stage status imagegate does not write)" if stages is None else unreached(stages)
    )


def counted_stages(statement: Mapping[str, Any]) -> list[Counted] | None:
    """The statement's stages as the levels count them; None when one cannot be read (a status
    this imagegate does not write): such a statement earns nothing."""
    pred = statement.get("predicate") or {}
    raw = [st for st in pred.get("stages") or [] if isinstance(st, dict)]
    if len(raw) != len(pred.get("stages") or []) or any(_status(st.get("status")) is None for st in raw):
        return None
    return counted([read_stage(st) for st in raw], _plan(pred))


def _plan(pred: Mapping[str, Any]) -> dict[str, Any]:
    plan = pred.get("plan")
    return plan if isinstance(plan, dict) else {}


def _status(raw: Any) -> Status | None:
    try:
        return Status(raw)
    except ValueError:
        return None


def stage_outcomes(pred: dict[str, Any]) -> dict[str, list[str]]:
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
    for st in pred.get("stages") or []:
        if isinstance(st, dict) and str(st.get("status")) in key:
            out[key[str(st.get("status"))]].append(str(st.get("id")))
    out["userSkipped"] = [
        str(st.get("id"))
        for st in _plan(pred).get("stages") or []
        if isinstance(st, dict) and str(st.get("skipped") or "").startswith(USER_SKIP)
    ]
    out["gpuStages"] = sorted(gpu_stage_ids(_plan(pred)))
    return out


def resource_uri(statement: dict[str, Any]) -> str:
    """The image in containers/image transport syntax: `docker://REPO@DIGEST` for a pushed
    image, `docker-daemon:` for one known only by its config digest (its image ID)."""
    image = statement["predicate"].get("image") or {}
    kind = image.get("subjectDigest")
    name = image.get("repository") or image.get("reference") or statement["subject"][0]["name"]
    if kind == "manifest":
        return f"docker://{name}@{image['manifestDigest']}"
    if kind == "config":
        return f"docker-daemon:{name}@{image['configDigest']}"
    return f"local:{name}"


def pipeline_policy(pred: Mapping[str, Any]) -> dict[str, Any]:
    """The VSA's `policy`: the pipeline that ran, by name (or file) and sha256."""
    pipeline = pred.get("pipeline") or {}
    return {
        "uri": str(pipeline.get("source") or pipeline.get("name")),
        "digest": {"sha256": str(pipeline.get("sha256"))},
    }


def input_attestations(
    pred: dict[str, Any], acceptance_uri: str, acceptance_bytes: bytes
) -> list[dict[str, Any]]:
    """The signed acceptance this summary rests on and, for a completion, the earlier attempt's
    envelope it links (by the sha256 the completion signed)."""
    out = [{"uri": acceptance_uri, "digest": {"sha256": hashlib.sha256(acceptance_bytes).hexdigest()}}]
    link = pred.get("completes") or {}
    if link.get("envelopeSha256"):
        out.append({"uri": COMPLETION_LINK, "digest": {"sha256": str(link["envelopeSha256"])}})
    return out


def build_vsa(statement: dict[str, Any], acceptance_uri: str, acceptance_bytes: bytes) -> dict[str, Any]:
    """`acceptance_bytes` are the signed acceptance attestation as written (its DSSE file), the
    input attestation this summary rests on."""
    pred = statement["predicate"]
    return summary(
        statement,
        time_verified=pred.get("finishedOn"),
        resource=resource_uri(statement),
        inputs=input_attestations(pred, acceptance_uri, acceptance_bytes),
        reached=levels(statement),
        # An extension (consumers ignore fields they do not know): what ran, so that a level
        # can be read back to the stages that earned it.
        run={"verdict": pred.get("verdict"), "stages": stage_outcomes(pred)},
    )


def summary(
    statement: Mapping[str, Any],
    *,
    time_verified: Any,
    resource: str,
    inputs: list[dict[str, Any]],
    reached: list[str],
    run: dict[str, Any],
) -> dict[str, Any]:
    """A VSA about `statement`'s subject, by imagegate, for its pipeline: PASSED with the levels
    `reached`, else FAILED (["FAILED"] as its levels); `run` goes in the extension field."""
    pred = statement["predicate"]
    return {
        "_type": STATEMENT_TYPE,
        "subject": statement["subject"],
        "predicateType": VSA_PREDICATE_TYPE,
        "predicate": {
            "verifier": {
                "id": VERIFIER_ID,
                "version": {"imagegate": str((pred.get("imagegate") or {}).get("version"))},
            },
            "timeVerified": time_verified,
            "resourceUri": resource,
            "policy": pipeline_policy(pred),
            "inputAttestations": inputs,
            "verificationResult": "PASSED" if reached else "FAILED",
            "verifiedLevels": reached or FAILED_LEVELS,
            "slsaVersion": "1.0",
            RUN_FIELD: run,
            TIME_FIELD: said_on(statement),
        },
    }


def said_on(statement: Mapping[str, Any]) -> Any:
    """The TIME_FIELD of the statements signed beside `statement`: its `finishedOn` (a run's
    end; an index statement's making, after every run it rests on)."""
    return (statement.get("predicate") or {}).get("finishedOn")


def _result(pred: dict[str, Any]) -> str:
    """PASSED: every stage ran and passed; FAILED: the verdict is not accepted; WARNED otherwise
    (stages deferred or skipped: the tests that did not run are not passed ones)."""
    verdict = str(pred.get("verdict"))
    try:
        accepted = exit_code(verdict) == EXIT_ACCEPTED
    except ValueError:
        return "FAILED"
    if not accepted:
        return "FAILED"
    every = all(isinstance(s, dict) and s.get("status") == "PASS" for s in pred.get("stages") or [])
    return "PASSED" if verdict == "PASS" and every else "WARNED"


def build_test_result(statement: dict[str, Any]) -> dict[str, Any]:
    """in-toto test-result v0.1 (`_result`): PASSED when every stage passed, WARNED for an
    accepted verdict with stages that did not run (the deferred ones are the warned tests),
    FAILED otherwise; failed tests are the stages that failed or
    errored. `configuration`: the pipeline file and the probes' bundle, by digest."""
    pred = statement["predicate"]
    by_status: dict[str, list[str]] = {}
    for s in pred.get("stages") or []:
        by_status.setdefault(str(s.get("status")), []).append(str(s.get("id")))
    pipeline = pipeline_policy(pred)
    configuration = [{"name": pipeline["uri"], "digest": pipeline["digest"]}]
    if pred.get("bundleSha256"):
        configuration.append(
            {"name": "imagegate probes bundle", "digest": {"sha256": str(pred["bundleSha256"])}}
        )
    return {
        "_type": STATEMENT_TYPE,
        "subject": statement["subject"],
        "predicateType": TEST_RESULT_PREDICATE_TYPE,
        "predicate": {
            "result": _result(pred),
            "configuration": configuration,
            "passedTests": by_status.get("PASS", []),
            "warnedTests": by_status.get("DEFERRED", []),
            "failedTests": by_status.get("FAIL", []) + by_status.get("ERROR", []),
            TIME_FIELD: said_on(statement),
        },
    }
