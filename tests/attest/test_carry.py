"""`compare OFFICIAL MIRROR --attest KEY --carry ACCEPTANCE`: the acceptance carried over must
verify with a trusted key for the official manifest digest just compared and accept the image
(attest/mirror.py, verified_acceptance). Real keys and signatures, no registry: the digest is
given as compare gives it; tests/oci/test_mirror_attest.py runs the same through real registries."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagegate.attest import keys, mirror, sign
from imagegate.errors import UsageError
from tests.attest.test_link import IMAGE, OTHER, _statement


def _acceptance(folder: Path, key: keys.SigningKey, verdict: str) -> Path:
    statement = _statement(folder.name)
    for stage in statement["predicate"]["stages"]:  # every stage ran and passed, whatever was said
        stage["status"] = "PASS"
    statement["predicate"]["verdict"] = verdict
    folder.mkdir()
    return sign.sign_attempt(folder, statement, key).files[0]


def test_an_acceptance_is_carried_only_for_the_digest_compared_signed_by_a_trusted_key(
    tmp_path: Path,
) -> None:
    key, other_key = keys.generate(), keys.generate()
    path = _acceptance(tmp_path / "A", key, "PASS")
    statement, name, data = mirror.verified_acceptance(path, (key.public,), IMAGE)
    assert (statement["predicate"]["verdict"], name, data) == ("PASS", path.name, path.read_bytes())
    # trusted among others: carried
    assert mirror.verified_acceptance(path, (other_key.public, key.public), IMAGE)[2] == path.read_bytes()
    # the official image compared is another one: its digest is not the acceptance's subject
    with pytest.raises(UsageError) as e:
        mirror.verified_acceptance(path, (key.public,), OTHER)
    assert str(e.value).startswith(
        f"--carry {path}: does not verify for the official image: subject: subject "
    )
    assert "signature" not in str(e.value)
    # signed by a key not trusted
    with pytest.raises(UsageError) as e:
        mirror.verified_acceptance(path, (other_key.public,), IMAGE)
    assert str(e.value) == (
        f"--carry {path}: does not verify for the official image: signature: no signature verifies "
        f"with key {other_key.public.fingerprint}: signed with another key, or the attestation was "
        "changed after signing"
    )
    assert e.value.hint == "carry the official image's own signed acceptance, with --trust its key"


@pytest.mark.parametrize("verdict", ["FAIL", "ERROR"])
def test_an_acceptance_that_does_not_accept_the_image_is_not_carried(tmp_path: Path, verdict: str) -> None:
    key = keys.generate()
    path = _acceptance(tmp_path / "A", key, verdict)
    with pytest.raises(UsageError) as e:
        mirror.verified_acceptance(path, (key.public,), IMAGE)
    assert str(e.value) == f"--carry {path}: verdict {verdict} does not accept the image: nothing to carry"


def test_an_acceptance_is_carried_without_the_evidence_folder_it_was_signed_in(tmp_path: Path) -> None:
    """The acceptance carried is often the one file fetched from the official image's referrers:
    its signature and subject vouch for it, the run's evidence files are not at hand."""
    key = keys.generate()
    statement = _statement("A")
    for stage in statement["predicate"]["stages"]:
        stage["status"] = "PASS"
    statement["predicate"]["verdict"] = "PASS"
    statement["predicate"]["evidence"] = [{"path": "run.json", "sha256": "0" * 64}]
    (tmp_path / "A").mkdir()
    signed = sign.sign_attempt(tmp_path / "A", statement, key).files[0]
    alone = tmp_path / "fetched" / signed.name
    alone.parent.mkdir()
    alone.write_bytes(signed.read_bytes())
    carried, name, data = mirror.verified_acceptance(alone, (key.public,), IMAGE)
    assert (carried["predicate"]["evidence"], name, data) == (
        [{"path": "run.json", "sha256": "0" * 64}],
        signed.name,
        signed.read_bytes(),
    )
