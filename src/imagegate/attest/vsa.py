"""The two standard statements signed beside imagegate's own, for consumers whose policies are
written against standard predicates and fixed scalar paths (Kyverno conditions, policy-controller
CUE): an SLSA Verification Summary v1 (https://slsa.dev/verification_summary/v1) and an in-toto
test-result v0.1 (https://in-toto.io/attestation/test-result/v0.1). Both are made from the signed
acceptance statement alone, so a completion, whose statement carries every stage and the final
verdict, repeats the whole final verdict in each of them: Kyverno evaluates only the first
attestation of a predicate type (kyverno#4116), and every one must be able to stand alone."""

from __future__ import annotations

import hashlib
from typing import Any

from imagegate.attest.statement import STATEMENT_TYPE
from imagegate.model import EXIT_ACCEPTED, exit_code

VSA_PREDICATE_TYPE = "https://slsa.dev/verification_summary/v1"
TEST_RESULT_PREDICATE_TYPE = "https://in-toto.io/attestation/test-result/v0.1"
VERIFIER_ID = "https://imagegate.dev/verifier"
# imagegate's own levels (SLSA reserves the SLSA_ prefix): CPU = every stage that runs without
# a GPU passed and the rest is at most deferred; GPU = every stage passed, the GPU ones included.
LEVEL_CPU = "IMAGEGATE_CPU"
LEVEL_GPU = "IMAGEGATE_GPU"
COMPLETION_LINK = "completes/attestation.dsse.json"  # where `complete` keeps the earlier envelope


def levels(verdict: str) -> list[str]:
    """The levels a verdict reaches: never the verdict string itself, so that a policy names a
    level and not one of the many CPU_PASS_<stages>_DEFERRED spellings."""
    try:
        accepted = exit_code(verdict) == EXIT_ACCEPTED
    except ValueError:
        return []
    if not accepted:
        return []
    return [LEVEL_CPU, LEVEL_GPU] if verdict == "PASS" else [LEVEL_CPU]


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


def _policy(pred: dict[str, Any]) -> dict[str, Any]:
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
    reached = levels(str(pred["verdict"]))
    return {
        "_type": STATEMENT_TYPE,
        "subject": statement["subject"],
        "predicateType": VSA_PREDICATE_TYPE,
        "predicate": {
            "verifier": {
                "id": VERIFIER_ID,
                "version": {"imagegate": str((pred.get("imagegate") or {}).get("version"))},
            },
            "timeVerified": pred.get("finishedOn"),
            "resourceUri": resource_uri(statement),
            "policy": _policy(pred),
            "inputAttestations": input_attestations(pred, acceptance_uri, acceptance_bytes),
            "verificationResult": "PASSED" if reached else "FAILED",
            "verifiedLevels": reached,
            "slsaVersion": "1.0",
        },
    }


def _result(verdict: str) -> str:
    if verdict == "PASS":
        return "PASSED"
    return "WARNED" if LEVEL_CPU in levels(verdict) else "FAILED"


def build_test_result(statement: dict[str, Any]) -> dict[str, Any]:
    """in-toto test-result v0.1: PASSED for PASS, WARNED for a deferred verdict (the deferred
    stages are the warned tests), FAILED otherwise; failed tests are the stages that failed or
    errored. `configuration`: the pipeline file and the probes' bundle, by digest."""
    pred = statement["predicate"]
    by_status: dict[str, list[str]] = {}
    for s in pred.get("stages") or []:
        by_status.setdefault(str(s.get("status")), []).append(str(s.get("id")))
    pipeline = _policy(pred)
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
            "result": _result(str(pred["verdict"])),
            "configuration": configuration,
            "passedTests": by_status.get("PASS", []),
            "warnedTests": by_status.get("DEFERRED", []),
            "failedTests": by_status.get("FAIL", []) + by_status.get("ERROR", []),
        },
    }
