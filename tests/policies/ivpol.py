"""Kyverno's ImageValidatingPolicy (data/policies/kyverno-imagevalidatingpolicy.yaml) judged by a real
CEL engine, cel-expr-python (Google's CEL in C++, type-checked as cel-go checks it in Kyverno),
with Kyverno's own parts around the CEL written here from kyverno/kyverno v1.19.0's source
(named as such; Kyverno does not run here):

- the environment (`pkg/image/verification/evaluator/compiler.go`, createBaseIvpolEnv): the
  variables `object`, `images` (map of extractor name to images), `attestors`, `attestations`
  (name to name), `variables`; `time.now()` (kyverno/sdk `extensions/cel/libs/time`);
- which images a policy sees (`pkg/cel/compiler/images.go`: containers, initContainers and
  ephemeralContainers of the Pod, of a controller's `spec.template.spec`, of a CronJob's
  `spec.jobTemplate.spec.template.spec`), kept when a `matchImageReferences` glob matches
  (`pkg/cel/compiler/image.go`, gobwas/glob without separators: `*` is any run of characters);
- `validationConfigurations` (all three default true in the v1 CRD): `mutateDigest`, the mutating
  webhook replacing each matched image's tag by its digest before validation (modelled as the
  `resolve` of `Images`); `verifyDigest`, an image still without a digest refused
  (evaluator/policy.go, checkDigests); `required`, every matched image verified by a function
  call that counted (evaluator/policy.go, EnforceRequired);
- the image-verification functions (`pkg/cel/libs/imageverify/lib.go`, `impl.go`):
  `verifyAttestationSignatures(image, attestation, attestors)` counts the attestors under which
  the image has a verified statement of the attestation's type (0 for an image no
  matchImageReferences matches); `extractPayload(image, attestation)` returns the statement
  verified for that type, an error before a verification. Several statements of one type: cosign
  (`cosign.VerifyImageAttestations`, the `.att` tag's layers in order: imagegate's referrers are
  not Sigstore bundles, so cosign's bundle path is not taken) returns each that verifies with the
  key and names the image's digest in its subject; `pkg/image/verifiers/ivpol/cosign/verifier.go`
  VerifyAttestationSignature stores each of the type by `ImageData.AddVerifiedIntotoPayloads`
  (kyverno/sdk `extensions/imagedataloader/loader.go`), a map keyed by predicate type, so each
  overwrites the one before: `extractPayload` returns the LAST verified one, the newest layer;
- kyverno#17109 (open in v1.19.0, release-1.19 and main as read; the fix is kyverno#17217):
  VerifyAttestationSignature refuses what cosign verified without a transparency-log bundle
  (`!verified`: "cosign bundle verification failed") even when the attestor sets
  `ctlog.insecureIgnoreTlog`, which the image-signature path honours. imagegate's statements are
  signed by a key with no transparency-log entry, so a released Kyverno counts none of them:
  `tlog_fix=False` judges as it does, `tlog_fix=True` as the fix would;
- autogen (`pkg/cel/policies/ivpol/autogen/autogen.go`, `pkg/cel/autogen/`): a policy matching
  only Pods is copied for Deployments, DaemonSets, Jobs, ReplicaSets, StatefulSets (the spec's
  JSON with `object.spec` -> `object.spec.template.spec`, `object.metadata` ->
  `object.spec.template.metadata`, `.namespace` left alone) and CronJobs (`spec.jobTemplate...`);
- evaluation (evaluator/policy.go, Evaluate): the validations in order, the first false one
  refuses with its message (or messageExpression); an evaluation error refuses
  (failurePolicy Fail)."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from cel_expr_python import cel
from cel_expr_python.ext import ext_optional, ext_strings

from imagegate._support import resources

IVPOL = resources.policies_dir() / "kyverno-imagevalidatingpolicy.yaml"

# pkg/cel/autogen/data.go: ReplacementsMap and ConfigsMap.
_DEFAULTS = [("spec", "spec.template.spec"), ("metadata", "spec.template.metadata")]
_CRONJOBS = [
    ("spec", "spec.jobTemplate.spec.template.spec"),
    ("metadata", "spec.jobTemplate.spec.template.metadata"),
]
AUTOGEN_KINDS = {
    "DaemonSet": _DEFAULTS,
    "Deployment": _DEFAULTS,
    "ReplicaSet": _DEFAULTS,
    "StatefulSet": _DEFAULTS,
    "Job": _DEFAULTS,
    "CronJob": _CRONJOBS,
}
# pkg/cel/compiler/images.go: where each kind holds its Pod spec.
_POD_SPEC = {"Pod": [], **{k: ["template", "spec"] for k in AUTOGEN_KINDS}}
_POD_SPEC["CronJob"] = ["jobTemplate", "spec", "template", "spec"]
EXTRACTORS = ("containers", "initContainers", "ephemeralContainers")


def _replace(text: str, old: str, new: str) -> str:
    """pkg/cel/autogen/replacement.go: every `old` rewritten to `new`, except where `.namespace`
    follows as a whole path segment (a workload's own namespace stays)."""
    return re.sub(re.escape(old) + r"(?!\.namespace(?![A-Za-z0-9_]))", new.replace("\\", "\\\\"), text)


def autogen_spec(spec: dict[str, Any], kind: str) -> dict[str, Any]:
    """The policy's spec as autogen makes it for `kind` (a Pod controller)."""
    (rule,) = spec["matchConstraints"]["resourceRules"]  # CanAutoGen (pkg/cel/autogen/support.go)
    assert (rule["apiGroups"], rule["apiVersions"], rule["resources"]) == ([""], ["v1"], ["pods"])
    assert not (spec.get("autogen") or {}).get("podControllers"), "every controller: the field unset"
    text = json.dumps(spec)
    for old, new in AUTOGEN_KINDS[kind]:
        for prefix in ("object.", "oldObject."):
            text = _replace(text, prefix + old, prefix + new)
    made: dict[str, Any] = json.loads(text)
    return made


def _glob(pattern: str, text: str) -> bool:
    """gobwas/glob compiled without separators: `*` any run, `?` one character."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, text, re.DOTALL) is not None


@dataclass(frozen=True)
class Images:
    """What Kyverno's image context finds in the registry. `resolve`: an image reference to
    repo@digest (mutateDigest's lookup), None when not found; `statements`: for repo@digest and a
    public key (PEM), the statements cosign verifies, in the `.att` tag's layer order."""

    resolve: Callable[[str], str | None]
    statements: Callable[[str, str], list[dict[str, Any]]]


@dataclass
class _Request:
    """One admission request's state in Kyverno's image-verification library."""

    policy: dict[str, Any]
    images: Images
    tlog_fix: bool
    payloads: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    verified: dict[str, bool] = field(default_factory=dict)

    def matches(self, image: str) -> bool:
        globs = [m["glob"] for m in self.policy.get("matchImageReferences") or []]
        assert all(globs), "only glob matchImageReferences are used by policies/"
        return not globs or any(_glob(g, image) for g in globs)

    def _intoto_type(self, name: str) -> str:
        for att in self.policy.get("attestations") or []:
            if att["name"] == name:
                return str(att["intoto"]["type"])
        raise ValueError(f"attestation not found in policy: {name}")

    def verify_attestation_signatures(self, image: str, attestation: str, attestors: list[Any]) -> int:
        if not self.matches(image):
            return 0
        kind = self._intoto_type(attestation)
        count = 0
        for attestor in attestors:
            pem = attestor["cosign"]["key"]["data"]
            of_type = [s for s in self.images.statements(image, pem) if s.get("predicateType") == kind]
            if not self.tlog_fix:  # kyverno#17109: no transparency-log bundle, so an error
                continue
            for statement in of_type:  # AddVerifiedIntotoPayloads: each overwrites the one before
                self.payloads[(image, kind)] = statement
            count += bool(of_type)
        if attestors:
            self.verified[image] = self.verified.get(image, False) or count > 0
        return count

    def extract_payload(self, image: str, attestation: str) -> dict[str, Any]:
        kind = self._intoto_type(attestation)
        if (image, kind) not in self.payloads:
            raise ValueError(
                "failed to get payload: intoto attestation payload cannot be fetch before verifying"
                " intoto attestation"
            )
        return self.payloads[(image, kind)]


_T = cel.Type


def _env(request: _Request, now: dt.datetime) -> Any:
    functions = [
        cel.FunctionDecl(
            "verifyAttestationSignatures",
            [
                cel.Overload(
                    "verify_image_attestations_string_string_stringarray",
                    _T.INT,
                    [_T.STRING, _T.STRING, _T.List(_T.DYN)],
                    impl=request.verify_attestation_signatures,
                )
            ],
        ),
        cel.FunctionDecl(
            "extractPayload",
            [
                cel.Overload(
                    "payload_string_string", _T.DYN, [_T.STRING, _T.STRING], impl=request.extract_payload
                )
            ],
        ),
        cel.FunctionDecl("time.now", [cel.Overload("time_now", _T.TIMESTAMP, [], impl=lambda: now)]),
    ]
    variables = {
        "object": _T.DYN,
        "oldObject": _T.DYN,
        "images": _T.Map(_T.STRING, _T.List(_T.STRING)),
        "attestors": _T.Map(_T.STRING, _T.DYN),
        "attestations": _T.Map(_T.STRING, _T.STRING),
        "variables": _T.Map(_T.STRING, _T.DYN),
    }
    return cel.NewEnv(
        variables=variables,
        extensions=[ext_optional.ExtOptional(), ext_strings.ExtStrings()],
        functions=functions,
    )


class CelError(Exception):
    """An expression that does not compile or whose evaluation errs."""


def _eval(env: Any, expression: str, data: dict[str, Any], want: Any = None) -> Any:
    try:
        compiled = env.compile(expression)
    except Exception as e:  # the engine's compile error: the policy itself is wrong
        raise AssertionError(f"{expression!r} does not compile: {e}") from e
    if want is not None:
        assert compiled.return_type() == want, (expression, compiled.return_type().name())
    out = compiled.eval(data=data)
    if out.type() == _T.ERROR:
        raise CelError(f"{expression.strip()[:80]}...: {out.value()}")
    return out.plain_value()


def policy_text(edit: Callable[[str], str] | None = None) -> str:
    text = IVPOL.read_text()
    return edit(text) if edit else text


def pinned(text: str, pin: tuple[str, str]) -> str:
    """The policy pinned as docs/attestations.md says: `"*"` in `pipelines` and `pipelineDigests`
    replaced by the pipeline's name (or file) and its sha256."""
    for name, value in zip(("pipelines", "pipelineDigests"), pin, strict=True):
        old = f"- name: {name}\n      expression: '[\"*\"]'"
        assert text.count(old) == 1, "the shipped policy admits any pipeline"
        text = text.replace(old, f"- name: {name}\n      expression: '[{json.dumps(value)}]'")
    return text


def filled(text: str, pem: str) -> str:
    """The key placeholder replaced by `pem`, indented as the block it sits in."""
    from tests.policies.admission import PLACEHOLDER, fill_key  # admission imports this module

    assert text.count(PLACEHOLDER) == 1, "the shipped policy names the key to replace"
    return fill_key(text, pem)


def judge(
    obj: dict[str, Any],
    images: Images,
    pem: str,
    now: dt.datetime,
    *,
    tlog_fix: bool,
    pin: tuple[str, str] | None = None,
    edit: Callable[[str], str] | None = None,
) -> str | None:
    """What the ImageValidatingPolicy says to creating `obj` (a Pod or a Pod controller): None
    when admitted, else the refusal's message. `pem`: the key filled in; `tlog_fix`: judged with
    kyverno#17217's fix (True) or as Kyverno 1.19.0 is (False); `pin`, `edit` as for
    admission.kyverno."""
    text = filled(policy_text(edit), pem)
    if pin is not None:
        text = pinned(text, pin)
    doc = yaml.safe_load(text)
    assert (doc["apiVersion"], doc["kind"]) == ("policies.kyverno.io/v1", "ImageValidatingPolicy")
    spec = doc["spec"] if obj["kind"] == "Pod" else autogen_spec(doc["spec"], obj["kind"])
    assert "matchConditions" not in spec, "policies/ uses no matchConditions"
    request = _Request(spec, images, tlog_fix)
    pod_spec = obj["spec"]
    for key in _POD_SPEC[obj["kind"]]:
        pod_spec = pod_spec[key]
    extracted: dict[str, list[str]] = {}
    for name in EXTRACTORS:
        matched = [c["image"] for c in pod_spec.get(name) or [] if request.matches(c["image"])]
        extracted[name] = [images.resolve(i) or i for i in matched]  # mutateDigest
    for image in [i for found in extracted.values() for i in found]:
        if "@" not in image:  # verifyDigest
            return f"image {image} does not have a digest"
    env = _env(request, now)
    data: dict[str, Any] = {
        "object": obj,
        "oldObject": None,
        "images": extracted,
        "attestors": {a["name"]: a for a in spec["attestors"]},
        "attestations": {a["name"]: a["name"] for a in spec.get("attestations") or []},
        "variables": {},
    }
    try:
        for variable in spec.get("variables") or []:  # in order: each reads only those before it
            data["variables"] = {
                **data["variables"],
                variable["name"]: _eval(env, variable["expression"], data),
            }
        for n, validation in enumerate(spec["validations"]):
            if not _eval(env, validation["expression"], data, want=_T.BOOL):
                if "messageExpression" in validation:
                    return str(_eval(env, validation["messageExpression"], data, want=_T.STRING))
                return str(validation.get("message") or f"CEL expression validation failed at index {n}")
    except CelError as e:
        return f"error (failurePolicy Fail): {e}"
    unverified = [i for found in extracted.values() for i in found if not request.verified.get(i)]
    if unverified:  # validationConfigurations.required
        return f"images not verified: {unverified}"
    return None
