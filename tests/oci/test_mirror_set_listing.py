"""A mirror set's listings as a registry answers them, hostile ones included: names that are no
repository or tag are skipped and said, a page that is no list of names is refused, named. A
small HTTP server plays the registry's two listing endpoints (the real registry's answers are in
tests/oci/test_audit_mirrors.py)."""

from __future__ import annotations

import http.server
import json
from collections.abc import Iterator

import pytest

from imagegate.oci.registry import RegistryClient, RegistryError
from imagegate.usecases.audit.expand import expand
from imagegate.usecases.audit.imagelist import MirrorSet
from tests.oci.infra import local_http


class Lists(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    bodies: dict[str, bytes]

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = self.bodies.get(self.path.split("?")[0])
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body or b"")))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body or b"")
        self.close_connection = True


@pytest.fixture
def served() -> Iterator[tuple[str, dict[str, bytes]]]:
    bodies: dict[str, bytes] = {}
    with local_http(type("H", (Lists,), {"bodies": bodies})) as host:
        yield host, bodies


def _client(host: str) -> RegistryClient:
    return RegistryClient(host, lookup=False, retries=0)


def test_names_that_are_no_repository_or_tag_are_skipped_and_said(
    served: tuple[str, dict[str, bytes]],
) -> None:
    host, bodies = served
    long_bad = "-" + "x" * 199  # a tag may not start with "-"; said cut to 80 characters
    bodies["/v2/_catalog"] = json.dumps({"repositories": ["ns/Bad", "other/app", "ns/app", "ns/b"]}).encode()
    bodies["/v2/ns/app/tags/list"] = json.dumps({"tags": ["v1", long_bad, "v1", "v2"]}).encode()
    bodies["/v2/ns/b/tags/list"] = json.dumps({"tags": ["v9"]}).encode()
    skipped: list[str] = []
    ms = MirrorSet(mirror=f"{host}/ns/*", official="docker.io/x/{repository}:{tag}")
    pairs = expand(ms, skipped, _client(host))
    assert [(p.mirror, p.official, p.name) for p in pairs] == [
        (f"docker://{host}/ns/app:v1", "docker.io/x/app:v1", "ns/app:v1"),
        (f"docker://{host}/ns/app:v2", "docker.io/x/app:v2", "ns/app:v2"),
        (f"docker://{host}/ns/b:v9", "docker.io/x/b:v9", "ns/b:v9"),
    ]
    assert skipped == [f"{host}/ns/Bad: not a repository name", f"ns/app: {long_bad[:80]!r} is not a tag"]


def test_a_set_of_one_repository_names_it_by_its_last_part(served: tuple[str, dict[str, bytes]]) -> None:
    host, bodies = served
    bodies["/v2/team/vllm/openai/tags/list"] = json.dumps({"tags": ["v1", "latest"]}).encode()
    ms = MirrorSet(
        mirror=f"{host}/team/vllm/openai", official="d.example/vllm/{repository}:{tag}", tags=["v*"]
    )
    (pair,) = expand(ms, [], _client(host))
    assert (pair.official, pair.mirror) == (
        "d.example/vllm/openai:v1",
        f"docker://{host}/team/vllm/openai:v1",
    )
    bodies["/v2/app/tags/list"] = json.dumps({"tags": ["v1"]}).encode()  # a repository at the top
    (top,) = expand(
        MirrorSet(mirror=f"{host}/app", official="d.example/{repository}:{tag}"), [], _client(host)
    )
    assert top.official == "d.example/app:v1"


@pytest.mark.parametrize(
    "body",
    [b"not json", b'{"tags": "v1"}', b'{"tags": [1]}', json.dumps({"tags": ["a" * 257]}).encode()],
    ids=["not-json", "a-string", "a-number", "a-257-byte-name"],
)
def test_a_page_that_is_no_list_of_names_is_refused(
    served: tuple[str, dict[str, bytes]], body: bytes
) -> None:
    host, bodies = served
    bodies["/v2/team/app/tags/list"] = body
    with pytest.raises(RegistryError) as e:
        _client(host).list_tags("team/app")
    assert "the tags list" in str(e.value) and "(/v2/team/app/tags/list)" in str(e.value)


def test_names_up_to_256_bytes_and_an_empty_page_are_read(served: tuple[str, dict[str, bytes]]) -> None:
    host, bodies = served
    bodies["/v2/team/app/tags/list"] = json.dumps({"tags": ["a" * 256]}).encode()
    bodies["/v2/_catalog"] = json.dumps({"repositories": None}).encode()
    assert _client(host).list_tags("team/app") == ["a" * 256]
    assert _client(host).catalog() == []
