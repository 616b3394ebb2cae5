"""`run --reuse`: a run whose image digest, plan, probes bundle, imagegate version, driver and
inputs equal an earlier attempt's, signed with this run's key, answers from it: a new attempt
linking it, its evidence verified again and its times kept; never for an edited attempt, another
key, other options, an ERROR, an old attempt, a plan whose answer changes with time. A real engine,
real images, real keys."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from imagegate.attest import dsse, keys
from imagegate.usecases import reuse_attempt as reuse
from imagegate.usecases import runner
from tests.cli.test_startup import forbidden_imports
from tests.helpers import Result, imagegate

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def key_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    folder = tmp_path_factory.mktemp("reuse-keys")
    return {n: keys.write_keypair(folder / n, keys.generate(), None) for n in ("A", "B")}


def _run(image: str, out: Path, key: Path, *args: str) -> Result:
    return imagegate("run", image, "-p", "python", "-o", str(out), "--key", str(key), *args)


def _attempts(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("sha256-*/*") if p.is_dir())


def _statement(attempt: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((attempt / "statement.json").read_text())
    return doc


def test_a_repeated_run_answers_from_the_earlier_attempt_linked(
    own_image: str, tmp_path: Path, key_files: dict[str, tuple[Path, Path]]
) -> None:
    key, pub = key_files["A"]
    out = tmp_path / "runs"
    first = _run(own_image, out, key, "-m", "json", "-q")
    assert first.returncode == 0, first.stderr
    (earlier,) = _attempts(out)
    r = _run(own_image, out, key, "-m", "json", "--reuse")
    assert r.returncode == 0, r.stderr
    assert f"reused attempt {earlier.name}: verified with this run's key" in r.stderr
    (new,) = [a for a in _attempts(out) if a != earlier]
    was, now = _statement(earlier)["predicate"], _statement(new)["predicate"]
    link = now["reuses"]
    assert link["attempt"] == earlier.name and link["envelope"] == "reuses/attestation.dsse.json"
    assert (new / "reuses/attestation.dsse.json").read_bytes() == (
        earlier / "attestation.dsse.json"
    ).read_bytes()
    # The word and its times are the earlier run's: a reuse never makes a verdict newer.
    assert (now["verdict"], now["startedOn"], now["finishedOn"]) == (
        was["verdict"],
        was["startedOn"],
        was["finishedOn"],
    )
    assert [(s["id"], s["status"], s["fromAttempt"]) for s in now["stages"]] == [
        (s["id"], s["status"], earlier.name) for s in was["stages"]
    ]
    stdout = next(f["path"] for s in now["stages"] for f in s["evidence"] if f["path"].endswith("stdout.txt"))
    assert (new / stdout).read_bytes() == (earlier / stdout).read_bytes()
    v = imagegate("verify", str(new / "attestation.dsse.json"), "--key", str(pub))
    assert v.returncode == 0, v.stdout + v.stderr
    assert f"ok      link: reuses attempt {earlier.name} (verdict PASS" in v.stdout

    # A reuse is never reused: the attempt that ran answers again, and nothing else was looked at.
    again = _run(own_image, out, key, "-m", "json", "--reuse")
    assert f"reused attempt {earlier.name}" in again.stderr and "not reused" not in again.stderr


def test_a_reuse_imports_no_docker_sdk(
    own_image: str, tmp_path: Path, key_files: dict[str, tuple[Path, Path]]
) -> None:
    """The SDK (and requests) take longer to import than a reuse takes to answer: the engine's
    inspect and /version are read without it; a run that starts containers still loads it."""
    key, _ = key_files["A"]
    args = ["run", own_image, "-p", "python", "-o", str(tmp_path / "runs"), "--key", str(key), "-q"]
    sdk = ("docker", "requests", "urllib3")
    assert forbidden_imports(args, tmp_path, forbidden=sdk) == (0, ["docker", "requests", "urllib3"])
    assert forbidden_imports([*args, "--reuse"], tmp_path, forbidden=sdk) == (0, [])


def test_a_reuse_that_claims_another_time_or_copy_does_not_verify(
    own_image: str, tmp_path: Path, key_files: dict[str, tuple[Path, Path]]
) -> None:
    key, pub = key_files["A"]
    out = tmp_path / "runs"
    assert _run(own_image, out, key, "-q").returncode == 0
    assert _run(own_image, out, key, "--reuse", "-q").returncode == 0
    new = next(a for a in _attempts(out) if "reuses" in _statement(a)["predicate"])
    signer = keys.load_signing_key(key)
    # Signed by the same key, but newer than the run it carries: the link says so.
    doc = _statement(new)
    doc["predicate"]["finishedOn"] = "2099-01-01T00:00:00.000Z"
    payload = json.dumps(doc).encode()
    (new / "statement.json").write_bytes(payload)
    (new / "attestation.dsse.json").write_bytes(dsse.sign(payload, signer).to_json())
    v = imagegate("verify", str(new / "attestation.dsse.json"), "--key", str(pub))
    assert v.returncode == 1
    assert "FAILED  link: reuses attempt" in v.stdout or "failed  link: reuses attempt" in v.stdout.lower()
    assert "says another verdict, time or stage result than it" in v.stdout
    # The copy of the reused envelope edited: its sha256 is not the linked one.
    copy = new / "reuses/attestation.dsse.json"
    copy.write_bytes(copy.read_bytes() + b" ")
    v = imagegate("verify", str(new / "attestation.dsse.json"), "--key", str(pub))
    assert v.returncode == 1 and "the link says" in v.stdout


def test_an_edited_old_or_foreign_attempt_is_never_reused(
    images: dict[str, str], own_image: str, tmp_path: Path, key_files: dict[str, tuple[Path, Path]]
) -> None:
    (key, _), (other, _) = key_files["A"], key_files["B"]
    out = tmp_path / "runs"
    assert _run(own_image, out, key, "-q").returncode == 0
    (earlier,) = _attempts(out)

    def not_reused(r: Result, why: str) -> None:
        assert r.returncode == 0, r.stderr
        assert "reused attempt" not in r.stderr
        assert f"--reuse: not reused: {earlier.name}: {why}" in r.stderr, r.stderr
        newest = _attempts(out)[-1]
        assert "reuses" not in _statement(newest)["predicate"]  # it ran

    not_reused(_run(own_image, out, other, "--reuse"), "does not verify with this run's key")
    undecided = tmp_path / "undecided"  # an ERROR is never an answer: the run runs again
    assert _run(images["nopython"], undecided, key, "-q").returncode == 2
    r = _run(images["nopython"], undecided, key, "--reuse")
    assert r.returncode == 2
    assert "its verdict is ERROR: the run could not decide, so it runs again" in r.stderr
    not_reused(_run(own_image, out, key, "--reuse", "-m", "json"), "another plan")
    stdout = next(earlier.glob("stages/*/stdout.txt"))
    kept = stdout.read_bytes()
    stdout.write_bytes(kept + b"edited\n")
    not_reused(_run(own_image, out, key, "--reuse"), "does not verify with this run's key")
    for attempt in _attempts(out)[1:]:  # the runs just made would answer the next one
        (attempt / "attestation.dsse.json").unlink()
    stdout.write_bytes(kept)
    time.sleep(2.1)
    not_reused(
        _run(own_image, out, key, "--reuse", "--reuse-within", "2s"),
        "finished 0.0 h ago, past --reuse-within",
    )


def test_reuse_needs_this_runs_own_key_and_a_plan_that_does_not_change_with_time(tmp_path: Path) -> None:
    r = imagegate("run", "img:1", "-p", "python", "--reuse", "--no-sign", "-o", str(tmp_path))
    assert r.returncode == 3
    assert (
        "--reuse answers from an attempt signed with this run's key, and this run has none (--no-sign)"
        in r.stderr
    )
    db = tmp_path / "advisories"
    db.mkdir()
    prep = runner.prepare(runner.RunOptions(pipeline="python", advisory_db=db))
    assert "the vulnerability audit answers as advisories are published" in (reuse.never(prep) or "")
    assert reuse.never(runner.prepare(runner.RunOptions(pipeline="python"))) is None
    gpu = runner.prepare(runner.RunOptions(pipeline="python", gpus="all"))
    assert "the GPU node check judges the node as it is now" in (reuse.never(gpu) or "")
