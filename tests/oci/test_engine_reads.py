"""The engine's JSON answers on a local socket (oci/engineapi.py), read without the Docker SDK: the
request as the SDK makes it, every answer bounded (the declared length first, at most
MAX_ENGINE_JSON_BYTES read, an error body's first 64 KiB), its fields typed, an error status
named with the engine's own message, a silent engine cut at the read timeout or the deadline.

A real HTTP server on a unix socket (the standard library's), in this process: what it sends is
set per test; it records each request's path and how many body bytes it got out."""

from __future__ import annotations

import gzip
import http.server
import json
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from imagegate._support import deadline
from imagegate.errors import EngineError
from imagegate.oci import engineapi
from imagegate.oci.engineapi import MAX_ENGINE_JSON_BYTES, MAX_ERROR_BYTES, EngineAnswered, EngineNotFound

VERSION = {"Version": "28.2.2", "ApiVersion": "1.50", "Os": "linux", "Arch": "amd64", "Components": []}
IMAGE = {"Id": "sha256:" + "a" * 64, "RepoDigests": ["r/x@sha256:" + "b" * 64], "Os": "linux"}
Answer = Callable[["Handler"], None]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Engine | TcpEngine

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        answer = self.server.answers.get(self.path.split("?")[0])
        if answer is None:
            send(self, {"message": f"no such thing: {self.path}"}, 404)
        else:
            answer(self)


class Engine(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str) -> None:
        super().__init__(path, Handler)
        self.paths: list[str] = []
        self.sent = 0  # body bytes written by stream answers
        self.answers: dict[str, Answer] = {"/version": lambda h: send(h, VERSION)}


def send(h: Handler, doc: object, status: int = 200, raw: bytes | None = None, encoding: str = "") -> None:
    body = json.dumps(doc).encode() if raw is None else raw
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    if encoding:
        h.send_header("Content-Encoding", encoding)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def stream(declared: str | None = None, status: int = 200) -> Answer:
    """An endless body (chunked, or under a declared length), its bytes counted as they go."""

    def answer(h: Handler) -> None:
        h.send_response(status)
        h.send_header("Content-Length", declared) if declared else h.send_header(
            "Transfer-Encoding", "chunked"
        )
        h.end_headers()
        chunk = b'{"message":"' + b"x" * (1 << 16)
        try:
            for _ in range(4 * MAX_ENGINE_JSON_BYTES // len(chunk)):
                h.wfile.write(chunk if declared else b"%x\r\n%s\r\n" % (len(chunk), chunk))
                h.server.sent += len(chunk)
        except OSError:
            pass  # the client stopped reading
        h.close_connection = True

    return answer


def silent(h: Handler) -> None:
    time.sleep(3)  # no byte: the client's read timeout or deadline ends the wait


class TcpEngine(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """The same answers on 127.0.0.1 (DOCKER_HOST=tcp://…): read through the Docker SDK's session."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.paths: list[str] = []
        self.sent = 0
        self.answers: dict[str, Answer] = {"/version": lambda h: send(h, VERSION)}


@pytest.fixture
def tcp_engine() -> Iterator[TcpEngine]:
    server = TcpEngine()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    server = Engine(str(tmp_path / "engine.sock"))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _connect(engine: Engine, timeout: float = 5) -> engineapi.Engine:
    return engineapi.connect(f"unix://{engine.server_address}", timeout=timeout)


def test_the_request_is_the_sdks_at_the_engines_version(engine: Engine) -> None:
    engine.answers["/v1.50/images/reg:5000/a b/json"] = lambda h: send(h, {})
    engine.answers["/v1.50/images/reg:5000/team/app:1/json"] = lambda h: send(h, IMAGE)
    engine.answers["/v1.50/containers/json"] = lambda h: send(h, [])
    e = _connect(engine)
    assert (e.api_version, e.socket_path, engineapi.engine_endpoint(e)) == (
        "1.50",
        str(engine.server_address),
        f"unix://{engine.server_address}",
    )
    assert engineapi.inspect_image(e, "reg:5000/team/app:1") == IMAGE
    assert engineapi.get_json(e, "/containers/json", params={"all": "1", "filters": '{"label": ["x"]}'}) == []
    with pytest.raises(EngineError):
        engineapi.inspect_image(e, "reg:5000/a b")  # quoted as the SDK quotes it: a space is %20
    assert engine.paths == [
        "/version",  # unversioned: the version is what it tells
        "/v1.50/images/reg:5000/team/app:1/json",
        "/v1.50/containers/json?all=1&filters=%7B%22label%22%3A+%5B%22x%22%5D%7D",
        "/v1.50/images/reg:5000/a%20b/json",
    ]


def test_an_unset_or_empty_unix_address_is_the_default_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert engineapi.Engine(None, timeout=1).socket_path == "/var/run/docker.sock"
    assert engineapi.Engine("unix://", timeout=1).socket_path == "/var/run/docker.sock"
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/podman.sock")
    assert engineapi.Engine(None, timeout=1).socket_path == "/run/podman.sock"
    assert engineapi.Engine("tcp://127.0.0.1:2375", timeout=1).socket_path is None  # the SDK's session


def test_a_declared_length_over_the_limit_is_refused_before_its_body(engine: Engine) -> None:
    engine.answers["/v1.50/images/huge/json"] = stream(declared=str(10 << 30))
    e = _connect(engine)
    with pytest.raises(EngineError, match=f"declares {10 << 30}"):
        engineapi.inspect_image(e, "huge")


def test_an_endless_answer_is_read_to_the_limit_only(engine: Engine) -> None:
    engine.answers["/v1.50/images/endless/json"] = stream()
    e = _connect(engine)
    with pytest.raises(EngineError, match=f"larger than {MAX_ENGINE_JSON_BYTES} bytes"):
        engineapi.inspect_image(e, "endless")
    # What the server got out before the client closed: the limit and the socket buffers, not 16 MiB.
    assert engine.sent < MAX_ENGINE_JSON_BYTES + (2 << 20)


def test_an_answer_at_the_limit_is_read(engine: Engine) -> None:
    doc = {"Id": "sha256:" + "c" * 64, "Pad": ""}
    doc["Pad"] = "x" * (MAX_ENGINE_JSON_BYTES - len(json.dumps(doc)))
    engine.answers["/v1.50/images/big/json"] = lambda h: send(h, doc)
    assert engineapi.inspect_image(_connect(engine), "big")["Id"] == doc["Id"]


@pytest.mark.parametrize(
    ("status", "body", "kind", "said"),
    [
        (404, b'{"message":"No such image: gone:1"}', EngineNotFound, "404 No such image: gone:1"),
        (500, b'{"message":"layer store broken"}', EngineAnswered, "500 layer store broken"),
        (400, b"invalid reference format", EngineAnswered, "400 invalid reference format"),
        (409, b'["not", "an", "object"]', EngineAnswered, '409 ["not", "an", "object"]'),
    ],
)
def test_an_error_status_carries_the_engines_words(
    engine: Engine, status: int, body: bytes, kind: type[EngineAnswered], said: str
) -> None:
    engine.answers["/v1.50/images/x/json"] = lambda h: send(h, None, status, raw=body)
    with pytest.raises(EngineAnswered) as caught:
        engineapi.inspect_image(_connect(engine), "x")
    assert type(caught.value) is kind and caught.value.status_code == status
    assert str(caught.value).endswith(f"its answer to GET /images/x/json: {said}")


def test_an_endless_error_body_is_read_to_64_kib(engine: Engine) -> None:
    engine.answers["/v1.50/images/x/json"] = stream(status=500)
    with pytest.raises(EngineAnswered) as caught:
        engineapi.inspect_image(_connect(engine), "x")
    assert caught.value.status_code == 500 and len(caught.value.explanation) == 1000  # cut for a message
    assert engine.sent < MAX_ERROR_BYTES + (2 << 20)


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        ({"Id": ["sha256:" + "a" * 64]}, "`Id` is a list, not a str"),
        ({"Id": ""}, "no `Id`"),
        ({"RepoDigests": []}, "no `Id`"),
        ({**IMAGE, "RepoDigests": [1]}, "`RepoDigests` is not a list of strings"),
        ({**IMAGE, "RepoDigests": "r@sha256:x"}, "`RepoDigests` is a str, not a list"),
        ({**IMAGE, "Variant": 8}, "`Variant` is a int, not a str"),
        ([IMAGE], "is not a JSON object"),
    ],
)
def test_an_images_fields_are_typed(engine: Engine, doc: object, said: str) -> None:
    engine.answers["/v1.50/images/x/json"] = lambda h: send(h, doc)
    with pytest.raises(EngineError, match=said.replace("[", r"\[")):
        engineapi.inspect_image(_connect(engine), "x")


def test_an_image_whose_nulls_are_absent_fields_is_read(engine: Engine) -> None:
    doc = {"Id": "sha256:" + "a" * 64, "RepoDigests": None, "Os": None, "Architecture": None, "Variant": None}
    engine.answers["/v1.50/images/x/json"] = lambda h: send(h, doc)
    assert engineapi.inspect_image(_connect(engine), "x") == doc


@pytest.mark.parametrize(
    ("version", "said"),
    [
        ({**VERSION, "ApiVersion": "1.23"}, "API version 1.23 is older than the SDK supports"),
        ({**VERSION, "ApiVersion": "2.0"}, "has no API version (ApiVersion '2.0')"),
        ({**VERSION, "ApiVersion": None}, "has no API version (ApiVersion None)"),
        ({**VERSION, "Components": [{"Name": 3}]}, "`Components` is not a list of named objects"),
        ({**VERSION, "Components": ["podman"]}, "`Components` is not a list of named objects"),
        ({**VERSION, "Os": ["linux"]}, "`Os` is a list, not a str"),
    ],
)
def test_the_engines_version_is_checked(engine: Engine, version: object, said: str) -> None:
    engine.answers["/version"] = lambda h: send(h, version)
    with pytest.raises(EngineError, match=said.replace("(", r"\(").replace(")", r"\)")):
        _connect(engine)


def test_the_oldest_api_the_sdk_speaks_is_taken(engine: Engine) -> None:
    engine.answers["/version"] = lambda h: send(h, {**VERSION, "ApiVersion": "1.24"})
    assert _connect(engine).api_version == "1.24"


def test_a_version_answer_that_is_not_json_is_said(engine: Engine) -> None:
    engine.answers["/version"] = lambda h: send(h, None, raw=b"<html>proxy</html>")
    with pytest.raises(EngineError, match="its answer to GET /version is not JSON"):
        _connect(engine)


def test_no_engine_at_the_socket_is_not_reachable_naming_it(tmp_path: Path) -> None:
    where = tmp_path / "none.sock"
    with pytest.raises(EngineError) as caught:
        engineapi.connect(f"unix://{where}", timeout=1)
    assert (
        str(caught.value) == f"container engine at unix://{where}: not reachable (no such file or directory)"
    )
    assert caught.value.hint and "DOCKER_HOST" in caught.value.hint


def test_no_engine_at_docker_host_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = tmp_path / "gone.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{where}")
    with pytest.raises(EngineError, match=f"^container engine at unix://{where}: not reachable"):
        engineapi.connect(None, timeout=1)


def test_a_silent_engine_ends_at_the_read_timeout(engine: Engine) -> None:
    e = _connect(engine, timeout=0.5)
    engine.answers["/v1.50/images/x/json"] = silent
    t = time.monotonic()
    with pytest.raises(EngineError, match=r"its answer to GET /images/x/json: not answered \(timed out\)"):
        engineapi.inspect_image(e, "x")
    assert time.monotonic() - t < 2


def test_a_silent_engine_ends_at_the_deadline_naming_the_wait(engine: Engine) -> None:
    e = _connect(engine, timeout=60)
    engine.answers["/v1.50/images/x/json"] = silent
    t = time.monotonic()
    with (
        deadline.covering(0.5),
        pytest.raises(deadline.DeadlineReached, match="its answer to GET /images/x/json"),
    ):
        engineapi.inspect_image(e, "x")
    assert time.monotonic() - t < 2


def test_no_sdk_client_is_made_for_the_reads(engine: Engine) -> None:
    engine.answers["/v1.50/images/x/json"] = lambda h: send(h, IMAGE)
    e = _connect(engine)
    engineapi.inspect_image(e, "x")
    engineapi.version(e)
    assert e._sdk is None
    e.close()  # nothing to close


def test_a_tcp_engine_is_read_through_the_sdks_session_with_the_same_bounds(tcp_engine: TcpEngine) -> None:
    """tcp (and TLS, ssh) addresses keep the SDK's transport: the same bounds, the same errors."""
    tcp_engine.answers["/v1.50/images/x/json"] = lambda h: send(h, IMAGE)
    tcp_engine.answers["/v1.50/images/gone/json"] = lambda h: send(h, {"message": "No such image: gone"}, 404)
    tcp_engine.answers["/v1.50/images/broken/json"] = lambda h: send(h, {"message": "store broken"}, 500)
    tcp_engine.answers["/v1.50/images/huge/json"] = stream(declared=str(10 << 30))
    tcp_engine.answers["/v1.50/images/endless/json"] = stream()
    e = engineapi.connect(f"tcp://127.0.0.1:{tcp_engine.server_address[1]}", timeout=5)
    assert e.socket_path is None and e.api_version == "1.50" and e._sdk is not None
    assert engineapi.inspect_image(e, "x") == IMAGE
    with pytest.raises(EngineNotFound, match="its answer to GET /images/gone/json: 404 No such image: gone"):
        engineapi.inspect_image(e, "gone")
    with pytest.raises(EngineAnswered, match="500 store broken") as caught:
        engineapi.inspect_image(e, "broken")
    assert type(caught.value) is EngineAnswered and caught.value.status_code == 500
    with pytest.raises(EngineError, match=f"declares {10 << 30}"):
        engineapi.inspect_image(e, "huge")
    with pytest.raises(EngineError, match=f"larger than {MAX_ENGINE_JSON_BYTES} bytes"):
        engineapi.inspect_image(e, "endless")
    assert tcp_engine.paths[:2] == [
        "/version",
        "/v1.50/images/x/json",
    ]  # the SDK asked at the engine's version
    e.close()


def test_no_tcp_engine_is_not_reachable_naming_it() -> None:
    with socketserver.TCPServer(("127.0.0.1", 0), Handler) as closed:
        port = closed.server_address[1]  # a port nothing listens on once closed
    with pytest.raises(EngineError, match=f"^container engine at tcp://127.0.0.1:{port}: not reachable"):
        engineapi.connect(f"tcp://127.0.0.1:{port}", timeout=1)


def _both(engine: Engine, tcp_engine: TcpEngine) -> list[tuple[Engine | TcpEngine, engineapi.Engine]]:
    return [
        (engine, _connect(engine)),
        (tcp_engine, engineapi.connect(f"tcp://127.0.0.1:{tcp_engine.server_address[1]}", timeout=5)),
    ]


def test_an_answer_in_an_encoding_not_asked_for_is_not_inflated(
    engine: Engine, tcp_engine: TcpEngine
) -> None:
    """Identity is asked for: a gzip body (a bomb, or an odd proxy) is read as the bytes it is."""
    for server, e in _both(engine, tcp_engine):
        server.answers["/v1.50/images/x/json"] = lambda h: send(
            h, None, raw=gzip.compress(json.dumps(IMAGE).encode()), encoding="gzip"
        )
        server.answers["/v1.50/images/y/json"] = lambda h: send(
            h, None, 500, raw=gzip.compress(b'{"message":"store broken"}'), encoding="gzip"
        )
        with pytest.raises(EngineError, match="its answer to GET /images/x/json is not JSON"):
            engineapi.inspect_image(e, "x")
        with pytest.raises(EngineAnswered) as caught:
            engineapi.inspect_image(e, "y")
        assert caught.value.status_code == 500 and "store broken" not in caught.value.explanation


def test_the_sdks_session_takes_the_same_statuses_and_limits(tcp_engine: TcpEngine) -> None:
    doc = {"Id": "sha256:" + "c" * 64, "Pad": ""}
    doc["Pad"] = "x" * (MAX_ENGINE_JSON_BYTES - len(json.dumps(doc)))
    tcp_engine.answers["/v1.50/images/big/json"] = lambda h: send(h, doc)
    tcp_engine.answers["/v1.50/images/bad/json"] = lambda h: send(
        h, {"message": "invalid reference format"}, 400
    )
    tcp_engine.answers["/v1.50/images/odd/json"] = lambda h: send(h, ["not", "an", "object"], 500)
    e = engineapi.connect(f"tcp://127.0.0.1:{tcp_engine.server_address[1]}", timeout=5)
    assert engineapi.inspect_image(e, "big")["Id"] == doc["Id"]  # at the limit: read
    with pytest.raises(EngineAnswered, match="400 invalid reference format"):
        engineapi.inspect_image(e, "bad")
    # The SDK reads an error's `message` from a JSON object: a list makes it fail, said as ours.
    with pytest.raises(EngineError, match="answered 500 with a malformed error"):
        engineapi.inspect_image(e, "odd")
