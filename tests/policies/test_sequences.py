"""Sequences of verdicts attached to one image, judged as Kyverno and policy-controller combine
every statement they find for its digest (several.py says how, from their source): the latest
verdict decides because `imagegate attach` replaces the earlier ones. Each sequence is also
attached append-only, as imagegate attached before replacing (attest/replace.py switched off),
and there a controller gives the wrong answer: that is what replacing is for.

The runs are real (`run --here`, tests/policies/conftest.py); the one stand-in is named in
sequences.py. scripts/consumers.py runs the same sequences through the real tools."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagegate.attest import attach, referrers
from tests.attest.conftest import one_file_image, start_registry
from tests.policies.conftest import Keys
from tests.policies.sequences import IVPOL, MODES, addressed, admits, every, sequence

pytestmark = pytest.mark.engine


def appended(judged: dict[str, bool]) -> dict[str, bool]:
    """The answers that do not depend on which of several VSAs is read: appended, the
    ImageValidatingPolicy judges one, chosen by the referrers' (digest) order, not the newest
    (Kyverno's CLI 1.19.1 judged the earlier one in two of four sequences:
    benchmarks/records/2026-12-02-consumers.md); replacing leaves it one to judge."""
    return {k: v for k, v in judged.items() if k != IVPOL}


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with start_registry(tmp_path_factory.mktemp("seq-registry")) as host:
        yield host


@pytest.fixture(scope="module")
def image(registry: str) -> Iterator[str]:
    with one_file_image(f"{registry}/seq/a:1", b"image A\n") as ref:
        yield ref


@pytest.fixture(scope="module")
def other_image(registry: str) -> Iterator[str]:
    with one_file_image(f"{registry}/seq/b:1", b"image B: another digest\n") as ref:
        yield ref


@pytest.mark.parametrize("mode", MODES)
def test_fail_then_pass_admits(
    mode: str, image: str, runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    seq = sequence(mode, image, "fail-pass", policy_keys, tmp_path)
    seq.attach(runs["fail"])
    assert seq.judge(gpu=False) == every(False)
    seq.attach(runs["pass"])
    if mode == "replace":
        assert seq.judge(gpu=False) == every(True)
    else:  # the old FAIL beside the PASS: the ClusterPolicy refuses for ever
        assert appended(seq.judge(gpu=False)) == appended(admits(False, True, True))


@pytest.mark.parametrize("mode", MODES)
def test_pass_then_fail_refuses(
    mode: str, image: str, runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    seq = sequence(mode, image, "pass-fail", policy_keys, tmp_path)
    seq.attach(runs["pass"])
    assert seq.judge(gpu=False) == every(True)
    seq.attach(runs["fail"])  # e.g. a re-run after a new advisory
    if mode == "replace":
        assert seq.judge(gpu=False) == every(False)
    else:  # policy-controller admits on any PASS: the withdrawn acceptance still admits
        assert appended(seq.judge(gpu=False)) == appended(admits(False, False, True))


@pytest.mark.parametrize("mode", MODES)
def test_deferred_then_completed_admits_a_gpu_pod(
    mode: str, image: str, runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    seq = sequence(mode, image, "deferred-gpu", policy_keys, tmp_path)
    seq.attach(runs["deferred"])
    assert seq.judge(gpu=True) == every(False)
    assert seq.judge(gpu=False) == every(True)
    seq.attach(runs["gpu_pass"])  # the stand-in for a GPU node's completion
    if mode == "replace":
        assert seq.judge(gpu=True) == every(True)
    else:  # the deferred VSA, without the GPU level, stays beside the completion
        assert appended(seq.judge(gpu=True)) == appended(admits(False, True, True))


@pytest.mark.parametrize("mode", MODES)
def test_a_stale_verdict_refuses_until_a_fresh_run(
    mode: str, image: str, runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    seq = sequence(mode, image, "stale", policy_keys, tmp_path)
    seq.attach(runs["pass"], finished=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=8))
    assert seq.judge(gpu=False) == every(False)
    seq.attach(runs["pass"])
    if mode == "replace":
        assert seq.judge(gpu=False) == every(True)
    else:  # the stale one is still read: past its 7 days the ClusterPolicy refuses
        assert appended(seq.judge(gpu=False)) == appended(admits(False, True, True))


def test_one_images_attestations_never_admit_another(
    image: str, other_image: str, runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    a = sequence("replace", image, "one", policy_keys, tmp_path / "a")
    b = sequence("replace", other_image, "other", policy_keys, tmp_path / "b")
    assert a.ref.partition("@")[2] != b.ref.partition("@")[2]
    a.attach(runs["pass"])
    assert a.judge(gpu=False) == every(True)
    assert b.judge(gpu=False) == every(False)
    # Even copied onto B's `.att` tag (attach refuses that; done by hand), A's VSA names A's digest.
    made = addressed(runs["pass"], a.ref, tmp_path / "copied", policy_keys.key)
    parsed = attach.parse_image(b.ref)
    with attach.client_for(parsed) as client:
        for env in referrers.standard_beside(made, referrers.read_envelopes(made)[0]):
            attach.append(client, attach.resolve(client, parsed), env)
    assert b.judge(gpu=False) == every(False)
