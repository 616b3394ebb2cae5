"""An admission request as each controller judges it with the policies in policies/, built from
the real evaluators in engines.py: the policy file as shipped, with only its placeholders filled
(the public key; policy-controller's NOT_BEFORE), the Pod, and an attempt folder the runner
signed, whose SLSA VSA the image carries."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import yaml

from imagegate.attest import sign
from imagegate.attest.vsa import VSA_PREDICATE_TYPE
from tests.npm_tools import ROOT
from tests.policies import engines
from tests.policies.conftest import vsa

POLICIES = ROOT / "policies"
KYVERNO = POLICIES / "kyverno-clusterpolicy.yaml"
POLICY_CONTROLLER = POLICIES / "policy-controller-clusterimagepolicy.yaml"
PLACEHOLDER = "REPLACE WITH THE CONTENTS OF imagegate.pub"


def pod(*, gpu: bool) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "app", "image": "registry.example/team/app:1"}
    if gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    sidecar = {"name": "log", "image": "registry.example/team/log:1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [sidecar, container]},
    }


def _filled_key(text: str, pem: str) -> str:
    assert PLACEHOLDER in text, "the shipped policy names the key to replace"
    return pem


def _pinned_kyverno(policy: dict[str, Any], pin: tuple[str, str]) -> dict[str, Any]:
    """The policy with its pipeline lists pinned as docs/attestations.md says: "*" replaced by
    the pipeline's name (or file) and by its sha256."""
    for rule in policy["spec"]["rules"]:
        for check in rule["verifyImages"]:
            for att in check["attestations"]:
                for block in att["conditions"]:
                    for cond in block["all"]:
                        for path, value in zip(("policy.uri", "policy.digest.sha256"), pin, strict=True):
                            if cond["key"] == "{{ " + path + " }}":
                                assert cond["value"] == ["*"], "the shipped policy admits any pipeline"
                                cond["value"] = [value]
    return policy


def kyverno(
    pod: dict[str, Any],
    attempt: Path,
    pem: str,
    now: dt.datetime,
    work: Path,
    pin: tuple[str, str] | None = None,
) -> list[str]:
    """What Kyverno's ClusterPolicy refuses, per rule; empty: admitted. `pin`: the pipeline
    (name or file, sha256) the policy is pinned to; None: as shipped."""
    policy = yaml.safe_load(KYVERNO.read_text())
    if pin is not None:
        policy = _pinned_kyverno(policy, pin)
    refused = []
    request = {"request": {"object": pod, "operation": "CREATE"}}
    for rule in policy["spec"]["rules"]:
        if not engines.conditions_hold([rule["preconditions"]], request, now):
            continue
        for check in rule["verifyImages"]:
            for att in check["attestations"]:
                assert att["type"] == VSA_PREDICATE_TYPE
                keys = att["attestors"][0]["entries"][0]["keys"]
                key = _filled_key(keys["publicKeys"], pem)
                if not engines.signature_verifies(attempt / sign.VSA_BUNDLE_FILE, key, work):
                    refused.append(f"{rule['name']}: no attestation signed by the key")
                elif not engines.conditions_hold(att["conditions"], vsa(attempt)["predicate"], now):
                    refused.append(f"{rule['name']}: conditions")
    return refused


def not_before(now: dt.datetime, days: int = 7) -> str:
    """What the README's `date -u -d '-7 days'` renders NOT_BEFORE to on the day `now`."""
    return (now - dt.timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")


def policy_controller(
    pod: dict[str, Any],
    attempt: Path,
    pem: str,
    floor: str | None,
    work: Path,
    pin: tuple[str, str] | None = None,
) -> tuple[bool, list[str]]:
    """Each authority matches when the VSA's signature verifies with its key and every one of its
    attestation policies holds (the CUE engine on the statement); the ClusterImagePolicy's own
    policy then judges {spec, authorityMatches} (the CUE engine again). `floor`: what NOT_BEFORE
    is rendered to (None: the file as shipped); `pin`: as for `kyverno`."""
    cip = yaml.safe_load(POLICY_CONTROLLER.read_text())["spec"]
    statement = vsa(attempt)
    matches: dict[str, Any] = {}
    said = []
    for n, authority in enumerate(cip["authorities"]):
        key = _filled_key(authority["key"]["data"], pem)
        if not engines.signature_verifies(attempt / sign.VSA_BUNDLE_FILE, key, work / f"a{n}"):
            said.append(f"{authority['name']}: signature")
            continue
        held = {}
        for m, att in enumerate(authority["attestations"]):
            assert att["predicateType"] == statement["predicateType"]
            cue = att["policy"]["data"]
            if floor is not None:
                cue = cue.replace("NOT_BEFORE", floor)
            if pin is not None:  # as docs/attestations.md says: `string` replaced by the value
                for name, value in zip(("_pipelines", "_pipelineDigests"), pin, strict=True):
                    assert f"{name}: string\n" in cue, "the shipped policy admits any pipeline"
                    cue = cue.replace(f"{name}: string\n", f"{name}: {json.dumps(value)}\n")
            ok, why = engines.cue_vet(cue, statement, work / f"a{n}-{m}")
            if ok:
                held[att["name"]] = [{"subject": "", "issuer": ""}]
            else:
                said.append(f"{authority['name']}/{att['name']}: {why}")
        if len(held) == len(authority["attestations"]):
            matches[authority["name"]] = {"attestations": held}
    if not matches:  # no authority matched: refused before the policy is looked at
        return False, said
    data = {"spec": pod["spec"], "authorityMatches": matches}
    ok, why = engines.cue_vet(cip["policy"]["data"], json.loads(json.dumps(data)), work / "cip")
    return ok, [*said, why] if why else said
