"""The levels a signed acceptance reaches, read from the statement as the VSA and `verify` read
them (attest/vsa.py): the plan says which stages are GPU stages and what each needs, the stage
says whether the runner granted it GPUs (`gpuGranted`), and a statement with a stage this
imagegate cannot read earns nothing. Whole signed runs are in tests/policies; these are the
statements' corners."""

from __future__ import annotations

from typing import Any

import pytest

from imagegate.attest.vsa import counted_stages, levels, no_level, stage_outcomes
from imagegate.domain.results import Counted, Status

CPU, GPU = "IMAGEGATE_CPU", "IMAGEGATE_GPU"
PLAN = {
    "stages": [
        {"id": "find_spec"},
        {"id": "node_check", "requires": ["gpu"]},
        {"id": "smoke", "needs": ["node_check"]},
    ]
}


def statement(verdict: str, *stages: tuple[str, str, bool], plan: Any = PLAN) -> dict[str, Any]:
    """A statement's predicate with these (id, status, gpuGranted) stages."""
    return {
        "predicate": {
            "verdict": verdict,
            "plan": plan,
            "stages": [
                {"id": sid, "status": status, **({"gpuGranted": True} if granted else {})}
                for sid, status, granted in stages
            ],
        }
    }


@pytest.mark.parametrize(
    ("stages", "verdict", "expected"),
    [
        (
            (("find_spec", "PASS", False), ("node_check", "PASS", True), ("smoke", "PASS", True)),
            "PASS",
            [CPU, GPU],
        ),
        # the image said its GPU stage passed; the runner granted no GPU: no GPU level
        (
            (("find_spec", "PASS", False), ("node_check", "PASS", False), ("smoke", "PASS", False)),
            "PASS",
            [CPU],
        ),
        # the node check deferred and what needs it waited: a GPU stage's wait, the CPU level stands
        (
            (("find_spec", "PASS", False), ("node_check", "DEFERRED", False), ("smoke", "SKIPPED", False)),
            "CPU_PASS_NODE_CHECK_DEFERRED",
            [CPU],
        ),
        # the CPU stage left out: nothing counts
        (
            (("find_spec", "DEFERRED", False), ("node_check", "PASS", True), ("smoke", "PASS", True)),
            "CPU_PASS_FIND_SPEC_DEFERRED",
            [],
        ),
        # the CPU stage had nothing to check: the GPU stages that passed on GPUs carry both levels
        (
            (("find_spec", "SKIPPED", False), ("node_check", "PASS", True), ("smoke", "PASS", True)),
            "PASS",
            [CPU, GPU],
        ),
        ((("find_spec", "PASS", False), ("node_check", "PASS", True), ("smoke", "PASS", True)), "FAIL", []),
    ],
)
def test_levels_read_the_plan_and_the_runners_fact(
    stages: tuple[tuple[str, str, bool], ...], verdict: str, expected: list[str]
) -> None:
    assert levels(statement(verdict, *stages)) == expected


def test_a_stage_this_imagegate_cannot_read_earns_nothing() -> None:
    for odd in (
        statement("PASS", ("find_spec", "PASS", False), ("x", "MAYBE", False)),
        {
            "predicate": {
                "verdict": "PASS",
                "plan": PLAN,
                "stages": [{"id": "find_spec", "status": "PASS"}, "junk"],
            }
        },
    ):
        assert counted_stages(odd) is None
        assert levels(odd) == []
        assert no_level(odd) == "no level reached (a stage status imagegate does not write)"
    assert levels({}) == [] and counted_stages({}) == []


def test_a_plan_that_is_not_an_object_names_no_gpu_stage() -> None:
    odd = statement("PASS", ("find_spec", "PASS", False), ("node_check", "PASS", False), plan=["node_check"])
    assert counted_stages(odd) == [Counted("find_spec", Status.PASS), Counted("node_check", Status.PASS)]
    assert levels(odd) == [CPU]
    assert stage_outcomes(odd["predicate"])["gpuStages"] == []
    assert stage_outcomes(statement("PASS")["predicate"])["gpuStages"] == ["node_check"]


def test_no_level_names_the_stages_that_did_not_run_or_pass() -> None:
    left = statement(
        "CPU_PASS_FIND_SPEC_DEFERRED",
        ("find_spec", "DEFERRED", False),
        ("node_check", "PASS", False),
    )
    assert no_level(left) == (
        "no level reached (no stage checked something and passed; not run or not passed: find_spec DEFERRED, "
        "node_check PASS without GPUs)"
    )
    counted = counted_stages(left)
    assert counted is not None and counted[1] == Counted("node_check", Status.PASS, gpu=True)
