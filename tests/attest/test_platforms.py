"""How an index statement's verdict and levels combine its platforms' (attest/platforms.py):
pure functions, every combination a user meets when runs come from several hosts."""

from __future__ import annotations

import pytest

from imagegate.attest.platforms import common_levels, index_verdict, platform_token

PLATFORMS = ["linux/amd64", "linux/arm64/v8"]


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        (["PASS", "PASS"], "PASS"),
        (["PASS", None], "CPU_PASS_PLATFORM_LINUX_ARM64_V8_DEFERRED"),
        ([None, None], "CPU_PASS_PLATFORM_LINUX_AMD64_PLATFORM_LINUX_ARM64_V8_DEFERRED"),
        (["PASS", "CPU_PASS_GPU_CLI_DEFERRED"], "CPU_PASS_GPU_CLI_DEFERRED"),
        (["CPU_PASS_GPU_CLI_DEFERRED", "CPU_PASS_GPU_CLI_DEFERRED"], "CPU_PASS_GPU_CLI_DEFERRED"),
        (["CPU_PASS_GPU_CLI_DEFERRED", None], "CPU_PASS_GPU_CLI_PLATFORM_LINUX_ARM64_V8_DEFERRED"),
        (["PASS", "FAIL"], "FAIL"),
        ([None, "FAIL"], "FAIL"),
        (["ERROR", "FAIL"], "FAIL"),
        (["ERROR", "PASS"], "ERROR"),
        (["ERROR", None], "ERROR"),
        (["PASS", "SOMETHING_ELSE"], "ERROR"),  # a verdict imagegate never writes passes nothing
    ],
)
def test_the_verdict_is_pass_only_when_every_platform_passed(
    verdicts: list[str | None], expected: str
) -> None:
    assert index_verdict(verdicts, PLATFORMS) == expected


@pytest.mark.parametrize(
    ("per_platform", "expected"),
    [
        (
            [["IMAGEGATE_CPU", "IMAGEGATE_GPU"], ["IMAGEGATE_CPU", "IMAGEGATE_GPU"]],
            ["IMAGEGATE_CPU", "IMAGEGATE_GPU"],
        ),
        ([["IMAGEGATE_CPU", "IMAGEGATE_GPU"], ["IMAGEGATE_CPU"]], ["IMAGEGATE_CPU"]),
        ([["IMAGEGATE_CPU"], None], []),  # a platform not run reached nothing
        ([["IMAGEGATE_CPU"], []], []),
    ],
)
def test_the_levels_are_those_every_platform_reached(
    per_platform: list[list[str] | None], expected: list[str]
) -> None:
    assert common_levels(per_platform) == expected


def test_a_platform_is_named_in_the_verdict_vocabulary() -> None:
    assert platform_token("linux/arm/v7") == "PLATFORM_LINUX_ARM_V7"
