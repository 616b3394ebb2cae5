"""`verify` of a reuse (`run --reuse`) checks its link to the attempt it carries: the copy kept in
`reuses/` is the envelope the link names by sha256, it verifies with a trusted key, it is that
attempt, about the same image, and it says the same verdict, times and stage results. Each case
below is a reuse of a real run, edited as an attacker holding the signing key of a CI would (the
statement signed again), or as one who may only edit files."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from imagegate.attest import dsse, keys
from imagegate.attest import verify as verifying
from tests.helpers import imagegate

pytestmark = pytest.mark.engine
COPY = "reuses/attestation.dsse.json"


@pytest.fixture(scope="module")
def made(own_image: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the reuse attempt, the attempt it reuses, the key's prefix): a real run and its reuse."""
    folder = tmp_path_factory.mktemp("reuse-link")
    keys.write_keypair(folder / "a", keys.generate(), None)
    keys.write_keypair(folder / "b", keys.generate(), None)
    out = folder / "runs"
    for extra in ((), ("--reuse",)):
        r = imagegate(
            "run",
            own_image,
            "-p",
            "python",
            "-o",
            str(out),
            "--key",
            str(folder / "a.key"),
            "-q",
            *extra,
        )
        assert r.returncode == 0, r.stderr
    earlier, reuse = sorted(p for p in out.glob("sha256-*/*") if p.is_dir())
    return reuse, earlier, folder


@pytest.fixture
def reuse(made: tuple[Path, Path, Path], tmp_path: Path) -> Path:
    """A copy of the reuse attempt's image folder (its attempt beside it), to edit."""
    src, _, _ = made
    shutil.copytree(src.parent, tmp_path / "img")
    return tmp_path / "img" / src.name


def _link(attempt: Path, made: tuple[Path, Path, Path]) -> verifying.Check:
    rep = verifying.verify_file(attempt / "attestation.dsse.json", [keys.load_public_key(made[2] / "a.pub")])
    (link,) = [c for c in rep.checks if c.name == "link"]
    return link


def _resign(attempt: Path, made: tuple[Path, Path, Path], edit: Callable[[dict[str, Any]], None]) -> None:
    """The reuse's statement edited and signed again with the same key (statement.json with it)."""
    doc = json.loads((attempt / "statement.json").read_text())
    edit(doc)
    payload = json.dumps(doc).encode()
    (attempt / "statement.json").write_bytes(payload)
    key = keys.load_signing_key(made[2] / "a.key")
    (attempt / "attestation.dsse.json").write_bytes(dsse.sign(payload, key).to_json())


def test_the_link_of_a_reuse_holds_and_names_what_it_checked(
    reuse: Path, made: tuple[Path, Path, Path]
) -> None:
    link = _link(reuse, made)
    want = hashlib.sha256((reuse / COPY).read_bytes()).hexdigest()
    assert link.ok, link.detail
    assert link.detail.startswith(f"reuses attempt {made[1].name} (verdict PASS, finished ")
    assert (
        f"envelope sha256 {want[:16]}… as linked, the same subject, verdict, times and stage results"
        in link.detail
    )


def test_a_copy_that_is_gone_or_not_the_linked_one_fails(reuse: Path, made: tuple[Path, Path, Path]) -> None:
    copy = reuse / COPY
    data = copy.read_bytes()
    want = hashlib.sha256(data).hexdigest()
    # Whitespace keeps the envelope valid and verifying: only the sha256 tells it from the linked one.
    # One edit whose digest sorts above the linked one's, one below.
    edits = [data + b" " * k for k in range(1, 64)]
    above = next(e for e in edits if hashlib.sha256(e).hexdigest() > want)
    below = next(e for e in edits if hashlib.sha256(e).hexdigest() < want)
    for edited in (above, below):
        copy.write_bytes(edited)
        got = hashlib.sha256(edited).hexdigest()
        link = _link(reuse, made)
        assert not link.ok
        assert (
            link.detail
            == f"reuses attempt {made[1].name}: {copy} has sha256 {got[:16]}…, the link says {want[:16]}…"
        )
    copy.unlink()
    link = _link(reuse, made)
    assert (
        not link.ok
        and link.detail.startswith(f"reuses attempt {made[1].name}: ")
        and str(copy) in link.detail
    )


def test_a_linked_envelope_another_key_signed_fails(reuse: Path, made: tuple[Path, Path, Path]) -> None:
    copy = reuse / COPY
    env = dsse.from_json(copy.read_bytes())
    forged = dsse.sign(env.payload, keys.load_signing_key(made[2] / "b.key")).to_json()
    copy.write_bytes(forged)

    def relink(doc: dict[str, Any]) -> None:
        doc["predicate"]["reuses"]["envelopeSha256"] = hashlib.sha256(forged).hexdigest()

    _resign(reuse, made, relink)
    link = _link(reuse, made)
    assert not link.ok
    assert link.detail.startswith(f"reuses attempt {made[1].name}: it does not verify: signature: ")


@pytest.mark.parametrize("other", ["00000000T000000.000Z-000000", "99999999T999999.999Z-ffffff"])
def test_a_link_naming_another_attempt_fails(reuse: Path, made: tuple[Path, Path, Path], other: str) -> None:
    _resign(reuse, made, lambda doc: doc["predicate"]["reuses"].update(attempt=other))
    link = _link(reuse, made)
    assert not link.ok and link.detail == f"the link names attempt {other}, the linked envelope is another"


@pytest.mark.parametrize("digest", ["0" * 64, "f" * 64])
def test_a_reuse_about_another_image_fails(reuse: Path, made: tuple[Path, Path, Path], digest: str) -> None:
    _resign(reuse, made, lambda doc: doc["subject"][0]["digest"].update(sha256=digest))
    link = _link(reuse, made)
    assert not link.ok and link.detail == f"reuses attempt {made[1].name}, about another image"


@pytest.mark.parametrize("when", ["2000-01-01T00:00:00.000Z", "2099-01-01T00:00:00.000Z"])
def test_a_reuse_saying_another_time_fails(reuse: Path, made: tuple[Path, Path, Path], when: str) -> None:
    _resign(reuse, made, lambda doc: doc["predicate"].update(finishedOn=when))
    link = _link(reuse, made)
    assert not link.ok
    assert (
        link.detail
        == f"reuses attempt {made[1].name}, but says another verdict, time or stage result than it"
    )
