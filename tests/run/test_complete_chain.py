"""`imagegate complete` builds only on an earlier attempt that verifies (its signature with a
trusted key, its evidence, its link), and a chain signed on two machines verifies with both keys,
each link naming the key that verified it. Real runs in this environment (`run --here`), real
keys; nothing is mocked."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from imagegate._support.jsontypes import canonical_json
from imagegate.attest import dsse, keys, sign
from tests.helpers import Result, imagegate
from tests.run.test_gpu import _attempts, _pipeline


def _keypair(folder: Path, name: str) -> tuple[Path, Path, str]:
    key = keys.generate()
    priv, pub = keys.write_keypair(folder / name, key, None)
    return priv, pub, key.public.fingerprint


@pytest.fixture(scope="session")
def chain_keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, str]]:
    """A: the machine that ran first (CI), B: the GPU host that completes."""
    folder = tmp_path_factory.mktemp("chain-keys")
    return {n: _keypair(folder, n) for n in ("A", "B")}


def _run(out: Path, pipe: Path, key: Path, expect: int = 0) -> Path:
    """A signed attempt; `expect`: 0 for the deferred pipeline, 1 when a module is missing."""
    r = imagegate("run", "--here", "-p", str(pipe), "-o", str(out), "--key", str(key), "-q")
    assert r.returncode == expect, r.stdout + r.stderr
    (attempt,) = _attempts(out)
    return attempt


@pytest.fixture(scope="session")
def pristine(tmp_path_factory: pytest.TempPathFactory, chain_keys: dict[str, tuple[Path, Path, str]]) -> Path:
    """A real deferred attempt (CPU_PASS_GPU_ENV_DEFERRED) signed with key A; copied per test."""
    tmp = tmp_path_factory.mktemp("chain")
    return _run(tmp / "out", _pipeline(tmp), chain_keys["A"][0])


@pytest.fixture
def earlier(pristine: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(pristine.parent.parent, out)
    return out / pristine.parent.name / pristine.name


def _tree(out: Path) -> dict[str, str]:
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }


def _complete(attempt: Path, *opts: str) -> Result:
    return imagegate("complete", str(attempt), "--here", *opts)


def _refused_and_nothing_written(r: Result, out: Path, before: dict[str, str]) -> None:
    assert r.returncode == 1, r.stdout + r.stderr
    assert _tree(out) == before  # no new attempt folder, nothing signed, no index line
    assert "Traceback" not in r.stderr


def _forge(attempt: Path, forger: keys.SigningKey) -> None:
    """What an attacker without key A can do to a FAIL: claim every CPU stage passed, keep the
    GPU stage deferred (so it can be completed), re-sign with another key, match statement.json."""
    statement = json.loads((attempt / "statement.json").read_text())
    pred = statement["predicate"]
    assert pred["verdict"] == "FAIL"
    for s in pred["stages"]:
        s["status"] = "DEFERRED" if s["id"] == "gpu_env" else "PASS"
        s["token"] = f"{s['id'].upper()}_{s['status']}"
    pred["verdict"] = "CPU_PASS_GPU_ENV_DEFERRED"
    (attempt / sign.DSSE_FILE).write_bytes(dsse.sign(sign.serialize(statement), forger).to_json())
    (attempt / "statement.json").write_bytes(canonical_json(statement))


def test_complete_refuses_an_attempt_forged_without_the_key(
    tmp_path: Path, chain_keys: dict[str, tuple[Path, Path, str]]
) -> None:
    key_a, _, fp_a = chain_keys["A"]
    pipe = _pipeline(tmp_path)
    pipe.write_text(pipe.read_text().replace("modules: [json]", "modules: [json, imagegate_no_such_module]"))
    out = tmp_path / "out"
    attempt = _run(out, pipe, key_a, expect=1)  # the missing module: FAIL, signed all the same
    _forge(attempt, keys.generate())
    before = _tree(out)
    r = _complete(attempt, "--key", str(key_a))
    _refused_and_nothing_written(r, out, before)
    envelope = attempt / sign.DSSE_FILE
    assert f"{envelope}: attempt {attempt.name} does not verify, so it is not completed" in r.stderr
    assert f"signature: no signature verifies with key {fp_a}" in r.stderr
    assert f"imagegate verify {envelope} --key PUB" in r.stderr and "--trust PUB" in r.stderr


def test_complete_refuses_an_attempt_whose_evidence_was_edited(
    earlier: Path, chain_keys: dict[str, tuple[Path, Path, str]]
) -> None:
    (edited,) = earlier.glob("stages/*-find_spec/result.json")
    edited.write_text(edited.read_text() + " ")
    out = earlier.parent.parent
    before = _tree(out)
    r = _complete(earlier, "--key", str(chain_keys["A"][0]))
    _refused_and_nothing_written(r, out, before)
    rel = edited.relative_to(earlier).as_posix()
    assert f"evidence: {rel}: changed" in r.stderr, r.stderr
    assert "signature:" not in r.stderr.split("hint:")[0]  # the signature held: only the evidence is named


def test_a_chain_signed_on_two_machines_verifies_with_both_keys_naming_each(
    earlier: Path, chain_keys: dict[str, tuple[Path, Path, str]], tmp_path: Path
) -> None:
    (key_a, pub_a, fp_a), (key_b, pub_b, fp_b) = chain_keys["A"], chain_keys["B"]
    out = earlier.parent.parent
    before = _tree(out)
    # B trusts only itself by default: the earlier attempt (signed by A) is refused, named
    r = _complete(earlier, "--key", str(key_b))
    _refused_and_nothing_written(r, out, before)
    assert f"no signature verifies with key {fp_b}:" in r.stderr and "--trust PUB" in r.stderr
    # --trust names the keys trusted, in place of the signing key's own: signing with A and
    # trusting only B, A's attempt is refused, and only B is named as tried
    r = _complete(earlier, "--key", str(key_a), "--trust", str(pub_b))
    _refused_and_nothing_written(r, out, before)
    assert f"no signature verifies with key {fp_b}:" in r.stderr and fp_a not in r.stderr, r.stderr

    done = _complete(earlier, "--key", str(key_b), "--trust", str(pub_a))
    assert done.returncode == 0, done.stderr
    (later,) = [a for a in _attempts(out) if a != earlier]
    link = json.loads((later / "statement.json").read_text())["predicate"]["completes"]
    assert link["verifiedWith"] == fp_a
    att = str(later / sign.DSSE_FILE)

    ok = imagegate("verify", att, "--key", str(pub_a), "--key", str(pub_b))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"ok      signature: verified with key {fp_b}" in ok.stdout
    assert (
        f"ok      link: completes attempt {earlier.name} (verdict CPU_PASS_GPU_ENV_DEFERRED): its signature verified with key {fp_a}"
        in ok.stdout
    )
    both = tmp_path / "trusted.pem"
    both.write_bytes(b"# CI\n" + pub_a.read_bytes() + b"# GPU host\n" + pub_b.read_bytes())
    assert imagegate("verify", att, "--trusted-keys", str(both)).returncode == 0

    only_b = imagegate("verify", att, "--key", str(pub_b))
    assert only_b.returncode == 1
    assert (
        f"FAILED  link: completes attempt {earlier.name}: the earlier attestation does not verify: "
        f"signature: no signature verifies with key {fp_b}" in only_b.stdout
    ), only_b.stdout
    only_a = imagegate("verify", att, "--key", str(pub_a))
    assert only_a.returncode == 1
    assert f"FAILED  signature: no signature verifies with key {fp_a}" in only_a.stdout


def test_a_signing_key_given_twice_is_refused_naming_both(
    earlier: Path, chain_keys: dict[str, tuple[Path, Path, str]], tmp_path: Path
) -> None:
    (key_a, pub_a, _), (key_b, pub_b, _) = chain_keys["A"], chain_keys["B"]
    out = earlier.parent.parent
    before = _tree(out)
    for cmd in (
        ["run", "--here", "-p", str(_pipeline(tmp_path)), "-o", str(out)],
        ["complete", str(earlier), "--here"],
    ):
        r = imagegate(*cmd, "--key", str(key_a), "--key", str(key_b))
        assert r.returncode == 3, r.stdout + r.stderr
        assert f"--key given 2 times ({key_a}, {key_b}): an attempt is signed with one key" in r.stderr
    assert _tree(out) == before
    # verify: --key is repeatable, the keys it trusts (the right one first: not the last kept)
    r = imagegate("verify", str(earlier / sign.DSSE_FILE), "--key", str(pub_a), "--key", str(pub_b))
    assert r.returncode == 0, r.stdout


def _pred(attempt: Path) -> dict[str, Any]:
    return json.loads((attempt / "statement.json").read_text())["predicate"]  # type: ignore[no-any-return]


def test_a_completion_repeats_every_stage_and_a_chain_keeps_where_each_result_came_from(
    earlier: Path, chain_keys: dict[str, tuple[Path, Path, str]]
) -> None:
    """A completion of a completion (still no GPU here): the last statement alone lists every
    stage, with the attempt each result ran in and its facts, and the verdict; verify walks the
    whole chain."""
    key_a, pub_a, fp_a = chain_keys["A"]
    out = earlier.parent.parent
    assert _complete(earlier, "--key", str(key_a)).returncode == 0
    (second,) = [a for a in _attempts(out) if a != earlier]
    r = _complete(second, "--key", str(key_a))
    assert r.returncode == 0, r.stderr
    (third,) = [a for a in _attempts(out) if a not in (earlier, second)]
    first_stages = {s["id"]: s for s in _pred(earlier)["stages"]}
    pred = _pred(third)
    assert pred["verdict"] == "CPU_PASS_GPU_ENV_DEFERRED"
    by_id = {s["id"]: s for s in pred["stages"]}
    assert list(by_id) == list(first_stages)
    assert by_id["find_spec"]["fromAttempt"] == earlier.name  # where it ran, not the middle link
    assert by_id["find_spec"]["facts"] == first_stages["find_spec"]["facts"]
    assert by_id["gpu_env"]["status"] == "DEFERRED" and "fromAttempt" not in by_id["gpu_env"]
    ok = imagegate("verify", str(third / sign.DSSE_FILE), "--key", str(pub_a))
    assert ok.returncode == 0, ok.stdout
    assert (
        f"link: completes attempt {second.name} (verdict CPU_PASS_GPU_ENV_DEFERRED): its signature "
        f"verified with key {fp_a}"
        in ok.stdout
        and f"; completes attempt {earlier.name} (verdict" in ok.stdout
    ), ok.stdout


def test_complete_attach_refuses_an_attempt_of_no_registry_image_before_running(
    earlier: Path, chain_keys: dict[str, tuple[Path, Path, str]]
) -> None:
    """A `run --here` attempt judged an environment, no registry manifest: `complete --attach`
    has nowhere to attach the completion, and says so before anything runs or is written."""
    out = earlier.parent.parent
    before = _tree(out)
    r = _complete(earlier, "--key", str(chain_keys["A"][0]), "--attach")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "--attach" in r.stderr and "no registry image to attach to" in r.stderr
    assert _tree(out) == before
