"""A completion's link, as `verify` checks it (attest/verify.py, check_link): the earlier attempt's
envelope must be the one linked, byte for byte, where it lies beside the completion and in the
copy the completion keeps; it must verify with a trusted key, be the attempt the link names and
be about the same image; an earlier completion's own link is followed from its folder. Real keys
and signatures; the attempts are written as `run` and `complete` lay them out (the envelope, and
the completion's copy of the earlier one), without evidence files: `evidence=False` leaves the
evidence out of the report, the link is checked all the same."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from imagegate.attest import dsse, keys, sign, verify
from imagegate.attest import statement as st
from imagegate.attest.envelopes import MAX_ATTESTATION_BYTES
from imagegate.domain.results import ImageFacts, RunRecord, StageResult, Status

IMAGE, OTHER, CONFIG = "sha256:" + "1" * 64, "sha256:" + "2" * 64, "sha256:" + "3" * 64
DEFERRED = "CPU_PASS_GPU_CLI_DEFERRED"


def _statement(
    attempt_id: str,
    manifest: str | None = IMAGE,
    completes: dict[str, Any] | None = None,
    config: str | None = CONFIG,
    fingerprint: str | None = None,
    host: str = "ci",
) -> dict[str, Any]:
    """An attempt's statement about an image (its manifest, else its config digest), or with
    `fingerprint` about an environment without an image (run --here) on `host`, without GPUs."""
    environment: dict[str, Any] = {"driver": "docker", "engine": "docker", "gpu": {"present": False}}
    if fingerprint is not None:
        manifest = config = None
        environment = {
            "driver": "local",
            "fingerprint": {"sha256": fingerprint},
            "host": host,
            "gpu": {"present": False},
        }
    record = RunRecord(
        attempt_id=attempt_id,
        attempt_dir=attempt_id,
        pipeline={"name": "gpu", "version": "1", "sha256": "a" * 64, "source": "builtin:gpu"},
        plan={"apiVersion": "imagegate/v1", "pipeline": {}, "stages": []},
        image=ImageFacts(
            reference="r/app:1",
            repository="r/app",
            config_digest=config,
            manifest_digest=manifest,
        ),
        environment=environment,
        stages=[
            StageResult("a", "cli", "inside", Status.PASS, "ok", 1.0),
            StageResult("gpu_cli", "cli", "inside", Status.DEFERRED, "no GPU"),
        ],
        started_at="2026-01-01T00:00:00.000Z",
        finished_at="2026-01-01T00:00:01.000Z",
        verdict=DEFERRED,
        imagegate_version="0.1.0",
        completes=completes,
    )
    return st.build_statement(record).to_json()


def _attempt(
    folder: Path,
    key: keys.SigningKey,
    *,
    manifest: str | None = IMAGE,
    config: str = CONFIG,
    fingerprint: str | None = None,
    earlier: Path | None = None,
    named: str = "",
) -> Path:
    """An attempt signed in `folder` (its name the attempt's id); with `earlier`, a completion of
    it: the link names attempt `named` (else the earlier folder's name), the earlier envelope's
    sha256, and the copy is kept in the completion as `complete` keeps it."""
    folder.mkdir(parents=True)
    completes = None
    if earlier is not None:
        (folder / verify.LINK_COPY).parent.mkdir()
        (folder / verify.LINK_COPY).write_bytes((earlier / sign.DSSE_FILE).read_bytes())
        completes = _completes(earlier, key, named)
    sign.sign_attempt(folder, _statement(folder.name, manifest, completes, config, fingerprint), key)
    return folder


def _completes(earlier: Path, key: keys.SigningKey, named: str = "") -> dict[str, Any]:
    """The link `complete` writes: the attempt (`named`, else the earlier folder's name) and the
    sha256 of its envelope."""
    return {
        "attempt": named or earlier.name,
        "envelopeSha256": hashlib.sha256((earlier / sign.DSSE_FILE).read_bytes()).hexdigest(),
        "verdict": DEFERRED,
        "stages": ["gpu_cli"],
        "verifiedWith": key.public.fingerprint,
    }


def _link(completion: Path, *trusted: keys.SigningKey) -> verify.Check:
    rep = verify.verify_file(completion / sign.DSSE_FILE, [k.public for k in trusted], evidence=False)
    (link,) = [c for c in rep.checks if c.name == "link"]
    assert rep.ok == (link.outcome == "ok"), rep.checks  # the link alone decides here
    return link


def _changed(path: Path, first: bool = True) -> None:
    """The envelope's bytes changed, its meaning not (JSON whitespace): only its digest differs,
    and sorts before the linked one (`first`) or after it: a link checked by order, not
    equality, would pass one of them."""
    data = path.read_bytes()
    linked = hashlib.sha256(data).hexdigest()
    for spaces in range(1, 200):
        changed = data.replace(b'"payload"', b'"payload"' + b" " * spaces, 1)
        if (hashlib.sha256(changed).hexdigest() < linked) == first:
            path.write_bytes(changed)
            return
    raise AssertionError("no change found whose digest sorts there")  # 1 in 2 each: never here


@pytest.fixture
def key() -> keys.SigningKey:
    return keys.generate()


def test_the_link_holds_where_the_earlier_envelope_lies_beside_and_in_the_copy(
    tmp_path: Path, key: keys.SigningKey
) -> None:
    earlier = _attempt(tmp_path / "A", key)
    later = _attempt(tmp_path / "B", key, earlier=earlier)
    link = _link(later, key)
    sha = hashlib.sha256((earlier / sign.DSSE_FILE).read_bytes()).hexdigest()
    assert link.outcome == "ok"
    assert link.detail == (
        f"completes attempt A (verdict {DEFERRED}): its signature verified with key "
        f"{key.public.fingerprint}, envelope sha256 {sha[:16]}… as linked, same subject"
    )


@pytest.mark.parametrize("first", [True, False], ids=["sorting-first", "sorting-after"])
@pytest.mark.parametrize("where", ["beside", "copy"])
def test_the_earlier_envelope_changed_beside_or_in_the_copy_fails_the_link(
    tmp_path: Path, key: keys.SigningKey, where: str, first: bool
) -> None:
    earlier = _attempt(tmp_path / "A", key)
    later = _attempt(tmp_path / "B", key, earlier=earlier)
    changed = earlier / sign.DSSE_FILE if where == "beside" else later / verify.LINK_COPY
    linked = hashlib.sha256(changed.read_bytes()).hexdigest()
    _changed(changed, first)
    got = hashlib.sha256(changed.read_bytes()).hexdigest()
    link = _link(later, key)
    assert link.outcome == "failed"
    assert link.detail == (
        f"completes attempt A: {changed} has sha256 {got[:16]}…, the link says {linked[:16]}…: "
        "the earlier attestation was changed after the completion was signed"
    )


def test_either_place_alone_holds_the_link_and_neither_fails_it(tmp_path: Path, key: keys.SigningKey) -> None:
    earlier = _attempt(tmp_path / "runs" / "A", key)
    later = _attempt(tmp_path / "runs" / "B", key, earlier=earlier)
    # the completion copied elsewhere, alone: the copy it keeps is the earlier envelope
    alone = tmp_path / "elsewhere" / "B"
    shutil.copytree(later, alone)
    assert _link(alone, key).outcome == "ok"
    # the copy gone, the earlier attempt beside: the envelope beside is read
    (later / verify.LINK_COPY).unlink()
    assert _link(later, key).outcome == "ok"
    # neither: the link cannot be checked, and fails, naming both places
    (alone / verify.LINK_COPY).unlink()
    link = _link(alone, key)
    assert link.outcome == "failed"
    assert link.detail == f"completes attempt A: its envelope is neither beside nor in {verify.LINK_COPY}"


def test_a_link_to_another_image_attempt_or_key_fails(tmp_path: Path, key: keys.SigningKey) -> None:
    # the earlier attempt judged another image: signed, linked, but not this completion's subject
    other_image = _attempt(tmp_path / "1" / "A", key, manifest=OTHER)
    link = _link(_attempt(tmp_path / "1" / "B", key, earlier=other_image), key)
    assert link.outcome == "failed"
    then, now = (f'[{{"digest": {{"sha256": "{d[7:]}"}}, "name": "r/app"}}]' for d in (OTHER, IMAGE))
    assert link.detail == f"completes attempt A, about another subject: {then} then, {now} now"
    # the same for an image judged by its config digest (never pushed): another build then
    other_build = _attempt(tmp_path / "0" / "A", key, manifest=None, config=OTHER)
    link = _link(_attempt(tmp_path / "0" / "B", key, manifest=None, earlier=other_build), key)
    then, now = (
        json.dumps(_statement("A", None, config=c)["subject"], sort_keys=True) for c in (OTHER, CONFIG)
    )
    assert link.detail == f"completes attempt A, about another subject: {then} then, {now} now"
    # the earlier statement's JSON in another key order (another writer's): the same subject
    earlier = tmp_path / "4" / "A"
    earlier.mkdir(parents=True)
    unsorted = json.dumps(_statement("A"), sort_keys=False).encode()
    assert unsorted != sign.serialize(_statement("A"))  # the subject's name before its digest
    (earlier / sign.DSSE_FILE).write_bytes(dsse.sign(unsorted, key).to_json())
    assert _link(_attempt(tmp_path / "4" / "B", key, earlier=earlier), key).outcome == "ok"
    # the link names attempt C; the envelope it links (the copy: nothing named C lies beside) is A
    link = _link(
        _attempt(tmp_path / "2" / "B", key, earlier=_attempt(tmp_path / "2" / "A", key), named="C"), key
    )
    assert link.detail == "the link names attempt C, the linked envelope is attempt A"
    # the earlier attempt signed with a key not trusted: refused, then trusted both ways round
    other_key = keys.generate()
    later = _attempt(tmp_path / "3" / "B", key, earlier=_attempt(tmp_path / "3" / "A", other_key))
    link = _link(later, key)
    assert link.detail == (
        "completes attempt A: the earlier attestation does not verify: signature: no signature "
        f"verifies with key {key.public.fingerprint}: signed with another key, or the attestation "
        "was changed after signing"
    )
    for trusted in ((key, other_key), (other_key, key)):
        link = _link(later, *trusted)
        assert link.outcome == "ok" and f"verified with key {other_key.public.fingerprint}," in link.detail


def test_a_link_to_another_environment_fails_and_to_the_same_one_elsewhere_holds(
    tmp_path: Path, key: keys.SigningKey
) -> None:
    """run --here judges an environment: a completion is about the same one when the fingerprint
    (the interpreter and its distributions) is the same, whatever else the host records."""
    earlier = _attempt(tmp_path / "1" / "A", key, fingerprint="e" * 64)
    link = _link(_attempt(tmp_path / "1" / "B", key, fingerprint="f" * 64, earlier=earlier), key)
    assert (
        link.detail
        == f"completes attempt A, about another environment fingerprint: {'e' * 64} then, {'f' * 64} now"
    )
    earlier = _attempt(tmp_path / "2" / "A", key, fingerprint="e" * 64)
    later = tmp_path / "2" / "B"
    # another machine (another host, so another subject digest), the same environment
    statement = _statement("B", fingerprint="e" * 64, completes=_completes(earlier, key), host="gpu")
    later.mkdir()
    (later / verify.LINK_COPY).parent.mkdir()
    (later / verify.LINK_COPY).write_bytes((earlier / sign.DSSE_FILE).read_bytes())
    sign.sign_attempt(later, statement, key)
    link = _link(later, key)
    assert link.outcome == "ok" and link.detail.endswith("same environment fingerprint"), link.detail


def test_an_earlier_envelope_that_cannot_be_read_or_is_not_an_attestation_fails_the_link(
    tmp_path: Path, key: keys.SigningKey
) -> None:
    # signed with the trusted key, but not as an in-toto statement: it does not verify
    earlier = tmp_path / "1" / "A"
    earlier.mkdir(parents=True)
    envelope = dsse.sign(sign.serialize(_statement("A")), key, "application/json")
    (earlier / sign.DSSE_FILE).write_bytes(envelope.to_json())
    link = _link(_attempt(tmp_path / "1" / "B", key, earlier=earlier), key)
    assert link.detail == (
        "completes attempt A: the earlier attestation does not verify: payloadType: is "
        "'application/json', expected 'application/vnd.in-toto+json'"
    )
    # the bytes linked are not an envelope at all
    earlier = tmp_path / "3" / "A"
    earlier.mkdir(parents=True)
    (earlier / sign.DSSE_FILE).write_bytes(b"not an envelope")
    link = _link(_attempt(tmp_path / "3" / "B", key, earlier=earlier), key)
    assert link.detail.startswith(
        f"completes attempt A: the earlier envelope is unreadable ({earlier / sign.DSSE_FILE}: not a DSSE envelope"
    ), link.detail
    # the envelope beside is larger than any attestation read: refused, named, never read whole
    earlier = _attempt(tmp_path / "2" / "A", key)
    later = _attempt(tmp_path / "2" / "B", key, earlier=earlier)
    beside = earlier / sign.DSSE_FILE
    with beside.open("ab") as f:
        f.truncate(MAX_ATTESTATION_BYTES + 1)
    link = _link(later, key)
    assert link.outcome == "failed"
    assert link.detail.startswith(f"completes attempt A: attestation {beside}: cannot read it: "), link.detail


@pytest.mark.parametrize("named", ["sub/A", "..", "."])
def test_an_attempt_named_as_a_path_is_not_looked_for_beside(
    tmp_path: Path, key: keys.SigningKey, named: str
) -> None:
    """A link's attempt is a folder name: one that is a path (or . or ..) is not followed out of
    the completion's folder; the copy alone is read (and names another attempt)."""
    earlier = _attempt(tmp_path / "A", key)
    later = _attempt(tmp_path / "runs" / "B", key, earlier=earlier, named=named)
    # an envelope where the path would lead: never read (its sha256 is not the link's)
    decoy = tmp_path / "runs" / named / sign.DSSE_FILE
    decoy.parent.mkdir(parents=True, exist_ok=True)
    decoy.write_bytes(b"{}")
    link = _link(later, key)
    assert link.detail == f"the link names attempt {named}, the linked envelope is attempt A", link.detail


def test_a_chain_is_followed_through_each_folder_and_says_where_it_stops(
    tmp_path: Path, key: keys.SigningKey
) -> None:
    first = _attempt(tmp_path / "runs" / "A", key)
    # the middle attempt's id sorts after the last one's: ids are times, and two machines' clocks differ
    second = _attempt(tmp_path / "runs" / "Z", key, earlier=first)
    third = _attempt(tmp_path / "runs" / "C", key, earlier=second)
    link = _link(third, key)
    assert link.outcome == "ok" and "not checked" not in link.detail, link.detail
    assert (
        link.detail.startswith("completes attempt Z (verdict")
        and "; completes attempt A (verdict" in link.detail
    )
    # the first attempt changed: the second link fails, named after the first that held
    _changed(first / sign.DSSE_FILE)
    link = _link(third, key)
    assert link.outcome == "failed"
    held, failed = link.detail.split("; ")
    assert held.startswith("completes attempt Z (verdict") and held.endswith("same subject")
    assert failed.startswith(f"completes attempt A: {first / sign.DSSE_FILE} has sha256 "), failed
    # the last completion alone: its own link holds through the copy; the earlier one's is not checked
    alone = tmp_path / "elsewhere" / "C"
    shutil.copytree(third, alone)
    link = _link(alone, key)
    assert link.outcome == "ok"
    assert link.detail.endswith("; its own link to attempt A not checked: its folder is not here"), (
        link.detail
    )
