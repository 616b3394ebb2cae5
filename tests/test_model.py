import pytest

from imagegate.model import StageResult, Status, exit_code, levels, token, verdict, waiting_on_deferred


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


CPU, GPU = "IMAGEGATE_CPU", "IMAGEGATE_GPU"
P, F, E, D, S = Status.PASS, Status.FAIL, Status.ERROR, Status.DEFERRED, Status.SKIPPED


@pytest.mark.parametrize(
    ("stages", "expected"),
    [
        ([(P, False), (P, True)], [CPU, GPU]),  # every stage ran and passed, a GPU one among them
        ([(P, False)], [CPU]),  # no GPU stage in the pipeline: nothing said about a GPU
        ([(P, False), (D, True)], [CPU]),  # the GPU stage deferred
        ([(D, False), (P, True)], []),  # a CPU stage left out (--skip): no level, the GPU one neither
        ([(P, False), (S, False), (P, True)], []),  # a CPU stage skipped (it never ran)
        ([(P, False), (P, True), (S, True)], [CPU]),  # a GPU stage skipped: not the GPU level
        ([(P, True)], []),  # only GPU stages: no CPU stage ran, so no level
        ([], []),
        ([(F, False), (P, True)], []),
        ([(P, False), (E, True)], []),
    ],
)
def test_levels_name_what_ran_and_passed(stages: list[tuple[Status, bool]], expected: list[str]) -> None:
    results = [StageResult(f"s{n}", "p", "inside", st, "") for n, (st, _) in enumerate(stages)]
    assert levels(verdict(results), stages) == expected


def test_a_verdict_that_is_not_accepted_reaches_no_level_whatever_the_stages_say() -> None:
    assert levels("FAIL", [(P, False), (P, True)]) == []
    assert levels("NOT_A_VERDICT", [(P, False)]) == []
    assert levels("CPU_PASS_X_DEFERRED", [(P, False), (D, True)]) == [CPU]


def test_waiting_on_deferred_follows_chains_and_stops_at_a_failure() -> None:
    st = [
        StageResult("gpu", "p", "inside", D, ""),
        StageResult("smoke", "p", "inside", S, ""),
        StageResult("after_smoke", "p", "inside", S, ""),
        StageResult("bad", "p", "inside", F, ""),
        StageResult("after_bad", "p", "inside", S, ""),
        StageResult("both", "p", "inside", S, ""),
    ]
    needs = {"smoke": ["gpu"], "after_smoke": ["smoke"], "after_bad": ["bad"], "both": ["gpu", "bad"]}
    assert waiting_on_deferred(st, needs) == {"smoke": ["gpu"], "after_smoke": ["gpu"]}
