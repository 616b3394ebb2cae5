"""The serve probe's pure parts: how a bad-media answer is told (refused, ignored, taken), the
recommended startupProbe, the argv placeholders, the model path check, the media made."""

from __future__ import annotations

import ast
import base64
import http.server
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests.probes.test_parsers import load

T = TypeVar("T")


@pytest.mark.parametrize(
    ("status", "text", "tokens", "takes", "outcome", "problem"),
    [
        (400, None, None, False, "refused", None),
        (422, None, None, True, "refused", None),
        (500, None, None, False, "server_error", "answered 500 (a client error, 4xx, expected)"),
        (None, None, None, False, "no_answer", "no answer"),
        (200, "", 28, False, "empty", "200 with empty content"),
        # The same prompt tokens as the text alone: the media never reached the model.
        (200, "hi", 28, False, "ignored", None),
        (200, "hi", 28, True, "ignored", "200: the media was ignored, for a model that takes it"),
        (
            200,
            "hi",
            92,
            True,
            "accepted",
            "200: the corrupt media was taken as valid (92 prompt tokens, 28 without it)",
        ),
        (200, "hi", None, False, "unknown", None),
        (302, None, None, False, "unexpected", "answered 302 (4xx expected)"),
    ],
)
def test_a_bad_media_answer_is_told_apart(
    status: int | None, text: str | None, tokens: int | None, takes: bool, outcome: str, problem: str | None
) -> None:
    assert load("serve").classify(status, text, tokens, 28, takes) == (outcome, problem)


def test_the_recommended_startup_probe_covers_the_measured_time_with_its_margin() -> None:
    probe = load("serve").startup_probe(1545.0, 10, 0.5)  # the 24 min 42 s + 85 s SGLang start
    assert probe == {
        "periodSeconds": 10,
        "failureThreshold": 232,
        "budget_s": 2320,
        "measured_s": 1545.0,
        "margin": 0.5,
    }
    assert load("serve").startup_probe(0.2, 10, 0.5)["failureThreshold"] == 1


def test_placeholders_are_filled_and_nothing_else_is_formatted() -> None:
    argv = load("serve").fill(
        ["s", "{model}", "--port={port}", "{host}", '{"a": 1}'], "/m", "127.0.0.1", 8000
    )
    assert argv == ["s", "/m", "--port=8000", "127.0.0.1", '{"a": 1}']


def test_a_model_path_that_cannot_be_served_is_named(tmp_path: Path) -> None:
    serve = load("serve")
    assert serve.model_problem(None) == ""
    assert serve.model_problem(str(tmp_path)) == ""
    missing = tmp_path / "nope"
    assert serve.model_problem(str(missing)) == (
        f"model path {missing} does not exist in the sandbox: mount it (--model) or fix `model:`"
    )
    if os.getuid() != 0:  # root reads anything
        locked = tmp_path / "locked"
        locked.mkdir(mode=0)
        assert serve.model_problem(str(locked)).startswith(f"model path {locked} is not readable by uid ")


def test_the_valid_png_is_whole_and_the_truncated_one_is_cut() -> None:
    media = load("serve_media")
    png = media.png(8, 4)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png.endswith(b"IEND\xaeB`\x82")
    idat = png[png.index(b"IDAT") + 4 : png.index(b"IEND") - 8]
    assert len(zlib.decompress(idat)) == 4 * (1 + 8 * 3)
    cases = {name: (kind, p) for name, kind, p in media.bad_cases(9)}
    assert set(cases) == {
        "truncated_png", "garbage_png", "garbage_jpeg", "empty_payload", "invalid_base64",
        "unreachable_url", "garbage_mp4",
    }  # fmt: skip
    cut = base64.b64decode(cases["truncated_png"][1]["image_url"]["url"].split(",", 1)[1])
    assert media.png().startswith(cut) and len(cut) < len(media.png())
    assert (
        cases["garbage_mp4"] == ("video", cases["garbage_mp4"][1]) and "video_url" in cases["garbage_mp4"][1]
    )
    assert cases["unreachable_url"][1]["image_url"]["url"] == "http://127.0.0.1:9/imagegate-missing.png"


def test_engine_phases_and_the_pipeline_s_own_are_merged() -> None:
    phases = dict(load("serve").phases_of({"engine": "sglang", "phases": {"ready": "up!", "mine": "x"}}))
    assert phases["ready"] == "up!" and phases["mine"] == "x"
    assert phases["weights_loaded"] == r"Load weight end\. "


def test_the_exception_logged_after_the_access_line_is_the_server_line() -> None:
    # As uvicorn does: the access line with the 500 first, the exception that caused it after.
    script = (
        'echo "INFO: POST /v1/chat/completions 500"; sleep 0.3; echo "RuntimeError: decode failed"; sleep 30'
    )
    server = load("serve_process").Server(["sh", "-c", script], dict(os.environ), "/", [])
    try:
        while not server.lines_since(0.0):
            time.sleep(0.01)
        assert server.error_line(0.0, settle=3.0) == "RuntimeError: decode failed"
    finally:
        assert server.stop()["left_alive"] == []


@pytest.mark.parametrize(
    ("argv", "target", "args"),
    [
        (["sglang", "serve", "--port", "8000"], {"command": ["sglang"]}, ["serve", "--port", "8000"]),
        (
            ["/usr/bin/python3.11", "-m", "sglang.launch_server", "--port", "8000"],
            {"module": "sglang.launch_server"},
            ["--port", "8000"],
        ),
        (["python3", "-c", "x"], {"command": ["python3"]}, ["-c", "x"]),
    ],
)
def test_a_python_m_argv_runs_its_module_and_any_other_its_console_script(
    argv: list[str], target: dict[str, object], args: list[str]
) -> None:
    assert load("serve").launcher(argv) == (target, args)


USAGE = "usage: sglang serve [-h] [--model-path MODEL_PATH]\n"


@pytest.mark.parametrize(
    ("code", "timed_out", "err", "verdict"),
    [
        (
            0,
            False,
            "imagegate: parsed, not started: model=/m platform=CpuSRTPlatform\n",
            ("PASS", "parsed under platform sglang-cpu"),
        ),
        # argparse's own message is the reason, after its whole usage text
        (
            2,
            False,
            USAGE + "sglang serve: error: unrecognized arguments: --no-such-flag\n",
            ("FAIL", "exit 2: sglang serve: error: unrecognized arguments: --no-such-flag"),
        ),
        (
            1,
            False,
            'Traceback (most recent call last):\n  File "x", line 1\n'
            "ValueError: --prefill-decode-interval must be non-negative.\n[log] kill_process_tree called\n",
            ("FAIL", "exit 1: ValueError: --prefill-decode-interval must be non-negative."),
        ),
        # exit 0 that never reached the parse (a --help in the argv, a wrapper): nothing checked
        (
            0,
            False,
            USAGE,
            (
                "ERROR",
                "exit 0 without an 'imagegate: parsed, not started' line: the CLI ended before its parse",
            ),
        ),
        (
            3,
            False,
            "imagegate: not parsed: backend diffusion was selected, parse_only sglang parses the llm"
            " server only; nothing was started\n",
            (
                "ERROR",
                "not parsed: backend diffusion was selected, parse_only sglang parses the llm server only;"
                " nothing was started",
            ),
        ),
        (None, True, "", ("ERROR", "parsing timed out (killed)")),
    ],
)
def test_a_parse_only_run_passes_only_when_the_parse_ran_to_its_end(
    code: int | None, timed_out: bool, err: str, verdict: tuple[str, str]
) -> None:
    assert load("serve").parse_verdict(code, timed_out, err, "sglang-cpu") == verdict


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_each_parse_only_check_says_it_parsed_and_runs_on_python_3_8(engine: str) -> None:
    check = load("serve_engines").PARSE_ONLY[engine]
    code = load("platforms").OVERRIDES[check["platform"]] + check["code"]
    assert load("serve").PARSED in code
    ast.parse(code, feature_version=(3, 8))


class _Trickling(http.server.BaseHTTPRequestHandler):
    """A server that answers 200 and then sends one byte of its body every 50 ms, for ever: no
    single read ever waits long enough for a socket timeout to trip."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(1 << 30))
        self.end_headers()
        try:
            while True:
                self.wfile.write(b"d")
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass  # the client gave up: what its deadline does


@pytest.fixture()
def trickling() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Trickling)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _bounded(call: Callable[[], T]) -> tuple[T, float]:
    """`call()` and its seconds; a call still blocked after 60 s fails the test instead of hanging it."""
    out: list[T] = []
    started = time.monotonic()
    worker = threading.Thread(target=lambda: out.append(call()), daemon=True)
    worker.start()
    worker.join(60)
    assert out, "the request was still reading the trickle after 60 s: its timeout was not honoured"
    return out[0], time.monotonic() - started


@pytest.mark.parametrize("streamed", [False, True], ids=["request", "streamed"])
def test_a_trickling_server_gets_the_request_s_own_timeout(trickling: int, streamed: bool) -> None:
    http_ = load("serve_http")
    body = {"model": "m", "messages": [], "stream": streamed}
    if streamed:
        out, seconds = _bounded(
            lambda: http_.stream("127.0.0.1", trickling, "/v1/chat/completions", body, 1.0)
        )
        assert out["status"] == 200 and not out["done"]
        error = out["error"]
    else:
        answer, seconds = _bounded(
            lambda: http_.request("127.0.0.1", trickling, "POST", "/v1/chat/completions", body, 1.0)
        )
        assert answer.status is None
        error = answer.error
    assert error == "no whole answer within the request's 1 s (request_timeout)"
    assert seconds >= 1.0  # ended by the deadline, not by something else sooner


def test_the_streamed_request_is_given_the_pipeline_s_request_timeout() -> None:
    run = load("serve").Run({"request_timeout": 10}, time.monotonic() + 90)
    assert 9 < run.budget() <= 10
    assert load("serve").Run({}, time.monotonic() + 90).budget() <= 90  # never past the stage
