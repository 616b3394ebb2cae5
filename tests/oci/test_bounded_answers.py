"""A registry's small answers are read within their bounds, each to the byte: "1 MiB for a token
answer; 64 KiB of an error" (docs/how-it-works.md). The server is a real HTTP server on
127.0.0.1 that answers with bodies of exactly the size each case asks for, just at and just over
each bound; tests/oci/test_hostile_answers.py shows the same bounds end whole commands in
bounded memory. These run in seconds, in process: scripts/mutation.py runs them against
oci/registry.py's bounded reads."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from imagegate.oci import registry
from imagegate.oci.registry import AuthenticationError, NotFound, RegistryClient, RegistryError, read_capped
from tests.oci.infra import local_http

KIB, MIB = 1 << 10, 1 << 20


def _token_answer(size: int) -> bytes:
    """A token answer of exactly `size` bytes: a short token, padded (a token server may add
    fields; the token itself goes back in a header, whose length servers bound)."""
    empty = json.dumps({"token": "t", "pad": ""}).encode()
    return json.dumps({"token": "t", "pad": "x" * (size - len(empty))}).encode()


def _error_body(size: int) -> bytes:
    """A registry error answer of exactly `size` bytes: its message is the readable part."""
    empty = json.dumps({"errors": [{"code": "NAME_UNKNOWN", "message": ""}]}).encode()
    doc = {"errors": [{"code": "NAME_UNKNOWN", "message": "m" * (size - len(empty))}]}
    return json.dumps(doc).encode()


@dataclass
class Answers:
    """What the server sends: the token answer's and the error answer's bodies, and how."""

    token: bytes = b'{"token": "t"}'
    error: bytes = b""
    declare: str | None = None  # a Content-Length to send instead of the body's own
    chunked: bool = False  # no length at all: the body goes on until it is sent
    seen: list[str] = field(default_factory=list)


class Server(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    answers: Answers

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes) -> None:
        a = self.answers
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if a.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", a.declare or str(len(body)))
        # It closes the connection after each answer: said so, or a client may send its next
        # request on it first (a race a loaded machine loses: "Server disconnected").
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            if a.chunked:
                for i in range(0, len(body), 4096):
                    part = body[i : i + 4096]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.write(b"0\r\n\r\n")
            elif a.declare is None:
                self.wfile.write(body)
            else:  # a length it never keeps to: as much as a client reads, up to 1 MiB
                self.wfile.write(b"x" * MIB)
        except OSError:
            pass  # the client stopped reading at its bound
        self.close_connection = True

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        self.answers.seen.append(path)
        if path == "/token":
            self._send(200, self.answers.token)
        elif path.startswith("/v2/private/"):
            self.send_response(401)
            host = self.headers["Host"]
            self.send_header("WWW-Authenticate", f'Bearer realm="http://{host}/token",service="s"')
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._send(404, self.answers.error)


@pytest.fixture
def served() -> Iterator[tuple[str, Answers]]:
    answers = Answers()
    handler = type("Handler", (Server,), {"answers": answers})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", answers
    finally:
        server.shutdown()
        server.server_close()


def _client(host: str) -> RegistryClient:
    return RegistryClient(host, lookup=False, retries=0)


def test_the_bounds_are_those_the_docs_name() -> None:
    assert registry.MAX_TOKEN_BYTES == 1 * MIB
    assert registry.MAX_ERROR_BYTES == 64 * KIB


@pytest.mark.parametrize("how", ["declared", "chunked"])
def test_a_token_answer_is_read_up_to_1_mib_and_refused_over_it(
    served: tuple[str, Answers], how: str
) -> None:
    host, answers = served
    answers.chunked = how == "chunked"
    answers.token = _token_answer(1 * MIB)
    # at the bound the token is taken and sent (this server refuses every token: a 401 after it)
    with (
        _client(host) as c,
        pytest.raises(AuthenticationError, match="authentication failed for /v2/private/"),
    ):
        c.get_manifest("private", "latest")
    assert answers.seen == ["/v2/private/manifests/latest", "/token", "/v2/private/manifests/latest"]
    answers.token = _token_answer(1 * MIB + 1)
    with _client(host) as c, pytest.raises(RegistryError) as e:
        c.get_manifest("private", "latest")
    said = "the token server's answer is larger than 1048576 bytes"
    assert said in str(e.value) and str(e.value).startswith(f"{host}: "), e.value
    assert ("(it declares 1048577)" in str(e.value)) is (how == "declared")


def test_an_error_answer_is_read_up_to_64_kib_and_cut_there(served: tuple[str, Answers]) -> None:
    host, answers = served
    for how in (False, True):
        answers.chunked = how
        # exactly 64 KiB: the whole answer is read, and its message shown (cut to 500 characters)
        answers.error = _error_body(64 * KIB)
        with _client(host) as c, pytest.raises(NotFound) as e:
            c.get_manifest("gone", "latest")
        text = ("NAME_UNKNOWN: " + "m" * (64 * KIB))[:500]
        assert str(e.value) == f"{host}: /v2/gone/manifests/latest not found (404: {text})"
        # one byte more: the answer is cut at the bound (never an error of its own), so the JSON
        # is incomplete and the status's own words are shown
        answers.error = _error_body(64 * KIB + 1)
        with _client(host) as c, pytest.raises(NotFound) as e:
            c.get_manifest("gone", "latest")
        assert str(e.value) == f"{host}: /v2/gone/manifests/latest not found (404: Not Found)", e.value
    # an error answer that declares 10 GB is read to the bound only, not refused for its size
    answers.chunked, answers.declare, answers.error = False, str(10 << 30), b""
    with _client(host) as c, pytest.raises(NotFound, match=r"not found \(404: Not Found\)"):
        c.get_manifest("gone", "latest")


def test_read_capped_refuses_a_declared_length_over_the_limit_before_reading(
    served: tuple[str, Answers],
) -> None:
    host, answers = served
    answers.token = b"0123456789"
    with httpx.Client() as http:
        for limit, ok in ((10, True), (9, False)):
            resp = http.send(http.build_request("GET", f"http://{host}/token"), stream=True)
            if ok:
                assert read_capped(resp, limit, "the answer") == b"0123456789"
                assert resp.content == b"0123456789" and resp.is_closed
            else:
                with pytest.raises(
                    RegistryError, match=r"^the answer is larger than 9 bytes \(it declares 10\)$"
                ):
                    read_capped(resp, limit, "the answer")
                assert resp.is_closed
        # the same body without a length: read until it goes over, then refused; truncated on request
        answers.chunked = True
        resp = http.send(http.build_request("GET", f"http://{host}/token"), stream=True)
        with pytest.raises(RegistryError, match=r"^the answer is larger than 9 bytes \(more was sent\)$"):
            read_capped(resp, 9, "the answer")
        resp = http.send(http.build_request("GET", f"http://{host}/token"), stream=True)
        assert read_capped(resp, 9, "the answer", truncate=True) == b"012345678"
        assert resp.content == b"012345678"
        resp = http.send(http.build_request("GET", f"http://{host}/token"), stream=True)
        assert read_capped(resp, 10, "the answer") == b"0123456789"


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"errors": [{"code": "DENIED", "message": "no"}, {"code": "X"}]}, "DENIED: no; X"),
        (
            {"errors": ["junk", {"message": "only a message"}]},
            "only a message",
        ),  # what is no entry: passed over
        ({"errors": [{"code": "", "message": ""}]}, "404"),  # nothing said: the status's number
        ({"errors": []}, "Not Found"),  # no entries: the status's words
        (["not", "an", "object"], "Not Found"),
    ],
)
def test_an_error_answer_is_said_in_the_registrys_words_where_it_has_any(
    served: tuple[str, Answers], body: object, said: str
) -> None:
    host, answers = served
    answers.error = json.dumps(body).encode()
    with _client(host) as c, pytest.raises(NotFound) as e:
        c.get_manifest("gone", "latest")
    assert str(e.value) == f"{host}: /v2/gone/manifests/latest not found (404: {said})"


def test_a_connection_that_breaks_while_reading_is_named(served: tuple[str, Answers]) -> None:
    """An answer that declares 2 MiB and stops after 1: the read fails naming what was read."""
    host, answers = served
    answers.declare = str(2 * MIB)
    with httpx.Client() as http:
        resp = http.send(http.build_request("GET", f"http://{host}/token"), stream=True)
        with pytest.raises(
            RegistryError,
            match=r"^the answer: the connection failed while reading \(peer closed connection without sending",
        ):
            read_capped(resp, 4 * MIB, "the answer")
        assert resp.is_closed


class Listing(http.server.BaseHTTPRequestHandler):
    """A registry's tag list and catalog that never end: each page a full one and a `next` link."""

    protocol_version = "HTTP/1.1"
    names = 1000
    pages: list[str]

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.pages.append(self.path)
        key = "repositories" if self.path.startswith("/v2/_catalog") else "tags"
        body = json.dumps({key: [f"n{len(self.pages)}-{i}" for i in range(self.names)]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Link", f'<{self.path.split("?")[0]}?n=1000&last=x{len(self.pages)}>; rel="next"')
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True


@pytest.mark.parametrize("names", [1000, 10])
def test_a_listing_is_bounded_in_names_and_pages(names: int) -> None:
    """10 000 names, or 100 pages: a listing past either is refused, named, never read further."""
    pages: list[str] = []
    with local_http(type("Handler", (Listing,), {"pages": pages, "names": names})) as host:
        client = _client(host)
        for listing in (lambda: client.list_tags("team/app"), client.catalog):
            pages.clear()
            with pytest.raises(RegistryError) as e:
                listing()
            if names == 1000:  # 10 000 names after the tenth page: the eleventh is refused
                assert "lists more than 10000" in str(e.value) and len(pages) == 11
            else:
                assert "has more than 100 pages" in str(e.value) and len(pages) == registry.MAX_LIST_PAGES
            assert "name the tags (or repositories) to audit in the inventory" in (e.value.hint or "")
            assert pages[0].endswith("?n=1000")
