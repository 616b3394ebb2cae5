"""`imagegate verify` exits on the signed verdict, not only on the signature: a CI gate or an
admission script that checks the exit code must not let a rejected image through. Real signed
runs (tests/policies/conftest.py), verified by the real command."""

from __future__ import annotations

from pathlib import Path

from imagegate.attest import sign
from tests.helpers import imagegate
from tests.policies.conftest import Keys


def _verify(attempt: Path, keys: Keys, *args: str, name: str = sign.DSSE_FILE) -> tuple[int, str]:
    r = imagegate("verify", str(attempt / name), "--key", str(keys.pub), *args)
    return r.returncode, r.stdout + r.stderr


def test_verify_exits_on_the_verdict(runs: dict[str, Path], policy_keys: Keys) -> None:
    for name, code, said in (
        ("pass", 0, "verified: verdict PASS, accepted (levels: IMAGEGATE_CPU)"),
        ("fail", 1, "verified, but verdict FAIL is not accepted (rejected; levels: no level)"),
        ("error", 1, "verified, but verdict ERROR is not accepted (rejected; levels: no level)"),
        ("deferred", 0, "verified: verdict CPU_PASS_GPU_ENV_DEFERRED, accepted (levels: IMAGEGATE_CPU)"),
        (
            "skipped",
            1,
            "verified, but verdict CPU_PASS_PIP_CHECK_DEFERRED reaches no level: not accepted (no level "
            "reached (not run or not passed: pip_check DEFERRED))",
        ),
        ("gpu_pass", 0, "verified: verdict PASS, accepted (levels: IMAGEGATE_CPU, IMAGEGATE_GPU)"),
    ):
        got, out = _verify(runs[name], policy_keys, *(("--signature-only",) if name == "gpu_pass" else ()))
        assert (got, said in out) == (code, True), (name, out)


def test_require_complete_and_expect_verdict_narrow_it(runs: dict[str, Path], policy_keys: Keys) -> None:
    got, out = _verify(runs["deferred"], policy_keys, "--require-complete")
    assert got == 1 and "--require-complete refuses a deferred verdict" in out, out
    assert _verify(runs["pass"], policy_keys, "--require-complete")[0] == 0
    assert _verify(runs["deferred"], policy_keys, "--expect-verdict", "PASS")[0] == 1
    # --expect-verdict names the verdict to accept: a signed rejection checked as such.
    got, out = _verify(runs["fail"], policy_keys, "--expect-verdict", "FAIL")
    assert got == 0 and "verified: verdict FAIL, as expected" in out, out


def test_the_verification_summary_exits_on_its_result(runs: dict[str, Path], policy_keys: Keys) -> None:
    vsa = ("--type", "https://slsa.dev/verification_summary/v1", "--signature-only")
    assert _verify(runs["pass"], policy_keys, *vsa, name=sign.VSA_FILE)[0] == 0
    got, out = _verify(runs["fail"], policy_keys, *vsa, name=sign.VSA_FILE)
    assert got == 1 and "the verification summary says FAILED" in out, out
    got, out = _verify(runs["skipped"], policy_keys, *vsa, name=sign.VSA_FILE)
    assert got == 1, out  # nothing earned: --skip pip_check
