"""Building blocks of the verdict sequences (test_sequences.py, and scripts/consumers.py, which
runs the same sequences through the real admission tools): a one-file image pushed under a fresh
repository, a runner's statement re-addressed to it, and attaching the way imagegate does
(replacing) or the way it did before (append-only).

One stand-in, named: a `--here` run judges this environment, so its statement is re-addressed to
the pushed image's digest and signed again by the real signer, as a run of that image would name
it. An 8-day-old verdict is the same stand-in with its finishedOn set back (time passing cannot
be waited for)."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagegate.attest import attach, keys, referrers, sign
from tests.attest.conftest import cli, docker
from tests.policies import several
from tests.policies.admission import not_before, pod
from tests.policies.conftest import Keys, payload

MODES = ("replace", "append-only")
CLUSTERPOLICY, IVPOL, POLICY_CONTROLLER = (
    "kyverno ClusterPolicy",
    "kyverno ImageValidatingPolicy",
    "policy-controller",
)


def push(image: str, repo: str) -> str:
    """`image` under a fresh repository: the sequence starts with no attestation. Returns
    repo@digest."""
    ref = image.rsplit("/", 1)[0] + f"/{repo}:1"
    docker("tag", image, ref)
    docker("push", ref)
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        return str(attach.resolve(client, parsed).reference)


def addressed(attempt: Path, ref: str, folder: Path, key: Path, finished: dt.datetime | None = None) -> Path:
    """The stand-in: the attempt's statement about `ref` (repo@digest), signed again."""
    return readdressed(attempt, ref, folder, keys.load_signing_key(key), finished).dsse_path


def readdressed(
    attempt: Path, ref: str, folder: Path, signer: keys.SigningKey, finished: dt.datetime | None = None
) -> sign.Signed:
    """`addressed`, signed by `signer` (a keyless one too): the signed attempt."""
    statement = payload(attempt / sign.DSSE_FILE)
    repo, _, digest = ref.partition("@")
    statement["subject"] = [{"name": repo, "digest": {"sha256": digest.partition(":")[2]}}]
    image = statement["predicate"].get("image")
    if isinstance(image, dict):
        image.update(subjectDigest="manifest", manifestDigest=digest, repository=repo, reference=ref)
    # Each statement said after the one before (attach never puts an earlier word over a later
    # one): now, or the time a step sets back, never the same instant twice.
    if finished is None:
        finished = _LAST[0] = max(dt.datetime.now(dt.timezone.utc), _LAST[0] + dt.timedelta(milliseconds=1))
    said = finished
    statement["predicate"]["finishedOn"] = (
        said.strftime("%Y-%m-%dT%H:%M:%S.") + f"{said.microsecond // 1000:03d}Z"
    )
    folder.mkdir(parents=True)
    (folder / SIGNER_PUB).write_bytes(signer.public.pem)
    return sign.sign_attempt(folder, statement, signer)


SIGNER_PUB = "signer.pub"  # beside each re-addressed statement: what attach verifies it with
_LAST = [dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)]


@contextlib.contextmanager
def append_only() -> Iterator[None]:
    """imagegate's attach before it replaced: no earlier statement is ever dropped."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(attach, "judge", lambda *_: None)
        yield


def attach_as(mode: str, dsse_file: Path, ref: str) -> None:
    """`imagegate attach` (replace), or the same attach with nothing replaced (append-only)."""
    pub = dsse_file.parent / SIGNER_PUB
    if mode == "replace":
        r = cli("attach", str(dsse_file), ref, "--key", str(pub))
        assert r.returncode == 0, r.stdout + r.stderr
    else:
        with append_only():
            referrers.attach_file(dsse_file, ref, [keys.load_public_key(pub)])


class Sequence:
    """One image's attestations, attached in order, judged after each step."""

    def __init__(self, mode: str, ref: str, policy_keys: Keys, tmp: Path) -> None:
        self.mode, self.ref, self.keys, self.tmp, self.n = mode, ref, policy_keys, tmp, 0

    def attach(self, attempt: Path, finished: dt.datetime | None = None) -> None:
        self.n += 1
        made = addressed(attempt, self.ref, self.tmp / f"s{self.n}", self.keys.key, finished)
        attach_as(self.mode, made, self.ref)

    def judge(self, *, gpu: bool) -> dict[str, bool]:
        """Whether each shipped policy admits a Pod running the image, by the project's own
        evaluator of each controller's rule (several.py, ivpol.py)."""
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


def sequence(mode: str, image: str, name: str, policy_keys: Keys, tmp: Path) -> Sequence:
    return Sequence(mode, push(image, f"{name}-{mode}"), policy_keys, tmp)
