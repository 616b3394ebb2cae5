"""The serve stage's media checks end to end on a real vision-language server: `transformers
serve` on CPU with a tiny random-weight Qwen2-VL made offline (tests/images/transformers-serve),
in the real engine.

One run, three stages against the same real server and model: a valid image taken and no bad
media sent (PASS), the bad-media matrix (what the real server answers for each case, recorded in
tests/images/transformers-serve/README.md), and a valid video (which this image cannot decode)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import run_test_image

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]

SERVE = ["transformers", "serve", "--host", "{host}", "--port", "{port}", "{model}"]
CASES = [
    "truncated_png", "garbage_png", "garbage_jpeg", "empty_payload", "invalid_base64",
    "unreachable_url", "garbage_mp4",
]  # fmt: skip


def stage(sid: str, media: list[str], bad_media: bool) -> dict[str, Any]:
    return {
        "id": sid,
        "probe": "serve",
        "timeout": "5m",
        "with": {
            "command": SERVE,
            "model": "/models/tiny-vlm",
            "engine": "transformers",
            "media": media,
            "bad_media": bad_media,
        },
    }


PIPELINE = {
    "apiVersion": "imagegate/v1",
    "kind": "Pipeline",
    "name": "transformers-vlm",
    "stages": [
        stage("image", ["image"], bad_media=False),
        stage("bad_media", ["image"], bad_media=True),
        stage("video", ["image", "video"], bad_media=False),
    ],
}


@pytest.fixture(scope="module")
def served(engine: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any]]:
    code, pred, _ = run_test_image("transformers-serve", PIPELINE, tmp_path_factory.mktemp("vlm"), 1200)
    return code, {s["id"]: s for s in pred["stages"]}


def test_a_valid_image_is_taken_and_chat_and_streaming_answer(served: tuple[int, dict[str, Any]]) -> None:
    code, s = served
    assert code == 1  # the bad-media and video stages fail the run
    st = s["image"]
    assert st["status"] == "PASS", st
    checks = {c["check"]: c for c in st["facts"]["functional"]}
    assert list(checks) == ["chat", "stream", "image"]
    assert all(c["status"] == 200 and c["text"] for c in checks.values()), checks
    # 28 prompt tokens for the text; the 32x32 PNG resized to 56x56 is 4x4 patches merged 2x2:
    # 4 image tokens between its start and end tokens.
    assert st["facts"]["baseline_prompt_tokens"] == 28
    assert checks["image"]["prompt_tokens"] == 28 + 6, checks["image"]
    assert "chat, stream, image; bad media: not sent" in st["detail"]


def test_the_real_server_answers_500_to_every_bad_media_case_and_recovers(
    served: tuple[int, dict[str, Any]],
) -> None:
    st = served[1]["bad_media"]
    assert st["status"] == "FAIL"
    found = {c["case"]: (c["status"], c["outcome"], c["recovery"]) for c in st["facts"]["bad_media"]}
    assert found == {case: (500, "server_error", "ok") for case in CASES}, found
    # Each case named with its status and the server's own exception line.
    lines = {c["case"]: c["server_line"] for c in st["facts"]["bad_media"]}
    assert "decode_png failed" in lines["truncated_png"], lines
    assert "Unsupported or unrecognized image format" in lines["garbage_png"], lines
    assert "Invalid base64-encoded string" in lines["invalid_base64"], lines
    assert "ConnectError" in lines["unreachable_url"], lines
    for case in CASES:
        assert f"bad media {case}: answered 500 (a client error, 4xx, expected); server: " in st["detail"]


def test_a_valid_video_fails_naming_the_decoder_the_image_cannot_load(
    served: tuple[int, dict[str, Any]],
) -> None:
    st = served[1]["video"]
    assert st["status"] == "FAIL"
    checks = {c["check"]: c for c in st["facts"]["functional"]}
    assert checks["image"]["prompt_tokens"] == 28 + 6  # the image is still taken
    assert checks["video"]["status"] == 500
    assert st["detail"].startswith("a valid video: 500 Internal Server Error; server: "), st["detail"]
    assert "libtorchcodec" in st["detail"], st["detail"]
