"""A moving-tag front: a stand-in for a registry whose tag is re-pointed while a command reads it
(a push landing between two reads, or a registry answering differently on purpose), which no
real registry does on cue. It passes every request to the real registry, except a read of one
tag's manifest (GET or HEAD /v2/NAME/manifests/TAG): the first `first_reads` of them are
answered with what the real registry holds under tag `first`, every later one with tag `then`.
Both images are really pushed there, so every read by digest (manifests, configs, layers)
passes through. Named as a fake; everything else is the real registry's answer."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx


@dataclass
class MovingTag:
    host: str  # host:port of the front
    reads: int = 0  # of the moving tag so far

    def ref(self, repository: str, tag: str) -> str:
        return f"{self.host}/{repository}:{tag}"


@contextmanager
def moving_tag_front(
    upstream: str, repository: str, tag: str, first: str, then: str, first_reads: int = 1
) -> Iterator[MovingTag]:
    """A front for the registry at `upstream` (host:port) in which `repository:tag` names the
    image tagged `first` for its first `first_reads` reads and the one tagged `then` after."""
    client = httpx.Client(base_url=f"http://{upstream}", timeout=30)
    moving = f"/v2/{repository}/manifests/{tag}"
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            path = self.path
            if path == moving and self.command in ("GET", "HEAD"):
                with lock:
                    state.reads += 1
                    now = first if state.reads <= first_reads else then
                path = f"/v2/{repository}/manifests/{now}"
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("content-length", "host")}
            resp = client.request(self.command, path, headers=headers, content=body)
            self.send_response(resp.status_code)
            for k, v in resp.headers.items():
                if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(k, v)
            self.send_header("Content-Length", resp.headers.get("Content-Length", str(len(resp.content))))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(resp.content)

        do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _forward

    with ThreadingHTTPServer(("127.0.0.1", 0), Handler) as server, client:
        state = MovingTag(f"127.0.0.1:{server.server_address[1]}")
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield state
        finally:
            server.shutdown()
