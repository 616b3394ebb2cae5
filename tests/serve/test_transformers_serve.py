"""The serve stage end to end on a real server: `transformers serve` on CPU with a tiny
random-weight model made offline (tests/images/transformers-serve), in the real engine.

One run holds every case as its own stage (the stages run one after another in one container):
the healthy server, a test wrapper answering 500 to a corrupt image, one whose readiness answers
before it can serve, one that dies on a corrupt image, a missing model path, a start-up budget
too short. Every stage's evidence must say its server was killed whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_test_image

pytestmark = [pytest.mark.engine, pytest.mark.timeout(3600)]

SERVE = ["transformers", "serve", "--host", "{host}", "--port", "{port}", "{model}"]
MODEL = "/models/tiny-llama"


def wrapped(mode: str) -> list[str]:
    """The test wrapper (not a real server) in front of the real one."""
    return ["python3", "/opt/imagegate-test/serve_wrapper.py", mode, "{port}", "{model}"]


def stage(sid: str, command: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "id": sid,
        "probe": "serve",
        "timeout": "5m",
        "with": {"command": command, "model": MODEL, "engine": "transformers", **extra},
    }


PIPELINE = {
    "apiVersion": "imagegate/v1",
    "kind": "Pipeline",
    "name": "transformers-serve",
    "stages": [
        stage("healthy", SERVE),
        stage("corrupt_500", wrapped("500-on-corrupt")),
        stage("early_ready", wrapped("early-ready")),
        stage("crash", wrapped("crash-on-corrupt")),
        stage("missing_model", SERVE, model="/models/not-there"),
        stage("short_budget", SERVE, startup_timeout=1),
    ],
}


@pytest.fixture(scope="module")
def served(engine: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    code, pred, attempt = run_test_image(
        "transformers-serve", PIPELINE, tmp_path_factory.mktemp("serve"), 1800
    )
    return code, {s["id"]: s for s in pred["stages"]}, attempt


def test_the_healthy_server_passes_with_its_timeline(served: tuple[int, dict[str, Any], Path]) -> None:
    code, s, attempt = served
    assert code == 1  # the wrappers' stages fail the run
    h = s["healthy"]
    assert h["status"] == "PASS", h
    t = h["facts"]["timeline"]
    assert 0 < t["listen_s"] <= t["ready_s"] <= t["first_token_s"], t
    # The phases of its own log, in order, before readiness answered.
    phases = h["facts"]["phases"]
    assert phases["weights_loaded"] <= phases["ready"] <= t["ready_s"] + 0.5, phases
    probe = h["facts"]["startup_probe"]
    assert probe["periodSeconds"] == 10 and probe["budget_s"] >= t["ready_s"] * 1.5, probe
    assert f"startupProbe 10s x {probe['failureThreshold']}" in h["detail"]
    assert [c["check"] for c in h["facts"]["functional"]] == ["chat", "stream"]
    assert all(c["text"] for c in h["facts"]["functional"]), h["facts"]["functional"]
    # A text-only model ignores media: told apart from refused (4xx) and from taken (more
    # prompt tokens), and not a failure for a model the pipeline does not say takes media.
    outcomes = {c["case"]: (c["outcome"], c["recovery"]) for c in h["facts"]["bad_media"]}
    assert set(outcomes) == {
        "truncated_png", "garbage_png", "garbage_jpeg", "empty_payload", "invalid_base64",
        "unreachable_url", "garbage_mp4",
    }  # fmt: skip
    assert set(outcomes.values()) == {("ignored", "ok")}, outcomes
    log = (next(attempt.glob("stages/*-healthy")) / "server.log").read_text()
    assert "Application startup complete" in log and "POST /v1/chat/completions" in log


def test_a_500_for_a_corrupt_image_fails_naming_the_case_status_and_server_line(
    served: tuple[int, dict[str, Any], Path],
) -> None:
    st = served[1]["corrupt_500"]
    assert st["status"] == "FAIL"
    assert (
        "bad media truncated_png: answered 500 (a client error, 4xx, expected); "
        "server: wrapper: PIL.UnidentifiedImageError: cannot identify image file"
    ) in st["detail"]
    case = next(c for c in st["facts"]["bad_media"] if c["case"] == "garbage_png")
    assert (case["status"], case["outcome"], case["recovery"]) == (500, "server_error", "ok")


def test_readiness_before_serving_is_named(served: tuple[int, dict[str, Any], Path]) -> None:
    st = served[1]["early_ready"]
    assert st["status"] == "FAIL"
    assert st["detail"].startswith("readiness answered at "), st["detail"]
    assert "while a 1-token request failed (503 " in st["detail"]
    t = st["facts"]["timeline"]
    assert t["serving_s"] > t["ready_s"] and st["facts"]["readiness"]["early"] is True


def test_a_server_killed_by_bad_media_fails_recovery(served: tuple[int, dict[str, Any], Path]) -> None:
    st = served[1]["crash"]
    assert st["status"] == "FAIL"
    assert "bad media truncated_png: no answer" in st["detail"]
    assert "after bad media truncated_png the server did not recover: the server exited -9" in st["detail"]
    # Nothing more is sent to a server that is gone.
    assert [c["case"] for c in st["facts"]["bad_media"]] == ["truncated_png"]


def test_a_missing_model_path_is_an_error_before_the_server_starts(
    served: tuple[int, dict[str, Any], Path],
) -> None:
    st = served[1]["missing_model"]
    assert st["status"] == "ERROR"
    assert st["detail"] == (
        "model path /models/not-there does not exist in the sandbox: mount it (--model) or fix `model:`"
    )
    assert "argv" not in st["facts"]  # never started


def test_a_start_up_past_its_budget_fails_and_the_server_is_killed(
    served: tuple[int, dict[str, Any], Path],
) -> None:
    st = served[1]["short_budget"]
    assert st["status"] == "FAIL"
    assert st["detail"].startswith("/health did not answer 200 within its start-up budget (1s)"), st["detail"]


def test_no_server_outlives_its_stage(served: tuple[int, dict[str, Any], Path]) -> None:
    for sid, st in served[1].items():
        if sid != "missing_model":
            assert st["facts"]["stopped"]["left_alive"] == [], (sid, st["facts"]["stopped"])
            assert "survivors_killed" not in st["facts"], sid  # nothing left for the controller
