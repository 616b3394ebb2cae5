"""`imagegate complete` runs against the image or environment the earlier attempt judged, and
refuses (exit 3) any other, naming both (complete.check_same_subject): the image ID always, the
manifest digest where both runs know one, for `run --here` the environment's fingerprint. The
earlier attempt is given as `complete` holds it once it verified (its signed statement); what is
found now, as the driver reports it. tests/run/test_gpu.py runs the same through the CLI.

A completion then speaks about the subject the earlier attempt signed (complete.completion_subject):
the engine's registry digests change beside the run (the image pushed since, or loaded by ID only),
and a completion about another subject does not link to the attempt it completes; the last test
pushes an image between `run` and `complete` in the real engine and registry."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from imagegate.domain.results import ImageFacts
from imagegate.errors import UsageError
from imagegate.usecases.complete import Earlier, check_same_subject, completion_subject
from tests.helpers import image_of_its_own, imagegate
from tests.oci.infra import start_registry

CONFIG, OTHER_CONFIG = "sha256:" + "c" * 64, "sha256:" + "d" * 64
MANIFEST, OTHER_MANIFEST = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def _earlier(image: dict[str, Any] | None = None, fingerprint: str | None = None) -> Earlier:
    predicate: dict[str, Any] = {"attempt": {"id": "A"}, "image": image or {}}
    if fingerprint is not None:
        predicate["environment"] = {"fingerprint": {"sha256": fingerprint}}
    return Earlier(Path("A"), {"predicate": predicate}, b"", "sha256:" + "0" * 64)


def _now(config: str | None = CONFIG, manifest: str | None = None) -> ImageFacts:
    return ImageFacts("r/app:1", config, manifest)


def test_the_same_image_by_its_id_and_digest_is_completed() -> None:
    pulled = _earlier({"configDigest": CONFIG, "manifestDigest": MANIFEST})
    check_same_subject(pulled, _now(manifest=MANIFEST), None)
    # found now only in the engine, without its registry digest: the image ID decides
    check_same_subject(pulled, _now(manifest=None), None)
    # judged before it was pushed (no digest then), pushed since: the image ID decides
    check_same_subject(_earlier({"configDigest": CONFIG}), _now(manifest=MANIFEST), None)


@pytest.mark.parametrize(
    ("what", "then", "now"),
    [
        ("image ID", CONFIG, OTHER_CONFIG),
        ("image ID", OTHER_CONFIG, CONFIG),
        ("digest", MANIFEST, OTHER_MANIFEST),
        ("digest", OTHER_MANIFEST, MANIFEST),
    ],
)
def test_another_image_is_refused_naming_both(what: str, then: str, now: str) -> None:
    """Another build (image ID), or the same name now on another manifest (digest); either
    sorting before or after the one judged."""
    if what == "image ID":
        earlier, found = _earlier({"configDigest": then, "manifestDigest": MANIFEST}), _now(now, MANIFEST)
    else:
        earlier, found = _earlier({"configDigest": CONFIG, "manifestDigest": then}), _now(CONFIG, now)
    with pytest.raises(UsageError) as e:
        check_same_subject(earlier, found, None)
    assert str(e.value) == f"r/app:1: {what} {now} is not the {what} {then} that attempt A judged"


@pytest.mark.parametrize(("then", "now"), [("e" * 64, "f" * 64), ("f" * 64, "e" * 64)])
def test_another_environment_is_refused_naming_both_fingerprints(then: str, now: str) -> None:
    earlier = _earlier(fingerprint=then)
    check_same_subject(earlier, _now(config=None), then)
    with pytest.raises(UsageError) as e:
        check_same_subject(earlier, _now(config=None), now)
    assert str(e.value).startswith(
        f"this environment (fingerprint sha256:{now}) is not the one attempt A judged (fingerprint sha256:{then})"
    )


def test_a_completion_keeps_the_subject_the_attempt_signed() -> None:
    # judged before it was pushed, pushed since: still the image ID, by the name given then
    local = _earlier({"reference": "app:1", "configDigest": CONFIG})
    pushed = ImageFacts(
        "app:1",
        CONFIG,
        MANIFEST,
        ("127.0.0.1:5000/team/app@" + MANIFEST,),
        repository="127.0.0.1:5000/team/app",
    )
    got = completion_subject(local, pushed)
    assert (got.manifest_digest, got.repository, got.config_digest) == (None, None, CONFIG)
    assert got.repo_digests == pushed.repo_digests  # what the engine knows now stays a fact
    # judged as pulled, known here by its ID only (loaded from a tar): the digest then, said so
    pulled = _earlier(
        {"reference": "r/app:1", "configDigest": CONFIG, "manifestDigest": MANIFEST, "repository": "r/app"}
    )
    got = completion_subject(pulled, _now(manifest=None))
    assert (got.manifest_digest, got.repository) == (MANIFEST, "r/app")
    assert got.subject_note is not None and "attempt A found it" in got.subject_note
    # the same digest then and now: nothing added
    got = completion_subject(pulled, ImageFacts("r/app:1", CONFIG, MANIFEST, repository="r/app"))
    assert (got.manifest_digest, got.repository, got.subject_note) == (MANIFEST, "r/app", None)
    # an environment (--here) has no image ID: as found
    here = ImageFacts("local", None)
    assert completion_subject(_earlier(fingerprint="e" * 64), here) is here


def _signed_statement(attempt: Path) -> dict[str, Any]:
    envelope = json.loads((attempt / "attestation.dsse.json").read_text())
    return json.loads(base64.b64decode(envelope["payload"]))  # type: ignore[no-any-return]


@pytest.mark.engine
def test_an_image_pushed_between_run_and_complete_is_completed_about_the_same_subject(
    images: dict[str, str], tmp_path: Path
) -> None:
    """An image of this test's own (a label on the python image), run before any registry knew
    it, then pushed: the engine now lists a registry digest for it. The completion names the
    subject the attempt signed, and verify follows its link."""
    tag = image_of_its_own(images["python"], "imagegate-test/complete-subject", tmp_path)
    registry = start_registry(tmp_path / "registry")
    pushed = f"{registry.host}/team/subject:{tag.rpartition(':')[2]}"
    try:
        assert imagegate("keygen", "--out", str(tmp_path / "k")).returncode == 0
        out = tmp_path / "out"
        skip = ("--skip", "pip_check", "--skip", "find_spec")  # what a completion then runs
        first = imagegate(
            "run", tag, "-p", "python", "-m", "json", *skip, "-o", str(out), "--key", str(tmp_path / "k.key")
        )
        assert first.returncode == 1, first.stdout + first.stderr  # no level yet
        (earlier,) = [p.parent for p in out.glob("*/*/statement.json")]
        subprocess.run(["docker", "tag", tag, pushed], check=True)
        subprocess.run(["docker", "push", "-q", pushed], check=True, capture_output=True)
        done = imagegate("complete", str(earlier), "--key", str(tmp_path / "k.key"))
        assert done.returncode == 0, done.stdout + done.stderr
        (later,) = [p.parent for p in out.glob("*/*/statement.json") if p.parent != earlier]
        then, now = _signed_statement(earlier), _signed_statement(later)
        assert now["subject"] == then["subject"]
        assert now["predicate"]["image"]["subjectDigest"] == "config"
        assert now["predicate"]["verdict"] == "PASS", now["predicate"]["verdict"]
        assert any(
            d.startswith(f"{registry.host}/team/subject@") for d in now["predicate"]["image"]["repoDigests"]
        )
        r = imagegate("verify", str(later / "attestation.dsse.json"), "--key", str(tmp_path / "k.pub"))
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"link: completes attempt {earlier.name}" in r.stdout, r.stdout
    finally:
        subprocess.run(["docker", "rmi", tag, pushed], capture_output=True)
        registry.stop()
