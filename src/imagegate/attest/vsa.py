"""An SLSA Verification Summary Attestation v1 (https://slsa.dev/verification_summary/v1) of an
acceptance run, for consumers that speak SLSA rather than imagegate's predicate: the same
subject, `verificationResult` PASSED when the verdict accepts the image (PASS, or a deferred
verdict) and FAILED otherwise, and `verifiedLevels` = [the verdict token] (custom values are
allowed there as long as they do not start with `SLSA_`)."""

from __future__ import annotations

import hashlib
from typing import Any

from imagegate.attest.statement import STATEMENT_TYPE
from imagegate.model import EXIT_ACCEPTED, exit_code

VSA_PREDICATE_TYPE = "https://slsa.dev/verification_summary/v1"
VERIFIER_ID = "https://imagegate.dev/verifier"


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


def build_vsa(statement: dict[str, Any], acceptance_uri: str, acceptance_bytes: bytes) -> dict[str, Any]:
    """`acceptance_bytes` are the signed acceptance attestation as written (its DSSE file), the
    input attestation this summary rests on."""
    pred = statement["predicate"]
    verdict = str(pred["verdict"])
    try:
        accepted = exit_code(verdict) == EXIT_ACCEPTED
    except ValueError:
        accepted = False
    pipeline = pred.get("pipeline") or {}
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
            "policy": {
                "uri": str(pipeline.get("source") or pipeline.get("name")),
                "digest": {"sha256": str(pipeline.get("sha256"))},
            },
            "inputAttestations": [
                {"uri": acceptance_uri, "digest": {"sha256": hashlib.sha256(acceptance_bytes).hexdigest()}}
            ],
            "verificationResult": "PASSED" if accepted else "FAILED",
            "verifiedLevels": [verdict],
            "slsaVersion": "1.0",
        },
    }
