import pytest

from imagegate.domain.results import (
    Counted,
    StageResult,
    Status,
    accepted,
    counted,
    exit_code,
    levels,
    token,
    unreached,
    verdict,
    waiting_on_deferred,
)


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
G, H, W = (
    "gpu",
    "hidden",
    "waited",
)  # a GPU stage on granted GPUs; one without; SKIPPED waiting on a deferred one


def counted_stages(stages: list[tuple[Status, str]]) -> list[Counted]:
    return [
        Counted(f"s{n}", st, gpu=kind in (G, H), on_gpu=kind == G, waited=kind == W)
        for n, (st, kind) in enumerate(stages)
    ]


@pytest.mark.parametrize(
    ("stages", "expected"),
    [
        ([(P, ""), (P, G)], [CPU, GPU]),  # every stage ran and passed, a GPU one among them on GPUs
        ([(P, "")], [CPU]),  # no GPU stage in the pipeline: nothing said about a GPU
        ([(P, ""), (D, G)], [CPU]),  # the GPU stage deferred
        ([(D, ""), (P, G)], []),  # a CPU stage left out (--skip): no level, the GPU one neither
        ([(P, ""), (S, W), (P, G)], []),  # a CPU stage skipped waiting on a deferred one: it never ran
        ([(P, ""), (S, ""), (P, G)], [CPU, GPU]),  # a stage with nothing to check counts for nothing
        ([(S, ""), (P, "")], [CPU]),  # ... nor against
        ([(S, ""), (P, G)], [CPU, GPU]),  # the node check alone, on GPUs: it checked something
        ([(P, G)], [CPU, GPU]),
        ([(P, H)], []),  # the image said it had a GPU, the runner gave it none: nothing passed
        ([(P, ""), (P, H)], [CPU]),  # ... and no GPU level beside a CPU one
        ([(P, ""), (P, G), (P, H)], [CPU]),  # every GPU stage on granted GPUs, or no GPU level
        ([(P, ""), (P, G), (S, G)], [CPU, GPU]),  # a GPU stage with nothing to check
        ([(P, ""), (S, G)], [CPU]),  # GPU stages that checked nothing: no GPU level
        ([(P, ""), (P, G), (S, W)], []),
        ([(S, "")], []),  # nothing checked
        ([], []),
        ([(F, ""), (P, G)], []),
        ([(P, ""), (E, G)], []),
    ],
)
def test_levels_name_what_ran_and_passed(stages: list[tuple[Status, str]], expected: list[str]) -> None:
    results = [StageResult(f"s{n}", "p", "inside", st, "") for n, (st, _) in enumerate(stages)]
    assert levels(verdict(results), counted_stages(stages)) == expected


def test_a_verdict_that_is_not_accepted_reaches_no_level_whatever_the_stages_say() -> None:
    assert levels("FAIL", counted_stages([(P, ""), (P, G)])) == []
    assert levels("ERROR", counted_stages([(P, "")])) == []
    assert levels("NOT_A_VERDICT", counted_stages([(P, "")])) == []
    assert levels("CPU_PASS_X_DEFERRED", counted_stages([(P, ""), (D, G)])) == [CPU]


def test_counted_reads_the_plan_the_runners_fact_and_waiting() -> None:
    plan = {
        "stages": [
            {"id": "node_check", "requires": ["gpu"]},
            {"id": "smoke", "needs": ["node_check"]},
            {"id": "find_spec"},
            {"id": "pip_check"},
            {"id": "after", "needs": ["node_check", "pip_check"]},
            {"id": "gpu_cli", "requires": ["gpu"]},  # a GPU stage smoke does not wait on
            "not a stage",
        ]
    }
    stages = [
        StageResult("node_check", "gpu_preflight", "inside", D, "", on_gpu=True),
        StageResult("smoke", "cli", "inside", S, ""),
        StageResult("find_spec", "find_spec", "inside", S, ""),
        StageResult("pip_check", "pip_check", "inside", D, ""),
        StageResult("after", "cli", "inside", S, ""),
    ]
    assert counted(stages, plan) == [
        Counted("node_check", D, gpu=True, on_gpu=True),
        Counted("smoke", S, gpu=True, waited=True),  # waited on a GPU stage alone: needs a GPU too
        Counted("find_spec", S),  # nothing to check
        Counted("pip_check", D),
        Counted("after", S, waited=True),  # waited on a CPU stage left out as well
    ]


def test_unreached_names_what_did_not_run_or_pass() -> None:
    left = [Counted("pip_check", D), Counted("find_spec", S), Counted("node_check", P, gpu=True, on_gpu=True)]
    assert (
        unreached(left)
        == "no level reached (not run or not passed: pip_check DEFERRED; nothing to check: find_spec)"
    )
    hidden = [Counted("cli", P, gpu=True)]
    assert unreached(hidden) == (
        "no level reached (no stage checked something and passed; not run or not passed: cli PASS without GPUs)"
    )
    assert unreached([]) == "no level reached (no stage checked something and passed)"


@pytest.mark.parametrize(
    ("v", "reached", "complete", "code"),
    [
        ("PASS", [CPU], False, 0),
        ("CPU_PASS_X_DEFERRED", [CPU], False, 0),
        ("CPU_PASS_X_DEFERRED", [], False, 1),  # no level, no acceptance
        ("PASS", [], False, 1),
        ("CPU_PASS_X_DEFERRED", [CPU], True, 1),
        ("FAIL", [], False, 1),
        ("ERROR", [], False, 2),  # could not decide stays so
    ],
)
def test_accepted_needs_a_level(v: str, reached: list[str], complete: bool, code: int) -> None:
    assert accepted(v, reached, require_complete=complete) == code
    if not complete:  # the default accepts a deferred verdict that reached a level, as run does
        assert accepted(v, reached) == code


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
