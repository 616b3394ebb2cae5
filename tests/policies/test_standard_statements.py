"""The SLSA VSA and the in-toto test-result signed beside the acceptance statement, read from
real signed runs: what each verdict maps to, the configuration by digest, a completion repeating
the whole final verdict and naming the attempt it completes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from imagegate.attest import dsse, keys, sign
from imagegate.attest.vsa import RUN_FIELD, VERIFIER_ID
from tests.policies.conftest import Keys, payload, result_statement, vsa


def test_each_verdict_maps_to_result_and_levels(runs: dict[str, Path]) -> None:
    """A level names what ran and passed: the GPU level only from a pipeline whose GPU stages all
    passed on GPUs the runner granted (the stand-in: a GPU cannot start here); a pipeline without
    GPU stages reaches the CPU level alone; a stage left out with --skip is deferred and no level
    is reached; a stage that had nothing to check counts neither for nor against one."""
    cpu, gpu = ["IMAGEGATE_CPU"], ["IMAGEGATE_CPU", "IMAGEGATE_GPU"]
    expect = {
        "pass": ("PASS", "PASSED", cpu, "PASSED"),
        "gpu_pass": ("PASS", "PASSED", gpu, "PASSED"),
        "deferred": ("CPU_PASS_GPU_ENV_DEFERRED", "PASSED", cpu, "WARNED"),
        "skipped": ("CPU_PASS_PIP_CHECK_DEFERRED", "FAILED", ["FAILED"], "WARNED"),
        # PASS, with a stage that had nothing to check (no image here): the level of the one that
        # passed, and a test-result that is not PASSED (a test that did not run)
        "layers_skipped": ("PASS", "PASSED", cpu, "WARNED"),
        "fail": ("FAIL", "FAILED", ["FAILED"], "FAILED"),
        "error": ("ERROR", "FAILED", ["FAILED"], "FAILED"),
    }
    for name, (verdict, result, levels, tested) in expect.items():
        acceptance = payload(runs[name] / sign.DSSE_FILE)
        assert acceptance["predicate"]["verdict"] == verdict, name
        v, t = vsa(runs[name]), result_statement(runs[name])
        assert v["subject"] == t["subject"] == acceptance["subject"], name
        assert (v["predicate"]["verificationResult"], v["predicate"]["verifiedLevels"]) == (result, levels), (
            name
        )
        assert t["predicateType"] == "https://in-toto.io/attestation/test-result/v0.1"
        assert t["predicate"]["result"] == tested, name
    assert result_statement(runs["deferred"])["predicate"]["warnedTests"] == ["gpu_env"]
    assert result_statement(runs["skipped"])["predicate"]["warnedTests"] == ["pip_check"]
    assert result_statement(runs["fail"])["predicate"]["failedTests"] == ["find_spec"]
    assert result_statement(runs["error"])["predicate"]["failedTests"] == ["slow"]
    assert result_statement(runs["pass"])["predicate"]["passedTests"] == ["pip_check", "find_spec"]


def test_the_vsa_lists_what_ran_was_deferred_and_left_out(runs: dict[str, Path]) -> None:
    stages = {name: vsa(runs[name])["predicate"][RUN_FIELD]["stages"] for name in runs}
    assert stages["skipped"] == {
        "passed": ["find_spec"],
        "failed": [],
        "deferred": ["pip_check"],
        "skipped": [],
        "userSkipped": ["pip_check"],
        "gpuStages": [],
    }
    assert stages["deferred"]["deferred"] == ["gpu_env"] and stages["deferred"]["gpuStages"] == ["gpu_env"]
    assert stages["deferred"]["userSkipped"] == [] and stages["pass"]["passed"] == ["pip_check", "find_spec"]
    assert vsa(runs["skipped"])["predicate"][RUN_FIELD]["verdict"] == "CPU_PASS_PIP_CHECK_DEFERRED"
    assert stages["layers_skipped"] == {
        "passed": ["runs"],
        "failed": [],
        "deferred": [],
        "skipped": ["layers"],
        "userSkipped": [],
        "gpuStages": [],
    }


def test_test_result_names_pipeline_and_probes_bundle_by_digest(runs: dict[str, Path]) -> None:
    attempt = runs["pass"]
    pred = payload(attempt / sign.DSSE_FILE)["predicate"]
    config = result_statement(attempt)["predicate"]["configuration"]
    assert config[0]["digest"] == {"sha256": pred["pipeline"]["sha256"]}
    assert config[1] == {
        "name": "imagegate probes bundle",
        "digest": {"sha256": hashlib.sha256((attempt / "bundle.pyz").read_bytes()).hexdigest()},
    }
    v = vsa(attempt)["predicate"]
    assert v["timeVerified"] == pred["finishedOn"] and v["policy"]["digest"] == config[0]["digest"]
    # the verifier, as the VSA spec asks: who verified, with which version
    assert v["verifier"] == {"id": VERIFIER_ID, "version": {"imagegate": pred["imagegate"]["version"]}}
    assert pred["imagegate"]["version"] not in ("", "None")


def test_standard_statements_are_signed_with_the_runs_key(runs: dict[str, Path], policy_keys: Keys) -> None:
    pub = keys.load_public_key(policy_keys.pub)
    other = keys.load_public_key(policy_keys.other_pub)
    for name in (sign.VSA_FILE, sign.TEST_RESULT_FILE):
        assert dsse.from_json((runs["pass"] / name).read_bytes()).verified_by(pub)
        assert not dsse.from_json((runs["other_key"] / name).read_bytes()).verified_by(pub)
        assert dsse.from_json((runs["other_key"] / name).read_bytes()).verified_by(other)


def test_a_completion_repeats_the_final_verdict_and_names_what_it_completes(runs: dict[str, Path]) -> None:
    """Kyverno reads only the first attestation of a type (kyverno#4116): the completion's own
    VSA and test-result must each say the whole final verdict, not only the stages it ran."""
    done, earlier = runs["completion"], runs["deferred"]
    pred = payload(done / sign.DSSE_FILE)["predicate"]
    assert pred["completes"]["attempt"] == earlier.name
    v, t = vsa(done)["predicate"], result_statement(done)["predicate"]
    assert (v["verificationResult"], v["verifiedLevels"]) == ("PASSED", ["IMAGEGATE_CPU"])  # no GPU here
    assert t["result"] == "WARNED" and t["warnedTests"] == ["gpu_env"]
    assert sorted(t["passedTests"] + t["warnedTests"] + t["failedTests"]) == sorted(
        s["id"] for s in pred["stages"]
    )
    (own, linked) = v["inputAttestations"]
    assert own == {
        "uri": sign.DSSE_FILE,
        "digest": {"sha256": hashlib.sha256((done / sign.DSSE_FILE).read_bytes()).hexdigest()},
    }
    assert linked == {
        "uri": "completes/attestation.dsse.json",
        "digest": {"sha256": hashlib.sha256((earlier / sign.DSSE_FILE).read_bytes()).hexdigest()},
    }
    assert json.loads((done / "statement.json").read_text())["predicate"]["verdict"] == pred["verdict"]
