"""Admission over every statement an image carries, as each controller combines several: the
statements are read from the registry (the `.att` tag and the referrers, through imagegate's
own client), kept when they are SLSA VSAs about the image's digest whose signature verifies
with the trusted key, and then judged with each controller's own rule for several.

Read in the controllers' source:

- Kyverno, kyverno/kyverno `pkg/engine/internal/imageverifier.go`, `verifyAttestation`: the
  verified statements are grouped by predicate type (`buildStatementMap`); none of the rule's
  type refuses ("attestions not found for predicate type"), and the loop over them returns an
  error on the first statement whose conditions fail (`checkAttestations`). So EVERY statement
  of the type must satisfy the conditions: one FAIL beside a PASS refuses.
- Kyverno's ImageValidatingPolicy (the CEL one): `verifyAttestationSignatures` has cosign
  verify the statements and stores the payload of each verified statement of the type in a map
  keyed by predicate type (kyverno/kyverno `pkg/image/verifiers/ivpol/cosign/verifier.go`,
  kyverno/sdk `imagedataloader.AddVerifiedIntotoPayloads`): each overwrites the one before, and
  `extractPayload` returns the LAST one read. The harness reads the `.att` tag's layers (the
  newest last) and judges with kyverno#17217's fix (ivpol.py, `ivpol_judge` below); the real
  Kyverno 1.19.1 reads the Sigstore bundle referrers `attach` now writes, in the referrers'
  (digest) order, so with several VSAs the one it judges is not the newest
  (benchmarks/records/2026-12-02-consumers.md): test_sequences.py asserts the ImageValidatingPolicy
  only where one VSA is there (replacing).
- policy-controller, sigstore/policy-controller `pkg/webhook/validator.go`,
  `ValidatePolicyAttestationsForAuthority`: every attestation verified with the authority's key
  is collected; for each of the authority's attestation policies the verified ones of its
  predicate type are each evaluated (`policy.EvaluatePolicyAgainstJSON`), a failure only stashed,
  and the policy is met when at least one passed (`checkedAttestations` non-empty). So ANY
  statement that passes admits: a PASS beside a later FAIL still admits. The
  ClusterImagePolicy's own policy then judges the authority matches (admission.py).

Under the first and last rules an image judged more than once is only judged by its latest
verdict when the earlier statements are gone: `imagegate attach` replaces them
(attest/replace.py). The ImageValidatingPolicy reads the latest either way, as long as the
`.att` tag keeps the order of attaching (imagegate's attach appends)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import yaml

from imagegate.attest import attach, referrers
from imagegate.attest.keys import PublicKey
from imagegate.attest.vsa import VSA_PREDICATE_TYPE
from tests.policies import engines, ivpol
from tests.policies.admission import KYVERNO, POLICY_CONTROLLER, attestation_cue, kyverno_rules


def statements_for(image: str, key: PublicKey) -> list[dict[str, Any]]:
    """The VSAs a controller reads for `image` (repo@digest or repo:tag): from the `.att` tag and
    the referrers, signed by `key`, with the image's manifest digest in their subject (cosign
    checks the subject against the digest it verifies). A statement found in both places is
    counted once: under either rule a copy changes nothing."""
    parsed = attach.parse_image(image)
    with attach.client_for(parsed) as client:
        remote = attach.resolve(client, parsed)
        found = referrers.fetch_all(client, remote)
    out: dict[bytes, dict[str, Any]] = {}
    for f in found:
        if not f.envelope.verified_by(key):
            continue
        statement = attach.statement_of(f.envelope)
        if statement.get("predicateType") != VSA_PREDICATE_TYPE:
            continue
        if attach.matching_subject(attach.subject_digests(statement), remote.subject_digests) is None:
            continue
        out.setdefault(f.envelope.payload, statement)
    return list(out.values())


def att_statements(image: str, key: PublicKey) -> list[dict[str, Any]]:
    """What cosign's VerifyImageAttestations returns for `image` (repo@digest or repo:tag) and the
    ImageValidatingPolicy reads: the `.att` tag's statements in layer order, of every predicate
    type, signed by `key` and naming the image's digest in their subject."""
    parsed = attach.parse_image(image)
    with attach.client_for(parsed) as client:
        remote = attach.resolve(client, parsed)
        found = attach.fetch(client, remote)
    out = []
    for f in found:
        if not f.envelope.verified_by(key):
            continue
        statement = attach.statement_of(f.envelope)
        if attach.matching_subject(attach.subject_digests(statement), remote.subject_digests) is not None:
            out.append(statement)
    return out


def resolved(image: str) -> str:
    """repo@digest of `image` in its registry (what mutateDigest puts in the Pod)."""
    parsed = attach.parse_image(image)
    with attach.client_for(parsed) as client:
        return str(attach.resolve(client, parsed).reference)


def ivpol_judge(obj: dict[str, Any], pattern: str, key: PublicKey, pem: str, now: dt.datetime) -> str | None:
    """The shipped ImageValidatingPolicy on `obj` whose images are in a real registry, with its
    image pattern replaced by `pattern` (as its comments tell a user to) and `pem` (the text of
    `key`) as its key. None: admitted; else the refusal."""

    def statements(image: str, attestor_pem: str) -> list[dict[str, Any]]:
        return att_statements(image, key) if attestor_pem.strip() == pem.strip() else []

    def edit(text: str) -> str:
        assert text.count('"registry.example/*"') == 1, "the shipped policy names the pattern to replace"
        return text.replace('"registry.example/*"', json.dumps(pattern))

    # With kyverno#17217's fix: as released (1.19.0), Kyverno counts no key-signed statement.
    return ivpol.judge(obj, ivpol.Images(resolved, statements), pem, now, tlog_fix=True, edit=edit)


def kyverno(obj: dict[str, Any], statements: list[dict[str, Any]], now: dt.datetime) -> list[str]:
    """What the shipped ClusterPolicy refuses, per rule, over all `statements`: a rule whose
    preconditions hold needs at least one statement of its type, and every one of them must meet
    its conditions. Empty: admitted."""
    policy = yaml.safe_load(KYVERNO.read_text())
    request = {"request": {"object": obj, "operation": "CREATE"}}
    refused = []
    for rule in kyverno_rules(policy, obj["kind"]):
        if not engines.conditions_hold([rule["preconditions"]], request, now):
            continue
        for check in rule["verifyImages"]:
            for att in check["attestations"]:
                of_type = [s for s in statements if s["predicateType"] == att["type"]]
                if not of_type:
                    refused.append(f"{rule['name']}: no attestation of {att['type']}")
                failing = [
                    s for s in of_type if not engines.conditions_hold(att["conditions"], s["predicate"], now)
                ]
                if failing:
                    refused.append(f"{rule['name']}: {len(failing)} of {len(of_type)} fail the conditions")
    return refused


def policy_controller(
    obj: dict[str, Any], statements: list[dict[str, Any]], floor: str, work: Path
) -> tuple[bool, list[str]]:
    """The shipped ClusterImagePolicy over all `statements` (NOT_BEFORE rendered to `floor`): an
    authority matches when each of its attestation policies is met by at least one statement of
    its predicate type; the CIP's policy then judges {spec, authorityMatches}."""
    cip = yaml.safe_load(POLICY_CONTROLLER.read_text())["spec"]
    matches: dict[str, Any] = {}
    said = []
    for n, authority in enumerate(cip["authorities"]):
        held = {}
        for m, att in enumerate(authority["attestations"]):
            cue = attestation_cue(att, floor)
            of_type = [s for s in statements if s["predicateType"] == att["predicateType"]]
            passed = []
            for k, statement in enumerate(of_type):
                ok, why = engines.cue_vet(cue, statement, work / f"a{n}-{m}-{k}")
                if ok:
                    passed.append({"subject": "", "issuer": ""})
                else:
                    said.append(f"{authority['name']}/{att['name']}: {why}")
            if passed:
                held[att["name"]] = passed
        if len(held) == len(authority["attestations"]):
            matches[authority["name"]] = {"attestations": held}
    if not matches:
        return False, said
    data = json.loads(json.dumps({"spec": obj["spec"], "authorityMatches": matches}))
    ((ok, why),) = engines.cue_vet_many(cip["policy"]["data"], [data], work / "cip", command="eval")
    return ok, [*said, why] if why else said
