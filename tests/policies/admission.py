"""An admission request as each controller judges it with the shipped policies (imagegate.policies), built from
the real evaluators in engines.py: the policy file as shipped, with only its placeholders filled
(the public key; policy-controller's NOT_BEFORE), the Pod, and an attempt folder the runner
signed, whose SLSA VSA the image carries."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from imagegate._support import resources
from imagegate.attest import sign
from imagegate.attest.vsa import VSA_PREDICATE_TYPE
from tests.policies import engines, ivpol
from tests.policies.conftest import vsa

POLICIES = resources.policies_dir()  # shipped with the package (data/policies/)
KYVERNO = POLICIES / "kyverno-clusterpolicy.yaml"
POLICY_CONTROLLER = POLICIES / "policy-controller-clusterimagepolicy.yaml"
PLACEHOLDER = "REPLACE WITH THE CONTENTS OF imagegate.pub"
_KEY_BLOCK = re.compile(
    rf"^( *)-----BEGIN PUBLIC KEY-----\n *{re.escape(PLACEHOLDER)}\n *-----END PUBLIC KEY-----$", re.M
)
CPU_RULE = "pods-without-gpus-need-imagegate-cpu"
GPU_RULE = "pods-with-gpus-need-imagegate-gpu"


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


# Where each Pod controller holds its Pod template (the Kubernetes API's workload kinds).
TEMPLATE_PATHS = {
    "Deployment": ("apps/v1", ["template"]),
    "StatefulSet": ("apps/v1", ["template"]),
    "DaemonSet": ("apps/v1", ["template"]),
    "ReplicaSet": ("apps/v1", ["template"]),
    "Job": ("batch/v1", ["template"]),
    "CronJob": ("batch/v1", ["jobTemplate", "spec", "template"]),
}


def templated(kind: str, pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` as the Pod template of a `kind` (Deployment, Job, StatefulSet, CronJob...)."""
    api, path = TEMPLATE_PATHS[kind]
    spec: dict[str, Any] = {"metadata": {"labels": {"app": "a"}}, "spec": pod["spec"]}
    for key in reversed(path):
        spec = {key: spec}
    if kind != "CronJob" and kind != "Job":
        spec["selector"] = {"matchLabels": {"app": "a"}}
    if kind == "CronJob":
        spec["schedule"] = "0 * * * *"
    return {"apiVersion": api, "kind": kind, "metadata": {"name": "w"}, "spec": spec}


def fill_key(text: str, pem: str) -> str:
    """A shipped policy's text with its public-key placeholder block replaced by `pem`, each line
    at the block's indentation (as a user pastes imagegate.pub into it)."""
    lines = pem.strip().splitlines()
    return _KEY_BLOCK.sub(lambda m: "\n".join(m.group(1) + line for line in lines), text)


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


# Kyverno's autogen, as pkg/autogen/v1 in kyverno/kyverno writes it: a rule that matches Pods is
# copied for the Pod controllers (autogen.go: generateRules, convertRule), named autogen-NAME or
# autogen-cronjob-NAME, and its JSON text is rewritten by these byte replacements (rule.go:
# updateFields, podReplacementRules and cronJobReplacementRules).
AUTOGEN = {
    "pods": ("autogen", "spec.template."),
    "CronJob": ("autogen-cronjob", "spec.jobTemplate.spec.template."),
}
AUTOGEN_CONTROLLERS = {"DaemonSet", "Deployment", "Job", "StatefulSet", "ReplicaSet", "ReplicationController"}


def kyverno_rules(policy: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The rules Kyverno applies to an object of `kind`: the Pod rules as written for a Pod, their
    autogen copies for a Pod controller (the policy sets no autogen-controllers annotation: all)."""
    assert "pod-policies.kyverno.io/autogen-controllers" not in policy["metadata"].get("annotations", {})
    rules = [r for r in policy["spec"]["rules"] if "Pod" in r["match"]["any"][0]["resources"]["kinds"]]
    if kind == "Pod":
        return rules
    prefix, into = AUTOGEN["CronJob" if kind == "CronJob" else "pods"]
    assert kind == "CronJob" or kind in AUTOGEN_CONTROLLERS, kind
    made = []
    for rule in rules:
        text = json.dumps(rule)
        for old in ("request.object.", "request.oldObject."):
            for field in ("spec", "metadata"):
                text = text.replace(old + field, old + into + field)
        copy = json.loads(text)
        copy["name"] = f"{prefix}-{rule['name']}"[:63]
        made.append(copy)
    return made


def kyverno(
    obj: dict[str, Any],
    attempt: Path,
    pem: str,
    now: dt.datetime,
    work: Path,
    pin: tuple[str, str] | None = None,
    edit: Callable[[str], str] | None = None,
) -> list[str]:
    """What Kyverno's ClusterPolicy refuses, per rule; empty: admitted. `obj`: a Pod or a Pod
    controller; `pin`: the pipeline (name or file, sha256) the policy is pinned to; None: as
    shipped; `edit`: a change made to the policy's text first, as its comments tell a user to."""
    text = KYVERNO.read_text()
    policy = yaml.safe_load(edit(text) if edit else text)
    if pin is not None:
        policy = _pinned_kyverno(policy, pin)
    refused = []
    request = {"request": {"object": obj, "operation": "CREATE"}}
    for rule in kyverno_rules(policy, obj["kind"]):
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


def attempt_images(attempt: Path, work: Path) -> ivpol.Images:
    """The registry Kyverno would read for a Pod's image, a stand-in (named): no registry holds
    `registry.example/...`, so every image resolves to the digest the attempt's VSA names in its
    subject, and carries that VSA, verified by sigstore-js with the policy's key (as cosign does,
    with the image's digest in the subject)."""
    statement = vsa(attempt)
    digests = {f"sha256:{s['digest']['sha256']}" for s in statement["subject"]}

    def resolve(image: str) -> str:
        repo = image.partition("@")[0]
        if ":" in repo.rsplit("/", 1)[-1]:  # a tag, not a registry's port
            repo = repo.rsplit(":", 1)[0]
        return f"{repo}@{min(digests)}"

    def statements(image: str, pem: str) -> list[dict[str, Any]]:
        named = image.partition("@")[2] in digests
        signed = engines.signature_verifies(attempt / sign.VSA_BUNDLE_FILE, pem, work)
        return [statement] if named and signed else []

    return ivpol.Images(resolve, statements)


def kyverno_ivpol(
    obj: dict[str, Any], attempt: Path, pem: str, now: dt.datetime, work: Path, **options: Any
) -> str | None:
    """What Kyverno's ImageValidatingPolicy says to `obj` (None: admitted), the image carrying
    the attempt's VSA; `options`: `pin`, `edit`, as for `kyverno`, and `tlog_fix` (ivpol.judge),
    True unless given: the policy's meaning once Kyverno verifies key-signed attestations."""
    options.setdefault("tlog_fix", True)
    return ivpol.judge(obj, attempt_images(attempt, work), pem, now, **options)


def not_before(now: dt.datetime, days: int = 7) -> str:
    """What the README's `date -u -d '-7 days'` renders NOT_BEFORE to on the day `now`."""
    return (now - dt.timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")


def policy_controller(
    obj: dict[str, Any], attempt: Path, pem: str, floor: str | None, work: Path, **options: Any
) -> tuple[bool, list[str]]:
    """Each authority matches when the VSA's signature verifies with its key and every one of its
    attestation policies holds (the CUE engine on the statement); the ClusterImagePolicy's own
    policy then judges {spec, authorityMatches} (the CUE engine again). `floor`: what NOT_BEFORE
    is rendered to (None: the file as shipped); `options`: `pin`, `edit`, as for `kyverno`."""
    return policy_controller_many([obj], attempt, pem, floor, work, **options)[0]


def attestation_cue(att: dict[str, Any], floor: str | None, pin: tuple[str, str] | None = None) -> str:
    """An authority's attestation policy as deployed: NOT_BEFORE rendered to `floor` (None: as
    shipped) and, with `pin`, its pipeline lists pinned."""
    cue = str(att["policy"]["data"])
    if floor is not None:
        cue = cue.replace("NOT_BEFORE", floor)
    if pin is not None:  # as docs/attestations.md says: `string` replaced by the value
        for name, value in zip(("_pipelines", "_pipelineDigests"), pin, strict=True):
            assert f"{name}: string\n" in cue, "the shipped policy admits any pipeline"
            cue = cue.replace(f"{name}: string\n", f"{name}: {json.dumps(value)}\n")
    return cue


def policy_controller_many(
    objs: list[dict[str, Any]],
    attempt: Path,
    pem: str,
    floor: str | None,
    work: Path,
    pin: tuple[str, str] | None = None,
    edit: Callable[[str], str] | None = None,
) -> list[tuple[bool, list[str]]]:
    """`policy_controller` for each of `objs` (Pods or Pod controllers) with one image, in order.
    The policy is given the object's highest-level spec, as policy-controller's includeSpec gives
    it (sigstore/policy-controller, pkg/webhook/validator.go: ValidatePod passes the Pod's spec,
    ValidatePodSpecable a Deployment's, Job's, StatefulSet's... spec, ValidateCronJob the CronJob's)."""
    text = POLICY_CONTROLLER.read_text()
    cip = yaml.safe_load(edit(text) if edit else text)["spec"]
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
            ok, why = engines.cue_vet(attestation_cue(att, floor, pin), statement, work / f"a{n}-{m}")
            if ok:
                held[att["name"]] = [{"subject": "", "issuer": ""}]
            else:
                said.append(f"{authority['name']}/{att['name']}: {why}")
        if len(held) == len(authority["attestations"]):
            matches[authority["name"]] = {"attestations": held}
    if not matches:  # no authority matched: refused before the policy is looked at
        return [(False, said) for _ in objs]
    datas = [json.loads(json.dumps({"spec": obj["spec"], "authorityMatches": matches})) for obj in objs]
    judged = engines.cue_vet_many(cip["policy"]["data"], datas, work / "cip", command="eval")
    return [(ok, [*said, why] if why else said) for ok, why in judged]
