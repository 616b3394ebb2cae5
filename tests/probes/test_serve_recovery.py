"""The serve probe against a small real server on this host: readiness is judged against a real
1-token request, and after every bad request the server must recover (the process alive,
readiness answering, the next request answered). The probe runs whole (`serve.run`): it starts
the server below as a pipeline's command, polls it, sends its requests and judges the answers.

The server is a real HTTP server (the standard library's), speaking just enough of the OpenAI
chat API; each test starts it in one way of misbehaving that a real engine shows (readiness
before the model is loaded, a request that breaks the next one, a crash on bad media)."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.probes.test_parsers import load

SERVER = r"""
import json, os, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, mode = int(sys.argv[1]), sys.argv[2]
threading.Timer(120, os._exit, (9,)).start()  # never outlives a test whose probe did not stop it
state = {"chats": 0, "bad": 0, "dying": False}
COMPLETION = {"choices": [{"message": {"content": "loading the model" + " ." * 200}}]}  # an error, shaped as a chat


def log(line):
    print(line, flush=True)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body, kind="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def do_GET(self):
        if state["dying"]:
            self.close_connection = True  # hangs up: a process on its way out
            return
        if mode.startswith("health_") and state["bad"] == 1:
            return self.answer(int(mode[len("health_"):]), {"ok": False, "why": "x" * 300})
        self.answer(200, {"ok": True})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        content = req["messages"][0]["content"]
        if req.get("stream"):
            log("stream")
            chunk = {"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}]}
            return self.answer(200, b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n", "text/event-stream")
        if isinstance(content, list):  # media: every one this server gets is bad
            state["bad"] += 1
            log("bad media %d" % state["bad"])
            if mode == "server_error":
                self.answer(500, {"error": "internal"})
                time.sleep(0.2)  # its own line comes after the answer, as a real server's may
                log("ValueError: cannot decode the media of request %d" % state["bad"])
                return
            self.answer(400, {"error": "bad media"})
            if mode == "dies":
                state["dying"] = True
                threading.Thread(target=lambda: (time.sleep(0.3), os._exit(3))).start()
            return
        state["chats"] += 1
        log("chat max_tokens=%s" % req["max_tokens"])
        if mode == "never" or mode == "early" and state["chats"] <= 2:
            return self.answer(503, COMPLETION)
        if mode == "early" and state["chats"] == 3:  # a 200 without the answer's text
            return self.answer(200, {"choices": [{"message": {"content": None}}], "usage": {"prompt_tokens": 5}})
        if state["bad"] == 1 and mode == "next_fails":
            return self.answer(500, {"choices": [{"message": {"content": "x" * 400}}]})
        if state["bad"] == 1 and mode == "next_empty":
            return self.answer(200, {"choices": [], "usage": {"prompt_tokens": 5}})
        self.answer(200, {"choices": [{"message": {"content": "tokens=%s" % req["max_tokens"]}}], "usage": {"prompt_tokens": 5}})


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

CASES = 7  # serve_media.bad_cases
# What the server says while loading, as the probe quotes an answer (its first 300 characters).
LOADING = "503 " + json.dumps({"choices": [{"message": {"content": "loading the model" + " ." * 200}}]})


@pytest.fixture
def serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """mode -> the probe's whole result against the server started in that mode."""
    script = tmp_path / "server.py"
    script.write_text(SERVER)

    def run(mode: str, stage_timeout: float = 15) -> dict:  # type: ignore[type-arg]
        # The stage's deadline, which also ends a readiness that never turns into serving.
        monkeypatch.setenv("IMAGEGATE_STAGE_TIMEOUT", str(stage_timeout))
        params = {"command": [sys.executable, str(script), "{port}", mode], "startup_timeout": 10}
        out: list[dict] = []  # type: ignore[type-arg]
        probe = threading.Thread(target=lambda: out.append(load("serve").run(params)), daemon=True)
        probe.start()
        probe.join(stage_timeout + 5)
        assert out, f"the probe ran past its stage's deadline ({stage_timeout} s)"
        return out[0]

    return run


def requests(out: dict) -> list[str]:  # type: ignore[type-arg]
    """What the server was sent, in order, as its log says."""
    return [
        ln for ln in out["artifacts"]["server.log"].splitlines() if ln.startswith(("chat", "stream", "bad"))
    ]


def test_a_server_that_serves_and_recovers_passes(serve: Any) -> None:
    out = serve("good")
    assert out["status"] == "PASS", out["detail"]
    truth = out["data"]["readiness"]
    # A real request, of one token, answered.
    assert truth == {
        "first_request": '200 {"choices": [{"message": {"content": "tokens=1"}}], "usage": {"prompt_tokens": 5}}',
        "early": False,
    }
    assert "serving_s" not in out["data"]["timeline"]
    cases = out["data"]["bad_media"]
    assert len(cases) == CASES and {(c["outcome"], c["recovery"]) for c in cases} == {("refused", "ok")}
    # After each bad request, the next one: a real request of one token.
    sent = requests(out)
    assert sent[:3] == ["chat max_tokens=1", "stream", "chat max_tokens=4"]
    assert sent[3:] == [
        f"bad media {n}" if i % 2 == 0 else "chat max_tokens=1"
        for i, n in ((i, i // 2 + 1) for i in range(2 * CASES))
    ]


def test_readiness_before_the_first_real_answer_is_named_with_when_it_served(serve: Any) -> None:
    out = serve("early")
    assert out["status"] == "FAIL"
    timeline, truth = out["data"]["timeline"], out["data"]["readiness"]
    # An error answer is no answer, whatever its body looks like; nor is a 200 without text.
    assert truth == {"first_request": LOADING[:300], "early": True}
    assert requests(out)[:5] == ["chat max_tokens=1"] * 4 + ["stream"]
    assert timeline["ready_s"] < timeline["serving_s"] < timeline["ready_s"] + 3
    assert timeline["serving_s"] == round(timeline["serving_s"], 3)
    assert out["detail"] == (
        "readiness answered at %.1fs while a 1-token request failed (%s); it served from %.1fs"
        % (timeline["ready_s"], LOADING[:200], timeline["serving_s"])
    )
    # Once it served, the rest of the stage ran as usual.
    assert len(out["data"]["bad_media"]) == CASES


def test_readiness_that_never_turns_into_serving_fails_the_stage(serve: Any) -> None:
    out = serve("never", stage_timeout=3)
    assert out["status"] == "FAIL"
    ready_s = out["data"]["timeline"]["ready_s"]
    assert out["detail"] == "readiness answered at %.1fs but no request was served: %s" % (
        ready_s,
        LOADING[:200],
    )
    assert "bad_media" not in out["data"] and "serving_s" not in out["data"]["timeline"]
    assert set(requests(out)) == {"chat max_tokens=1"}


def test_a_bad_request_the_server_fails_on_is_named_with_the_servers_own_line(serve: Any) -> None:
    out = serve("server_error")
    assert out["status"] == "FAIL"
    first = out["data"]["bad_media"][0]
    line = "ValueError: cannot decode the media of request 1"
    assert (first["outcome"], first["server_line"], first["recovery"]) == ("server_error", line, "ok")
    assert out["detail"].startswith(
        f"bad media truncated_png: answered 500 (a client error, 4xx, expected); server: {line}; "
    )


@pytest.mark.parametrize(
    ("mode", "recovery"),
    [
        # An error status is no answer, even with a chat's text in its body.
        (
            "next_fails",
            ("the next request: 500 " + json.dumps({"choices": [{"message": {"content": "x" * 400}}]}))[:218],
        ),
        ("next_empty", 'the next request: 200 {"choices": [], "usage": {"prompt_tokens": 5}}'),
        (
            "health_503",
            ('/health answered 503 {"ok": false, "why": "' + "x" * 300)[: len("/health answered ") + 200],
        ),
        ("health_102", "/health answered 102 "),
    ],
)
def test_a_server_that_does_not_recover_after_a_bad_request_fails_naming_the_case(
    serve: Any, mode: str, recovery: str
) -> None:
    out = serve(mode)
    assert out["status"] == "FAIL"
    cases = out["data"]["bad_media"]
    # The first case broke it for a moment; the others were sent and judged each on its own.
    assert [c["recovery"] for c in cases] == [recovery] + ["ok"] * (CASES - 1)
    assert out["detail"].startswith("after bad media truncated_png the server did not recover: " + recovery)


def test_a_server_that_dies_of_a_bad_request_is_named_with_its_exit(serve: Any) -> None:
    out = serve("dies")
    assert out["status"] == "FAIL"
    # Refused, then gone (it hung up first, then exited): the case says how it ended, and no
    # other case is sent.
    assert [(c["case"], c["outcome"], c["recovery"]) for c in out["data"]["bad_media"]] == [
        ("truncated_png", "refused", "the server exited 3")
    ]
    assert out["detail"] == "after bad media truncated_png the server did not recover: the server exited 3"
