"""A real run's attempt, signed and verified: by `imagegate verify`, by an independent DSSE
implementation, and against every kind of tampering, each named in the error."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from securesystemslib.dsse import Envelope as SslibEnvelope
from securesystemslib.signer import SSlibKey

from imagegate._support import resources
from imagegate.attest import dsse, keys, sign
from imagegate.attest import statement as st
from imagegate.attest.vsa import VSA_PREDICATE_TYPE
from imagegate.domain.results import EvidenceFile, ImageFacts, RunRecord, StageResult, Status
from imagegate.errors import UsageError
from tests.attest.conftest import cli, statement_of

SCHEMA = json.loads((resources.manifests_dir() / "acceptance-v1.schema.json").read_text())


def payload_of(path: Path) -> dict[str, Any]:
    return json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))


def test_run_attestation_verifies_with_imagegate_and_securesystemslib(
    signed: sign.Signed, attempt: Path, keypair: tuple[Path, Path]
) -> None:
    assert [p.name for p in signed.files] == [
        sign.DSSE_FILE,
        sign.INTOTO_FILE,
        sign.BUNDLE_FILE,
        sign.VSA_FILE,
        sign.VSA_BUNDLE_FILE,
        sign.TEST_RESULT_FILE,
        sign.TEST_RESULT_BUNDLE_FILE,
    ]
    for name in (sign.DSSE_FILE, sign.INTOTO_FILE, sign.BUNDLE_FILE):
        r = cli("verify", str(attempt / name), "--key", str(keypair[1]), "--expect-verdict", "PASS")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "verified: verdict PASS" in r.stdout
        assert "ok      evidence:" in r.stdout  # the attempt folder was found beside it and checked
    # An independent DSSE implementation accepts the same file (keyid blank on both sides).
    theirs = SslibEnvelope.from_dict(json.loads((attempt / sign.DSSE_FILE).read_text()))
    k = SSlibKey.from_crypto(keys.load_public_key(keypair[1]).key)
    assert list(theirs.verify([SSlibKey("", k.keytype, k.scheme, k.keyval)], 1)) == [""]
    # The signed payload is the statement the runner wrote beside the evidence.
    assert json.loads(theirs.payload) == statement_of(attempt)


def test_real_statement_matches_the_schema(signed: sign.Signed, attempt: Path) -> None:
    statement = payload_of(attempt / sign.DSSE_FILE)
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.validate(statement, SCHEMA)
    assert set(statement) == {"_type", "subject", "predicateType", "predicate"}
    # Every file of the attempt folder is evidence, except the statement and its signatures.
    listed = {f["path"] for f in st.evidence_files(statement)}
    on_disk = {p.relative_to(attempt).as_posix() for p in attempt.rglob("*") if p.is_file()}
    assert on_disk - listed == {"statement.json", *(p.name for p in signed.files)}
    assert {"plan.json", "pipeline.yaml", "bundle.pyz", "run.json"} <= listed


def _record(tmp_path: Path, **image: Any) -> RunRecord:
    ev = EvidenceFile("stages/01-a/stdout.txt", "0" * 64, 0)
    return RunRecord(
        attempt_id="x",
        attempt_dir=str(tmp_path / "none"),
        pipeline={"name": "vllm", "version": "1", "sha256": "a" * 64, "source": "builtin:vllm"},
        plan={
            "apiVersion": "imagegate/v1",
            "pipeline": {},
            "stages": [{"id": "gpu_cli", "requires": ["gpu"]}],
        },
        image=ImageFacts(**image),
        environment={"driver": "docker", "engine": "docker", "gpu": {"present": False}},
        stages=[
            StageResult("a", "cli", "inside", Status.PASS, "ok", 1.0, evidence=[ev]),
            StageResult("gpu_cli", "cli", "inside", Status.DEFERRED, "no GPU"),
        ],
        started_at="2026-01-01T00:00:00.000Z",
        finished_at="2026-01-01T00:00:01.000Z",
        verdict="CPU_PASS_GPU_CLI_DEFERRED",
        imagegate_version="0.1.0",
    )


def test_subject_is_the_manifest_digest_else_the_config_digest(tmp_path: Path) -> None:
    m, c = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    s1 = st.build_statement(
        _record(tmp_path, reference="r/app:1", repository="r/app", config_digest=c, manifest_digest=m)
    ).to_json()
    assert s1["subject"] == [{"name": "r/app", "digest": {"sha256": "1" * 64}}]
    assert s1["predicate"]["image"]["subjectDigest"] == "manifest"
    s2 = st.build_statement(_record(tmp_path, reference="app:dev", config_digest=c)).to_json()
    assert s2["subject"] == [{"name": "app:dev", "digest": {"sha256": "2" * 64}}]
    assert s2["predicate"]["image"]["subjectDigest"] == "config"
    for s in (s1, s2):
        jsonschema.validate(s, SCHEMA)
        assert s["predicate"]["environment"]["gpuPresent"] is False


def test_vsa_summarises_the_run(signed: sign.Signed, attempt: Path, keypair: tuple[Path, Path]) -> None:
    env = dsse.from_json((attempt / sign.VSA_FILE).read_bytes())
    assert env.verified_by(keys.load_public_key(keypair[1]))
    vsa = json.loads(env.payload)
    acceptance = payload_of(attempt / sign.DSSE_FILE)
    assert vsa["predicateType"] == VSA_PREDICATE_TYPE
    assert vsa["subject"] == acceptance["subject"]
    p = vsa["predicate"]
    # The run's pipeline has no GPU stage: the CPU level alone (a level names what ran).
    assert p["verificationResult"] == "PASSED" and p["verifiedLevels"] == ["IMAGEGATE_CPU"]
    assert p["inputAttestations"][0]["uri"] == sign.DSSE_FILE
    import hashlib

    assert (
        p["inputAttestations"][0]["digest"]["sha256"]
        == hashlib.sha256((attempt / sign.DSSE_FILE).read_bytes()).hexdigest()
    )
    assert p["policy"]["digest"]["sha256"] == acceptance["predicate"]["pipeline"]["sha256"]
    for field in ("verifier", "timeVerified", "resourceUri", "policy"):
        assert p[field]


def test_failed_verdicts_give_a_failed_vsa(tmp_path: Path, key: keys.SigningKey) -> None:
    rec = _record(tmp_path, reference="app", config_digest="sha256:" + "2" * 64)
    rec.verdict = "FAIL"
    (tmp_path / "a").mkdir()
    signed = sign.sign_attempt(tmp_path / "a", st.build_statement(rec), key)
    vsa = json.loads(dsse.from_json(signed.files[3].read_bytes()).payload)["predicate"]
    # The VSA v1 spec: verifiedLevels is "FAILED" when policy verification failed.
    assert vsa["verificationResult"] == "FAILED" and vsa["verifiedLevels"] == ["FAILED"]


def test_signing_never_overwrites(signed: sign.Signed, attempt: Path, key: keys.SigningKey) -> None:
    before = (attempt / sign.DSSE_FILE).read_bytes()
    with pytest.raises(UsageError, match="already exists"):
        sign.sign_attempt(attempt, statement_of(attempt), key)
    assert (attempt / sign.DSSE_FILE).read_bytes() == before


EVIDENCE = [
    "stages/01-pip_check/stdout.txt",
    "stages/02-find_spec/result.json",
    "plan.json",
    "bundle.pyz",
    "run.json",
]


@pytest.mark.parametrize("rel", EVIDENCE)
def test_changing_any_evidence_file_fails_and_names_it(
    signed: sign.Signed, attempt: Path, keypair: tuple[Path, Path], rel: str
) -> None:
    with open(attempt / rel, "ab") as f:
        f.write(b"\n")
    r = cli("verify", str(attempt / sign.DSSE_FILE), "--key", str(keypair[1]))
    assert r.returncode == 1
    assert f"FAILED  evidence: {rel}: changed" in r.stdout
    assert "ok      signature" in r.stdout  # the signature still holds: it is the evidence that moved


def test_missing_evidence_file_fails(signed: sign.Signed, attempt: Path, keypair: tuple[Path, Path]) -> None:
    (attempt / "pipeline.yaml").unlink()
    r = cli("verify", str(attempt / sign.DSSE_FILE), "--key", str(keypair[1]))
    assert r.returncode == 1 and "pipeline.yaml: missing" in r.stdout


def test_attempt_with_all_evidence_deleted_fails_naming_the_files(
    signed: sign.Signed, attempt: Path, keypair: tuple[Path, Path]
) -> None:
    listed = [f["path"] for f in st.evidence_files(statement_of(attempt))]
    for rel in listed:
        (attempt / rel).unlink()
    r = cli("verify", str(attempt / sign.DSSE_FILE), "--key", str(keypair[1]))
    assert r.returncode == 1, r.stdout
    assert "ok      signature" in r.stdout
    assert f"FAILED  evidence: {', '.join(listed)}: missing from" in r.stdout
    assert f"missing from {attempt} ({len(listed)} of {len(listed)} listed files)" in r.stdout
    assert r.stdout.rstrip().splitlines()[-1].startswith("NOT verified: evidence:")


def test_copied_attestation_alone_needs_signature_only(
    signed: sign.Signed, attempt: Path, keypair: tuple[Path, Path], tmp_path: Path
) -> None:
    alone = tmp_path / "elsewhere" / sign.BUNDLE_FILE
    alone.parent.mkdir()
    alone.write_bytes((attempt / sign.BUNDLE_FILE).read_bytes())
    r = cli("verify", str(alone), "--key", str(keypair[1]))
    assert r.returncode == 1 and "FAILED  evidence:" in r.stdout and "plan.json" in r.stdout
    ok = cli("verify", str(alone), "--key", str(keypair[1]), "--signature-only", "--expect-verdict", "PASS")
    assert ok.returncode == 0, ok.stdout
    assert "skipped evidence:" in ok.stdout and "listed files not checked (--signature-only)" in ok.stdout
    # The evidence can still be pointed at.
    there = cli("verify", str(alone), "--key", str(keypair[1]), "--evidence", str(attempt))
    assert there.returncode == 0, there.stdout


def test_symlinked_evidence_is_not_evidence(
    signed: sign.Signed, attempt: Path, keypair: tuple[Path, Path], tmp_path: Path
) -> None:
    # Same bytes, but through a link: whoever controls the link controls what is checked.
    kept = tmp_path / "plan.json"
    kept.write_bytes((attempt / "plan.json").read_bytes())
    (attempt / "plan.json").unlink()
    (attempt / "plan.json").symlink_to(kept)
    r = cli("verify", str(attempt / sign.DSSE_FILE), "--key", str(keypair[1]))
    assert r.returncode == 1 and "FAILED  evidence: plan.json: missing from" in r.stdout


def test_statement_copy_must_match(signed: sign.Signed, attempt: Path, keypair: tuple[Path, Path]) -> None:
    s = statement_of(attempt)
    s["predicate"]["verdict"] = "FAIL"
    (attempt / "statement.json").write_text(json.dumps(s))
    r = cli("verify", str(attempt / sign.DSSE_FILE), "--key", str(keypair[1]))
    assert (
        r.returncode == 1 and "statement.json" in r.stdout and "differs from the signed statement" in r.stdout
    )


def _tampered(attempt: Path, how: str) -> Path:
    obj = json.loads((attempt / sign.DSSE_FILE).read_text())
    if how == "payload byte":
        raw = bytearray(base64.b64decode(obj["payload"]))
        i = raw.index(b'"verdict":"PASS"') + len('"verdict":"')
        raw[i : i + 4] = b"FAIL"
        obj["payload"] = base64.b64encode(bytes(raw)).decode()
    elif how == "signature byte":
        sig = bytearray(base64.b64decode(obj["signatures"][0]["sig"]))
        sig[-1] ^= 0x01
        obj["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    elif how == "payloadType":
        obj["payloadType"] = "application/json"
    elif how == "subject digest":
        s = json.loads(base64.b64decode(obj["payload"]))
        s["subject"][0]["digest"]["sha256"] = "f" * 64
        obj["payload"] = base64.b64encode(json.dumps(s).encode()).decode()
    out = attempt / "tampered.dsse.json"
    out.write_text(json.dumps(obj))
    return out


@pytest.mark.parametrize(
    "how,named",
    [
        ("payload byte", "FAILED  signature"),
        ("signature byte", "FAILED  signature"),
        ("payloadType", "FAILED  payloadType: is 'application/json'"),
        ("subject digest", "FAILED  subject"),
    ],
)
def test_each_tamper_is_detected_and_named(
    signed: sign.Signed, attempt: Path, keypair: tuple[Path, Path], how: str, named: str
) -> None:
    r = cli("verify", str(_tampered(attempt, how)), "--key", str(keypair[1]))
    assert r.returncode == 1, r.stdout
    assert named in r.stdout
    assert "FAILED  signature" in r.stdout  # every one of them also breaks the signature


def test_wrong_key_is_a_clear_error(signed: sign.Signed, attempt: Path, tmp_path: Path) -> None:
    _, other = keys.write_keypair(tmp_path / "other", keys.generate(), None)
    r = cli("verify", str(attempt / sign.DSSE_FILE), "--key", str(other))
    assert r.returncode == 1
    fp = keys.load_public_key(other).fingerprint
    assert f"no signature verifies with key {fp}: signed with another key" in r.stdout


def test_subject_checked_against_the_image_digest(tmp_path: Path, key: keys.SigningKey) -> None:
    m = "sha256:" + "1" * 64
    rec = _record(tmp_path, reference="r/app:1", repository="r/app", config_digest=None, manifest_digest=m)
    (tmp_path / "a").mkdir()
    signed = sign.sign_attempt(tmp_path / "a", st.build_statement(rec), key)
    pub = tmp_path / "k.pub"
    pub.write_bytes(key.public.pem)
    ok = cli("verify", str(signed.dsse_path), "--key", str(pub), "--image", m, "--signature-only")
    assert ok.returncode == 0, ok.stdout
    other = "sha256:" + "9" * 64
    bad = cli("verify", str(signed.dsse_path), "--key", str(pub), "--image", other, "--signature-only")
    assert bad.returncode == 1 and "FAILED  subject" in bad.stdout and "sha256:999999999999" in bad.stdout
    verdict = cli("verify", str(signed.dsse_path), "--key", str(pub), "--expect-verdict", "PASS")
    assert (
        verdict.returncode == 1 and "verdict: is CPU_PASS_GPU_CLI_DEFERRED, expected PASS" in verdict.stdout
    )


def test_hostile_json_is_named_not_a_crash(
    signed: sign.Signed, attempt: Path, keypair: tuple[Path, Path], tmp_path: Path
) -> None:
    deep = "[" * 5000 + "]" * 5000  # past CPython's parser recursion limit
    (tmp_path / "deep.json").write_text(deep)
    r = cli("verify", str(tmp_path / "deep.json"), "--key", str(keypair[1]))
    assert r.returncode == 3, r.stderr
    assert f"attestation {tmp_path / 'deep.json'}: nested more than 64 levels deep" in r.stderr
    # A correctly signed envelope whose payload is hostile: the statement check fails, named.
    env = dsse.sign(deep.encode(), keys.load_signing_key(keypair[0]))
    (tmp_path / "deep.dsse.json").write_bytes(env.to_json())
    r = cli("verify", str(tmp_path / "deep.dsse.json"), "--key", str(keypair[1]))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILED  statement: the payload is nested more than 64 levels deep" in r.stdout
    # statement.json beside the evidence, made hostile.
    (attempt / "statement.json").write_text(deep)
    r = cli("verify", str(attempt / sign.DSSE_FILE), "--key", str(keypair[1]))
    assert r.returncode == 1 and "FAILED  statement.json:" in r.stdout, r.stdout + r.stderr
    assert "Traceback" not in r.stderr


def test_unreadable_input_is_a_usage_error(tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    (tmp_path / "x.json").write_text("{}")
    r = cli("verify", str(tmp_path / "x.json"), "--key", str(keypair[1]))
    assert r.returncode == 3 and "missing payloadType" in r.stderr
    r = cli("verify", str(tmp_path / "x.json"), "--key", str(keypair[0]))
    assert r.returncode == 3 and "this is a private key" in r.stderr


def test_run_integration_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `imagegate run` does: resolve the key before the run (the default key is made on
    first use), run, sign the attempt (the statement the runner wrote), verify it."""
    from imagegate.attest import verify
    from imagegate.drivers.local import LocalDriver
    from imagegate.usecases import runner
    from imagegate.usecases.accept import Outputs, Request, accept

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    said: list[str] = []
    key = keys.resolve_signing_key(None, env={}, notify=said.append)
    assert said and "created a signing key" in said[0]
    opts = runner.RunOptions(pipeline="python", modules=["json"], out=tmp_path / "out")
    observer = runner.DriverObserver(LocalDriver(None), None, opts)
    done = accept(Request(runner.prepare(opts), observer, opts.out, Outputs(key=key)))
    record, signed = done.record, done.signed
    assert signed is not None
    assert json.loads((Path(record.attempt_dir) / "statement.json").read_text()) == done.statement.to_json()
    report = verify.verify_file(signed.dsse_path, key.public, expect_verdict=record.verdict)
    assert report.ok, report.failures
    assert [c.name for c in report.checks if c.outcome == "ok"] == [
        "payloadType",
        "signature",
        "statement",
        "verdict",
        "evidence",
        "statement.json",
    ]


def test_verify_of_nothing_is_refused_and_a_file_is_checked_against_the_digest_given(
    tmp_path: Path, key: keys.SigningKey
) -> None:
    from imagegate.attest import verify

    with pytest.raises(UsageError, match=r"^nothing to verify$") as e:
        verify.verify(None, key.public)
    assert e.value.hint == "pass an ATTESTATION file, or --image REF to fetch it"
    m = "sha256:" + "1" * 64
    rec = _record(tmp_path, reference="r/app:1", repository="r/app", config_digest=None, manifest_digest=m)
    (tmp_path / "a").mkdir()
    signed = sign.sign_attempt(tmp_path / "a", st.build_statement(rec), key)
    ok = verify.verify(signed.dsse_path, key.public, image=m, evidence=False)
    assert ok.ok and [c.outcome for c in ok.checks if c.name in ("subject", "evidence")] == ["ok", "skipped"]
    bad = verify.verify(signed.dsse_path, key.public, image="sha256:" + "9" * 64, evidence=False)
    assert [c.name for c in bad.failures] == ["subject"]


def test_a_signed_runs_vsa_verifies_with_its_type_by_uri_or_short_name(
    images: dict[str, str], tmp_path: Path
) -> None:
    """`imagegate run --key` writes vsa.dsse.json beside the acceptance; `verify --type` takes the
    VSA's predicate type (its URI, or `vsa`) and checks it against what it summarises, not
    against the acceptance's statement.json beside it."""
    from tests.helpers import imagegate

    key = tmp_path / "k"
    assert imagegate("keygen", "--out", str(key)).returncode == 0
    r = imagegate(
        "run", images["python"], "-p", "python", "--key", f"{key}.key", "-o", str(tmp_path / "runs")
    )
    assert r.returncode == 0, r.stderr
    attempt = next(p for p in (tmp_path / "runs").glob("*/*") if p.is_dir())
    vsa = attempt / sign.VSA_FILE
    for kind in (VSA_PREDICATE_TYPE, "vsa"):
        v = imagegate("verify", str(vsa), "--type", kind, "--key", f"{key}.pub")
        assert v.returncode == 0, v.stdout + v.stderr
        assert "verified: verification summary PASSED (levels: IMAGEGATE_CPU)" in v.stdout
        assert "1 files match their sha256" in v.stdout  # the acceptance it summarises, by digest
        assert "statement.json" not in v.stdout and "None" not in v.stdout
    (attempt / sign.DSSE_FILE).write_bytes((attempt / sign.DSSE_FILE).read_bytes() + b"\n")
    changed = imagegate("verify", str(vsa), "--type", VSA_PREDICATE_TYPE, "--key", f"{key}.pub")
    assert changed.returncode == 1 and f"{sign.DSSE_FILE}: changed" in changed.stdout, changed.stdout
