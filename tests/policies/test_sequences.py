"""Sequences of verdicts attached to one image, judged as Kyverno and policy-controller combine
every statement they find for its digest (several.py says how, from their source): the latest
verdict decides because `imagegate attach` replaces the earlier ones. Each sequence is also
attached append-only, as imagegate attached before replacing (attest/replace.py switched off),
and there a controller gives the wrong answer: that is what replacing is for.

The runs are real (`run --here`, tests/policies/conftest.py); one stand-in, named: a `--here`
run judges this environment, so its statement is re-addressed to the pushed image's digest and
signed again by the real signer, as a run of that image would name it. An 8-day-old verdict is
the same stand-in with its finishedOn set back (time passing cannot be waited for)."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagegate.attest import attach, keys, referrers, sign
from tests.attest.conftest import cli, docker, start_registry
from tests.policies import several
from tests.policies.admission import not_before, pod
from tests.policies.conftest import Keys, payload

pytestmark = pytest.mark.engine

MODES = ("replace", "append-only")
CLUSTERPOLICY, IVPOL, POLICY_CONTROLLER = (
    "kyverno ClusterPolicy",
    "kyverno ImageValidatingPolicy",
    "policy-controller",
)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with start_registry(tmp_path_factory.mktemp("seq-registry")) as host:
        yield host


def _image(registry: str, text: bytes, name: str) -> Iterator[str]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
    ref = f"{registry}/seq/{name}:1"
    docker("import", "-", ref, stdin=buf.getvalue())
    try:
        yield ref
    finally:
        subprocess.run(["docker", "rmi", "-f", ref], capture_output=True)


@pytest.fixture(scope="module")
def image(registry: str) -> Iterator[str]:
    yield from _image(registry, b"image A\n", "a")


@pytest.fixture(scope="module")
def other_image(registry: str) -> Iterator[str]:
    yield from _image(registry, b"image B: another digest\n", "b")


def _push(image: str, repo: str) -> str:
    """`image` under a fresh repository: the sequence starts with no attestation. Returns
    repo@digest."""
    ref = image.rsplit("/", 1)[0] + f"/{repo}:1"
    docker("tag", image, ref)
    docker("push", ref)
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        return str(attach.resolve(client, parsed).reference)


def _addressed(attempt: Path, ref: str, folder: Path, key: Path, finished: dt.datetime | None = None) -> Path:
    """The stand-in: the attempt's statement about `ref` (repo@digest), signed again."""
    statement = payload(attempt / sign.DSSE_FILE)
    repo, _, digest = ref.partition("@")
    statement["subject"] = [{"name": repo, "digest": {"sha256": digest.partition(":")[2]}}]
    image = statement["predicate"].get("image")
    if isinstance(image, dict):
        image.update(subjectDigest="manifest", manifestDigest=digest, repository=repo, reference=ref)
    if finished is not None:
        statement["predicate"]["finishedOn"] = finished.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    folder.mkdir(parents=True)
    return sign.sign_attempt(folder, statement, keys.load_signing_key(key)).dsse_path


@contextlib.contextmanager
def _append_only() -> Iterator[None]:
    """imagegate's attach before it replaced: no earlier statement is ever dropped."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(attach, "replaces", lambda *_: False)
        yield


def _attach(mode: str, dsse_file: Path, ref: str) -> None:
    if mode == "replace":
        r = cli("attach", str(dsse_file), ref)
        assert r.returncode == 0, r.stdout + r.stderr
    else:
        with _append_only():
            referrers.attach_file(dsse_file, ref)


class Sequence:
    """One image's attestations, attached in order, judged after each step."""

    def __init__(self, mode: str, ref: str, policy_keys: Keys, tmp: Path) -> None:
        self.mode, self.ref, self.keys, self.tmp, self.n = mode, ref, policy_keys, tmp, 0

    def attach(self, attempt: Path, finished: dt.datetime | None = None) -> None:
        self.n += 1
        made = _addressed(attempt, self.ref, self.tmp / f"s{self.n}", self.keys.key, finished)
        _attach(self.mode, made, self.ref)

    def judge(self, *, gpu: bool) -> dict[str, bool]:
        """Whether each shipped policy admits a Pod running the image."""
        now = dt.datetime.now(dt.timezone.utc)
        key = keys.load_public_key(self.keys.pub)
        found = several.statements_for(self.ref, key)
        self.n += 1
        k = several.kyverno(pod(gpu=gpu), found, now)
        pc, _ = several.policy_controller(pod(gpu=gpu), found, not_before(now), self.tmp / f"j{self.n}")
        running = pod(gpu=gpu)
        for c in running["spec"]["containers"]:
            c["image"] = self.ref
        pattern = self.ref.split("/")[0] + "/*"
        iv = several.ivpol_judge(running, pattern, key, self.keys.pub.read_text(), now)
        return {CLUSTERPOLICY: not k, IVPOL: iv is None, POLICY_CONTROLLER: pc}


def admits(clusterpolicy: bool, ivpol: bool, policy_controller: bool) -> dict[str, bool]:
    return {CLUSTERPOLICY: clusterpolicy, IVPOL: ivpol, POLICY_CONTROLLER: policy_controller}


def every(admitted: bool) -> dict[str, bool]:
    return admits(admitted, admitted, admitted)


def _sequence(mode: str, image: str, name: str, policy_keys: Keys, tmp: Path) -> Sequence:
    return Sequence(mode, _push(image, f"{name}-{mode}"), policy_keys, tmp)


@pytest.mark.parametrize("mode", MODES)
def test_fail_then_pass_admits(
    mode: str, image: str, runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    seq = _sequence(mode, image, "fail-pass", policy_keys, tmp_path)
    seq.attach(runs["fail"])
    assert seq.judge(gpu=False) == every(False)
    seq.attach(runs["pass"])
    if mode == "replace":
        assert seq.judge(gpu=False) == every(True)
    else:  # the old FAIL beside the PASS: the ClusterPolicy refuses for ever; the IVPOL reads the newest
        assert seq.judge(gpu=False) == admits(False, True, True)


@pytest.mark.parametrize("mode", MODES)
def test_pass_then_fail_refuses(
    mode: str, image: str, runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    seq = _sequence(mode, image, "pass-fail", policy_keys, tmp_path)
    seq.attach(runs["pass"])
    assert seq.judge(gpu=False) == every(True)
    seq.attach(runs["fail"])  # e.g. a re-run after a new advisory
    if mode == "replace":
        assert seq.judge(gpu=False) == every(False)
    else:  # policy-controller admits on any PASS: the withdrawn acceptance still admits
        assert seq.judge(gpu=False) == admits(False, False, True)


@pytest.mark.parametrize("mode", MODES)
def test_deferred_then_completed_admits_a_gpu_pod(
    mode: str, image: str, runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    seq = _sequence(mode, image, "deferred-gpu", policy_keys, tmp_path)
    seq.attach(runs["deferred"])
    assert seq.judge(gpu=True) == every(False)
    assert seq.judge(gpu=False) == every(True)
    seq.attach(runs["gpu_pass"])  # the stand-in for a GPU node's completion
    if mode == "replace":
        assert seq.judge(gpu=True) == every(True)
    else:  # the deferred VSA, without the GPU level, stays beside the completion
        assert seq.judge(gpu=True) == admits(False, True, True)


@pytest.mark.parametrize("mode", MODES)
def test_a_stale_verdict_refuses_until_a_fresh_run(
    mode: str, image: str, runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    seq = _sequence(mode, image, "stale", policy_keys, tmp_path)
    seq.attach(runs["pass"], finished=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=8))
    assert seq.judge(gpu=False) == every(False)
    seq.attach(runs["pass"])
    if mode == "replace":
        assert seq.judge(gpu=False) == every(True)
    else:  # the stale one is still read: past its 7 days the ClusterPolicy refuses
        assert seq.judge(gpu=False) == admits(False, True, True)


def test_one_images_attestations_never_admit_another(
    image: str, other_image: str, runs: dict[str, Path], policy_keys: Keys, tmp_path: Path
) -> None:
    a = _sequence("replace", image, "one", policy_keys, tmp_path / "a")
    b = _sequence("replace", other_image, "other", policy_keys, tmp_path / "b")
    assert a.ref.partition("@")[2] != b.ref.partition("@")[2]
    a.attach(runs["pass"])
    assert a.judge(gpu=False) == every(True)
    assert b.judge(gpu=False) == every(False)
    # Even copied onto B's `.att` tag (attach refuses that; done by hand), A's VSA names A's digest.
    made = _addressed(runs["pass"], a.ref, tmp_path / "copied", policy_keys.key)
    parsed = attach.parse_image(b.ref)
    with attach.client_for(parsed) as client:
        for env in referrers.standard_beside(made, referrers.read_envelopes(made)[0]):
            attach.attach(client, parsed, env, allow_other_subject=True)
    assert b.judge(gpu=False) == every(False)
