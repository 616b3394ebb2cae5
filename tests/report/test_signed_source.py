"""`imagegate report` renders the statement as signed, never the editable statement.json: every
format says whether the signature was checked, and flags an edited statement.json or evidence
file, or an attempt that was never signed; the exit code says so too."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest

from imagegate.attest import keys
from imagegate.attest.sign import DSSE_FILE
from tests.helpers import Result, imagegate
from tests.report.test_junit import validate

FORMATS = ["table", "json", "junit", "markdown", "html", "github"]
DIFFERS = "STATEMENT.JSON DIFFERS from the signed statement"
UNSIGNED = "UNSIGNED: the attempt has no attestation"


def _run(out: Path, *sign: str, module: str = "json", code: int = 0) -> Path:
    r = imagegate(
        "run", "--here", "--python", sys.executable, "-p", "python", "-m", module, "-o", str(out), "-q",
        *sign,
    )  # fmt: skip
    assert r.returncode == code, r.stderr
    (attempt,) = [p.parent for p in out.glob("*/*/statement.json")]
    return attempt


@pytest.fixture(scope="module")
def keypair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return keys.write_keypair(tmp_path_factory.mktemp("keys") / "gate", keys.generate(), None)


@pytest.fixture(scope="module")
def signed_run(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> Path:
    # FAIL: find_spec finds no such module.
    return _run(
        tmp_path_factory.mktemp("signed"), "--key", str(keypair[0]), module="no_such_module_zz", code=1
    )


@pytest.fixture(scope="module")
def unsigned_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("unsigned"), "--no-sign")


@pytest.fixture
def signed(signed_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(signed_run, tmp_path / "attempt"))


def report(attempt: Path, fmt: str, *args: str) -> Result:
    return imagegate("report", str(attempt), "-f", fmt, *args)


def _edit_to_pass(attempt: Path) -> None:
    """What an attacker with write access to the folder does: the verdict and the stages say PASS."""
    path = attempt / "statement.json"
    statement = json.loads(path.read_text())
    statement["predicate"]["verdict"] = "PASS"
    for stage in statement["predicate"]["stages"]:
        stage["status"], stage["detail"] = "PASS", "forged"
    path.write_text(json.dumps(statement, indent=2, sort_keys=True) + "\n")


def test_an_edited_statement_is_flagged_in_every_format_and_fails(
    signed: Path, keypair: tuple[Path, Path]
) -> None:
    signed_statement = (signed / "statement.json").read_text()
    _edit_to_pass(signed)
    for fmt in FORMATS:
        r = report(signed, fmt, "--key", str(keypair[1]))
        assert r.returncode == 1, (fmt, r.stdout, r.stderr)
        shown = r.stderr if fmt == "json" else r.stdout
        assert DIFFERS in shown, (fmt, shown)
        assert "forged" not in r.stdout, fmt  # what is shown is what was signed
        assert f"signature verified with key {keys.load_public_key(keypair[1]).fingerprint}" in shown, fmt
    # json: the statement as signed, in statement.json's own layout; nothing else on stdout.
    assert report(signed, "json").stdout == signed_statement
    assert json.loads(signed_statement)["predicate"]["verdict"] == "FAIL"
    assert "verdict: FAIL" in report(signed, "table").stdout
    assert 'data-ok="false"' in report(signed, "html").stdout
    junit = report(signed, "junit").stdout
    doc = validate(junit)  # still the schema Jenkins reads, with one more test in error
    assert doc.get("errors") == "1" and doc.get("tests") == str(len(doc.findall(".//testcase")))
    assert '<property name="attestation_ok" value="false" />' in junit
    assert 'name="attestation"' in junit and 'type="ATTESTATION_ERROR"' in junit
    assert report(signed, "github").stdout.startswith("::error title=imagegate attestation")


def test_the_signature_is_checked_with_key_and_said_unchecked_without(
    signed: Path, keypair: tuple[Path, Path], tmp_path: Path
) -> None:
    fingerprint = keys.load_public_key(keypair[1]).fingerprint
    for fmt in FORMATS:
        r = report(signed, fmt)
        assert r.returncode == 0, (fmt, r.stderr)
        shown = r.stderr if fmt == "json" else r.stdout
        assert "signature not checked — pass --key" in shown, (fmt, shown)
        r = report(signed, fmt, "--key", str(keypair[1]))
        assert r.returncode == 0 and f"signature verified with key {fingerprint}" in (r.stdout + r.stderr), (
            fmt
        )
    _, other = keys.write_keypair(tmp_path / "other", keys.generate(), None)
    for fmt in FORMATS:
        r = report(signed, fmt, "--key", str(other))
        assert r.returncode == 1, (fmt, r.stderr)
        assert "SIGNATURE FAILED" in (r.stdout + r.stderr), fmt


def test_an_unsigned_attempt_is_flagged_in_every_format(
    unsigned_run: Path, keypair: tuple[Path, Path]
) -> None:
    for fmt in FORMATS:
        r = report(unsigned_run, fmt)
        assert r.returncode == 0, (fmt, r.stderr)  # flagged, not failed: --no-sign is a choice
        shown = r.stderr if fmt == "json" else r.stdout
        assert UNSIGNED in shown, (fmt, shown)
    assert report(unsigned_run, "json").stdout == (unsigned_run / "statement.json").read_text()
    # Asked to check a key, an unsigned attempt cannot pass.
    r = report(unsigned_run, "markdown", "--key", str(keypair[1]))
    assert r.returncode == 1 and UNSIGNED in r.stdout


def test_an_edited_evidence_file_is_not_shown(signed: Path) -> None:
    result = sorted(signed.glob("stages/*/result.json"))[0]
    doc = json.loads(result.read_text())
    doc["data"] = {"forged": "an edited fact"}
    result.write_text(json.dumps(doc))
    r = report(signed, "html")
    assert r.returncode == 1, r.stderr
    assert "an edited fact" not in r.stdout
    assert f"result.json in {result.parent}: differs from its sha256 in the statement" in r.stdout


@pytest.mark.parametrize(
    "how",
    [
        "two envelopes",
        "payloadType text/plain",
        "payloadType application/json",
        "payload not JSON",
        "not an acceptance",
    ],
)
def test_an_unreadable_attestation_is_flagged_and_fails(
    signed: Path, keypair: tuple[Path, Path], how: str
) -> None:
    """An attestation file that holds no one readable acceptance vouches for nothing: the report
    says so, and why, and shows statement.json for what it is."""
    path = signed / DSSE_FILE
    envelope = json.loads(path.read_text())
    if how == "two envelopes":
        path.write_text(json.dumps(envelope) + "\n" + json.dumps(envelope) + "\n")
        why = f"{path}: holds more than one envelope"
    elif how.startswith("payloadType "):
        kind = how.split(" ", 1)[1]
        path.write_text(json.dumps({**envelope, "payloadType": kind}))
        why = f"{path}: payloadType {kind!r} is not an in-toto statement"
    elif how == "payload not JSON":
        path.write_text(json.dumps({**envelope, "payload": base64.b64encode(b"not JSON").decode()}))
        why = f"{path}: cannot read it: "
    else:
        payload = base64.b64encode(json.dumps({"predicate": {"stages": []}}).encode()).decode()
        path.write_text(json.dumps({**envelope, "payload": payload}))
        why = f"{path}: not an imagegate acceptance statement"
    for fmt in ("table", "json"):
        for key in ((), ("--key", str(keypair[1]))):
            r = report(signed, fmt, *key)
            assert r.returncode == 1, (fmt, key, r.stdout, r.stderr)
            shown = r.stderr if fmt == "json" else r.stdout
            assert "ATTESTATION UNREADABLE" in shown and why in shown, (fmt, shown)
            assert "signature verified" not in shown and "SIGNATURE FAILED" not in shown
    assert report(signed, "json").stdout == (signed / "statement.json").read_text()


def test_every_edited_evidence_file_is_said_whichever_its_new_digest(signed: Path) -> None:
    """A changed file is a changed file: each stage's result.json edited is named, one whose new
    sha256 sorts before the one the statement lists and one whose sha256 sorts after it."""
    statement = json.loads((signed / "statement.json").read_text())
    listed = {
        f["path"]: f["sha256"] for s in statement["predicate"]["stages"] for f in s.get("evidence") or []
    }
    results = sorted(signed.glob("stages/*/result.json"))
    assert len(results) == 2
    for result, before in zip(results, (True, False), strict=True):
        was, doc = listed[str(result.relative_to(signed))], json.loads(result.read_text())
        for n in range(200):
            doc["data"] = {"forged": "x" * n}
            data = json.dumps(doc).encode()
            if (hashlib.sha256(data).hexdigest() < was) is before:
                break
        result.write_bytes(data)
    r = report(signed, "markdown")
    assert r.returncode == 1, r.stderr
    for result in results:
        assert f"result.json in {result.parent}: differs from its sha256 in the statement" in r.stdout
