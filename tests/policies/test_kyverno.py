"""data/policies/kyverno-clusterpolicy.yaml as shipped (only the key filled in): its preconditions and
attestation conditions evaluated by the jmespath library on Pods and on the SLSA VSAs the real
runner signed, the signature by sigstore-js with the policy's key. Kyverno's own glue (variable
substitution, time_since, the operators) is written in tests/policies/engines.py from its docs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import yaml

from tests.policies import admission, engines
from tests.policies.admission import pod
from tests.policies.conftest import Keys, vsa


def _now(attempt: Path, days: float = 0) -> dt.datetime:
    verified = dt.datetime.fromisoformat(vsa(attempt)["predicate"]["timeVerified"].replace("Z", "+00:00"))
    return verified + dt.timedelta(days=days, minutes=5)


def _judge(
    runs: dict[str, Path], keys: Keys, name: str, *, gpu: bool, tmp: Path, days: float = 0
) -> list[str]:
    attempt = runs[name]
    return admission.kyverno(pod(gpu=gpu), attempt, keys.pub.read_text(), _now(attempt, days), tmp)


CPU_RULE, GPU_RULE = admission.CPU_RULE, admission.GPU_RULE


def _both(runs: dict[str, Path], keys: Keys, name: str, tmp: Path) -> dict[str, list[str]]:
    """What is refused for a Pod without GPUs and for one that requests a GPU."""
    return {kind: _judge(runs, keys, name, gpu=kind == "gpu", tmp=tmp) for kind in ("cpu", "gpu")}


def test_the_gpu_level_is_admitted_with_and_without_gpus(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    assert _both(runs, policy_keys, "gpu_pass", tmp_path) == {"cpu": [], "gpu": []}


def test_a_pass_without_gpu_stages_admits_only_pods_without_gpus(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    """`-p python` ran no GPU stage: its PASS says nothing about a GPU."""
    assert _both(runs, policy_keys, "pass", tmp_path) == {"cpu": [], "gpu": [f"{GPU_RULE}: conditions"]}


def test_a_skipped_stage_admits_nothing(runs: dict[str, Path], policy_keys: Keys, tmp_path: Path) -> None:
    """--skip pip_check: pip check never ran, so no level is reached, neither Pod is admitted."""
    assert _both(runs, policy_keys, "skipped", tmp_path) == {
        "cpu": [f"{CPU_RULE}: conditions"],
        "gpu": [f"{GPU_RULE}: conditions"],
    }


def test_fail_and_error_are_refused(runs: dict[str, Path], policy_keys: Keys, tmp_path: Path) -> None:
    for name in ("fail", "error"):
        refused = _both(runs, policy_keys, name, tmp_path)
        assert refused == {"cpu": [f"{CPU_RULE}: conditions"], "gpu": [f"{GPU_RULE}: conditions"]}, name


def test_a_deferred_verdict_admits_only_pods_without_gpus(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    for name in ("deferred", "completion"):  # the completion ran without a GPU: still deferred
        assert _both(runs, policy_keys, name, tmp_path) == {"cpu": [], "gpu": [f"{GPU_RULE}: conditions"]}, (
            name
        )


def test_an_attestation_older_than_seven_days_is_refused(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    assert _judge(runs, policy_keys, "pass", gpu=False, tmp=tmp_path, days=6.9) == []
    assert _judge(runs, policy_keys, "pass", gpu=False, tmp=tmp_path, days=7.1) == [f"{CPU_RULE}: conditions"]


def test_an_attestation_signed_by_another_key_is_refused(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    assert _judge(runs, policy_keys, "other_key", gpu=False, tmp=tmp_path) == [
        f"{CPU_RULE}: no attestation signed by the key"
    ]


def test_each_pod_meets_exactly_one_rule() -> None:
    rules = yaml.safe_load(admission.KYVERNO.read_text())["spec"]["rules"]
    now = dt.datetime.now(dt.timezone.utc)
    for gpu in (False, True):
        request = {"request": {"object": pod(gpu=gpu)}}
        applies = [r["name"] for r in rules if engines.conditions_hold([r["preconditions"]], request, now)]
        assert applies == [
            "pods-with-gpus-need-imagegate-gpu" if gpu else "pods-without-gpus-need-imagegate-cpu"
        ]


def test_pinned_pipelines_admit_their_own_vsa_only(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    """The policy pinned to the `-p python` pipeline (its name and sha256, as the VSA names them):
    that run is admitted, a deferred run of another pipeline is not, though its level would be;
    pinned to a digest the pipeline does not have, nothing is."""
    pipeline = vsa(runs["pass"])["predicate"]["policy"]
    pin = (pipeline["uri"], pipeline["digest"]["sha256"])
    pem = policy_keys.pub.read_text()
    for name, refused in (("pass", []), ("deferred", [f"{CPU_RULE}: conditions"])):
        attempt = runs[name]
        assert admission.kyverno(pod(gpu=False), attempt, pem, _now(attempt), tmp_path, pin) == refused, name
    wrong = (pin[0], "0" * 64)
    assert admission.kyverno(pod(gpu=False), runs["pass"], pem, _now(runs["pass"]), tmp_path, wrong) == [
        f"{CPU_RULE}: conditions"
    ]
