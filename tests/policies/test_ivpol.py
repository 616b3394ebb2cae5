"""data/policies/kyverno-imagevalidatingpolicy.yaml as shipped (only the key filled in): its CEL by a
real CEL engine (cel-expr-python), Kyverno's image-verification functions and the request around
them written in tests/policies/ivpol.py from Kyverno's source, on the SLSA VSAs the real runner
signed, the signature by sigstore-js with the policy's key. The same verdicts as the
ClusterPolicy's (test_kyverno.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.policies import admission, ivpol
from tests.policies.admission import pod
from tests.policies.conftest import Keys, vsa

NO_LEVEL = "the imagegate VSA lacks level IMAGEGATE_{}"


def _now(attempt: Path, days: float = 0) -> dt.datetime:
    verified = dt.datetime.fromisoformat(vsa(attempt)["predicate"]["timeVerified"].replace("Z", "+00:00"))
    return verified + dt.timedelta(days=days, minutes=5)


def _judge(
    runs: dict[str, Path], keys: Keys, name: str, *, gpu: bool, tmp: Path, days: float = 0, **kw: Any
) -> str | None:
    attempt = runs[name]
    return admission.kyverno_ivpol(
        pod(gpu=gpu), attempt, keys.pub.read_text(), _now(attempt, days), tmp, **kw
    )


def _both(runs: dict[str, Path], keys: Keys, name: str, tmp: Path) -> dict[str, str | None]:
    """The refusal (None: admitted) for a Pod without GPUs and for one that requests a GPU."""
    return {kind: _judge(runs, keys, name, gpu=kind == "gpu", tmp=tmp) for kind in ("cpu", "gpu")}


def _lacks(said: str | None, level: str) -> bool:
    return said is not None and said.startswith(NO_LEVEL.format(level))


def test_the_gpu_level_is_admitted_with_and_without_gpus(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    assert _both(runs, policy_keys, "gpu_pass", tmp_path) == {"cpu": None, "gpu": None}


@pytest.mark.parametrize("name", ["pass", "deferred", "completion"])
def test_cpu_levels_admit_only_pods_without_gpus(
    name: str, runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    """A PASS of a pipeline without GPU stages, a deferred GPU stage, a completion that ran
    without a GPU: IMAGEGATE_CPU only."""
    judged = _both(runs, policy_keys, name, tmp_path)
    assert judged["cpu"] is None and _lacks(judged["gpu"], "GPU"), judged


@pytest.mark.parametrize("name", ["skipped", "fail", "error"])
def test_no_level_admits_nothing(name: str, runs: dict[str, Path], policy_keys: Keys, tmp_path: Path) -> None:
    """--skip (pip check never ran), FAIL and ERROR: no level, the VSA says FAILED."""
    refused = "the imagegate VSA did not pass"
    assert _both(runs, policy_keys, name, tmp_path) == {"cpu": refused, "gpu": refused}


def test_an_attestation_older_than_seven_days_is_refused(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    assert _judge(runs, policy_keys, "pass", gpu=False, tmp=tmp_path, days=6.9) is None
    said = _judge(runs, policy_keys, "pass", gpu=False, tmp=tmp_path, days=7.1)
    assert said is not None and "more than 168h ago" in said


def test_an_attestation_signed_by_another_key_is_refused(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    said = _judge(runs, policy_keys, "other_key", gpu=False, tmp=tmp_path)
    assert said is not None and said.startswith("no SLSA VSA signed by the imagegate key")


def test_pinned_pipelines_admit_their_own_vsa_only(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    """Pinned to the `-p python` pipeline (its name and sha256, as the VSA names them): that run
    is admitted, a deferred run of another pipeline is not; pinned to another digest, nothing is."""
    pipeline = vsa(runs["pass"])["predicate"]["policy"]
    pin = (pipeline["uri"], pipeline["digest"]["sha256"])
    other = "the imagegate VSA names a pipeline this policy does not admit"
    assert _judge(runs, policy_keys, "pass", gpu=False, tmp=tmp_path, pin=pin) is None
    assert _judge(runs, policy_keys, "deferred", gpu=False, tmp=tmp_path, pin=pin) == other
    wrong = (pin[0], "0" * 64)
    assert _judge(runs, policy_keys, "pass", gpu=False, tmp=tmp_path, pin=wrong) == other


def test_images_outside_the_pattern_are_not_judged(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    """matchImageReferences: a Pod whose images are all elsewhere is not this policy's to judge
    (replace the pattern with yours); with the pattern covering them, a FAIL refuses it."""
    elsewhere = pod(gpu=False)
    for c in elsewhere["spec"]["containers"]:
        c["image"] = c["image"].replace("registry.example/", "elsewhere.example/")
    pem, attempt = policy_keys.pub.read_text(), runs["fail"]
    assert admission.kyverno_ivpol(elsewhere, attempt, pem, _now(attempt), tmp_path) is None
    ours = admission.kyverno_ivpol(
        elsewhere, attempt, pem, _now(attempt), tmp_path, edit=lambda t: t.replace("registry.example/*", "*")
    )
    assert ours == "the imagegate VSA did not pass"


def test_a_vsa_without_the_fields_it_needs_is_refused(policy_keys: Keys) -> None:
    """A statement of the type, signed by the key, without `verifiedLevels`: the CEL errs on the
    missing field and failurePolicy Fail refuses, never admits."""
    now = dt.datetime.now(dt.timezone.utc)
    statement = {
        "predicateType": "https://slsa.dev/verification_summary/v1",
        "predicate": {"verifier": {"id": "https://imagegate.dev/verifier"}, "verificationResult": "PASSED"},
    }
    images = ivpol.Images(lambda i: i.split(":")[0] + "@sha256:" + "a" * 64, lambda i, k: [statement])
    said = ivpol.judge(pod(gpu=False), images, policy_keys.pub.read_text(), now, tlog_fix=True)
    assert said is not None and said.startswith("error (failurePolicy Fail)") and "verifiedLevels" in said


def test_the_last_verified_statement_of_the_type_is_the_one_judged(policy_keys: Keys) -> None:
    """Several VSAs on one image: extractPayload gives the last one cosign verified (the newest
    `.att` layer), whatever came before it."""
    now = dt.datetime.now(dt.timezone.utc)

    def made(result: str) -> dict[str, Any]:
        levels = ["IMAGEGATE_CPU"] if result == "PASSED" else []
        return {
            "predicateType": "https://slsa.dev/verification_summary/v1",
            "predicate": {
                "verifier": {"id": "https://imagegate.dev/verifier"},
                "verificationResult": result,
                "verifiedLevels": levels,
                "policy": {"uri": "python", "digest": {"sha256": "ab"}},
                "timeVerified": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        }

    pem = policy_keys.pub.read_text()
    for order, admitted in ((["FAILED", "PASSED"], True), (["PASSED", "FAILED"], False)):
        found = [made(r) for r in order]
        images = ivpol.Images(lambda i: i.split(":")[0] + "@sha256:" + "a" * 64, lambda i, k, f=found: f)
        assert (ivpol.judge(pod(gpu=False), images, pem, now, tlog_fix=True) is None) == admitted, order


def test_kyverno_1_19_0_counts_no_key_signed_vsa(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    """As released, Kyverno's attestation verification needs a transparency-log bundle whatever
    `insecureIgnoreTlog` says (kyverno#17109): the GPU-level VSA, signed by the key, is refused
    to every Pod; with the fix (kyverno#17217) it is admitted."""
    for gpu in (False, True):
        said = _judge(runs, policy_keys, "gpu_pass", gpu=gpu, tmp=tmp_path, tlog_fix=False)
        assert said is not None and said.startswith("no SLSA VSA signed by the imagegate key"), said
        assert _judge(runs, policy_keys, "gpu_pass", gpu=gpu, tmp=tmp_path, tlog_fix=True) is None


def test_the_policy_fits_the_v1_api_it_names() -> None:
    """The fields Kyverno 1.19's policies.kyverno.io/v1 ImageValidatingPolicy requires, and the
    autogen it allows (a policy on Pods only: CanAutoGen)."""
    doc = yaml.safe_load(ivpol.IVPOL.read_text())
    spec = doc["spec"]
    assert {"attestors", "validations"} <= set(spec)
    assert spec["validationActions"] == ["Deny"] and spec["failurePolicy"] == "Fail"
    for kind in ivpol.AUTOGEN_KINDS:
        made = ivpol.autogen_spec(spec, kind)
        assert "object.spec.?containers" not in yaml.safe_dump(made)
