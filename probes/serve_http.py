"""Bounded HTTP to the server under test (loopback only): every answer read up to a cap, every
call ended at its own deadline (the request's timeout, from connect to the last byte); a failure
is data (status None and the reason), never an exception."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time

BODY_CAP = 1024 * 1024
LINE_CAP = 256 * 1024


class Deadline:
    """Ends one request at its deadline whatever the server sends. A socket timeout bounds each
    read alone, so a server that trickles a byte now and then would hold the request until the
    stage's own deadline; at this one the socket is shut and the blocked read returns."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float) -> None:
        self.conn = conn
        self.seconds = seconds
        self.passed = False
        self.timer = threading.Timer(max(0.05, seconds), self.fire)
        self.timer.daemon = True

    def fire(self) -> None:
        self.passed = True
        sock = self.conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def said(self) -> str:
        return "no whole answer within the request's %.3g s (request_timeout)" % self.seconds

    def __enter__(self) -> Deadline:
        self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.timer.cancel()


class Answer:
    def __init__(self, status=None, body=b"", error=None, seconds=0.0) -> None:
        self.status = status
        self.body = body
        self.error = error
        self.seconds = seconds

    def json(self):
        try:
            value = json.loads(self.body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return None
        return value if isinstance(value, dict) else None

    def said(self) -> str:
        """One line: what the server answered."""
        if self.status is None:
            return "no answer (%s)" % self.error
        text = self.body[:300].decode("utf-8", "replace").replace("\n", " ")
        return "%d %s" % (self.status, text)


def request(host: str, port: int, method: str, path: str, body=None, timeout: float = 10.0) -> Answer:
    started = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=max(0.05, timeout))
    with Deadline(conn, timeout) as deadline:
        try:
            data = None if body is None else json.dumps(body).encode("utf-8")
            conn.request(method, path, data, {"Content-Type": "application/json"})
            r = conn.getresponse()
            raw = r.read(BODY_CAP + 1)
            if not deadline.passed:
                return Answer(r.status, raw[:BODY_CAP], None, time.monotonic() - started)
        except (OSError, http.client.HTTPException) as e:
            if not deadline.passed:
                return Answer(None, b"", "%s: %s" % (type(e).__name__, e), time.monotonic() - started)
        finally:
            conn.close()
    return Answer(None, b"", deadline.said(), time.monotonic() - started)


def stream(host: str, port: int, path: str, body, timeout: float) -> dict:
    """A streamed chat completion: seconds to the first content delta, the text, [DONE] seen."""
    started = time.monotonic()
    out = {
        "status": None,
        "first_token_s": None,
        "text": "",
        "done": False,  # [DONE], or a chunk with a finish_reason (not every server sends [DONE])
        "error": None,
        "events": 0,
    }
    conn = http.client.HTTPConnection(host, port, timeout=max(0.05, timeout))
    with Deadline(conn, timeout) as deadline:
        try:
            conn.request("POST", path, json.dumps(body).encode("utf-8"), {"Content-Type": "application/json"})
            r = conn.getresponse()
            out["status"] = r.status
            if r.status != 200:
                out["error"] = r.read(BODY_CAP)[:300].decode("utf-8", "replace")
            else:
                read_events(r, out, started, time.monotonic() + timeout)
        except (OSError, http.client.HTTPException) as e:
            out["error"] = "%s: %s" % (type(e).__name__, e)
        finally:
            conn.close()
    if deadline.passed and not out["done"]:
        out["error"] = deadline.said()
    return out


def read_events(r, out: dict, started: float, deadline: float) -> None:
    total = 0
    while time.monotonic() < deadline and total < BODY_CAP:
        line = r.readline(LINE_CAP)
        if not line:
            return
        total += len(line)
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            out["done"] = True
            return
        out["events"] += 1
        piece, finished = delta_text(payload)
        if piece and out["first_token_s"] is None:
            out["first_token_s"] = round(time.monotonic() - started, 3)
        out["text"] += piece
        out["done"] = out["done"] or finished


def delta_text(payload: bytes) -> tuple:
    """(text of the chunk's delta, whether the chunk says the answer finished)."""
    try:
        choice = json.loads(payload.decode("utf-8"))["choices"][0]
        return (choice.get("delta") or {}).get("content") or "", bool(choice.get("finish_reason"))
    except (ValueError, UnicodeDecodeError, KeyError, IndexError, TypeError, AttributeError):
        return "", False


def listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def chat_text(answer: Answer):
    """(text, prompt_tokens) of a chat completion answer; text None when there is none."""
    doc = answer.json() or {}
    try:
        text = doc["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        text = None
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    return (text if isinstance(text, str) else None), usage.get("prompt_tokens")
