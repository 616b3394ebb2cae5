import pytest

from imagegate.model import StageResult, Status, exit_code, token, verdict


def st(sid: str, status: Status) -> StageResult:
    return StageResult(sid, "probe", "inside", status, "")


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ([Status.PASS, Status.PASS], "PASS"),
        ([Status.PASS, Status.FAIL, Status.ERROR], "FAIL"),
        ([Status.PASS, Status.ERROR, Status.DEFERRED], "ERROR"),
        ([Status.PASS, Status.DEFERRED], "CPU_PASS_S1_DEFERRED"),
        ([Status.DEFERRED, Status.DEFERRED], "CPU_PASS_S0_S1_DEFERRED"),
        ([Status.PASS, Status.SKIPPED], "PASS"),
        ([Status.SKIPPED], "ERROR"),  # nothing ran: proves nothing
        ([], "ERROR"),
    ],
)
def test_verdict(statuses: list[Status], expected: str) -> None:
    assert verdict([st(f"s{i}", s) for i, s in enumerate(statuses)]) == expected


def test_vllm_token_and_verdict() -> None:
    stages = [st("pip_check", Status.PASS), st("gpu_cli", Status.DEFERRED), st("av_roundtrip", Status.PASS)]
    assert verdict(stages) == "CPU_PASS_GPU_CLI_DEFERRED"
    assert token("av_roundtrip", Status.PASS) == "AV_ROUNDTRIP_PASS"


@pytest.mark.parametrize(
    ("v", "complete", "code"),
    [
        ("PASS", False, 0),
        ("FAIL", False, 1),
        ("ERROR", False, 2),
        ("CPU_PASS_GPU_CLI_DEFERRED", False, 0),
        ("CPU_PASS_GPU_CLI_DEFERRED", True, 1),
        ("PASS", True, 0),
    ],
)
def test_exit_codes(v: str, complete: bool, code: int) -> None:
    assert exit_code(v, require_complete=complete) == code
