"""A referrers front: a stand-in for a registry that serves the OCI 1.1 referrers API, since
Debian's docker-registry (distribution 2.8) does not and no registry that does installs here.
It passes every request to the real registry and adds only the API: a pushed manifest with a
`subject` is indexed (and answered with `OCI-Subject`), `GET /v2/NAME/referrers/DIGEST` lists
them, and a manifest the registry deleted is unlisted. Named as a fake; everything else is the real registry's answer.
Given a `Paging`, it pages the listing as the distribution spec lets a registry (`Link: <…>;
rel="next"`, N entries a page), or as a hostile one might: a cycle, a link to another host or
scheme, pages without end."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from imagegate.domain.digest import digest_of

_REFERRERS = re.compile(
    r"^/v2/(?P<repo>.+)/referrers/(?P<digest>sha256:[0-9a-f]{64})(?:\?page=(?P<page>[0-9]+))?$"
)
_MANIFEST = re.compile(r"^/v2/(?P<repo>.+)/manifests/(?P<ref>[^/]+)$")
INDEX = "application/vnd.oci.image.index.v1+json"


@dataclass
class Paging:
    """How the front pages a referrers listing: `per_page` entries a page (page K at
    `?page=K`), each page but the last linking to the next as `links` says: "next" (the spec's),
    "cycle" (the last page links back to the first), "host" (the next page named by another
    host name of this front), "scheme" (by https), "port" (another port), "lost" (to a path the
    registry has not), "other" (to the registry's `/v2/`, no index), "html" (the pages after the
    first an HTML page, as a catch-all answers), "endless" (empty pages after the last, each
    linking on). Its index pages say their media type with a charset, as HTTP allows. `served`: the pages asked for, in order. Changed at will while the front runs."""

    per_page: int = 2
    links: str = "next"
    served: list[str] = field(default_factory=list)

    def page(
        self, listed: list[dict[str, Any]], path: str, k: int, port: int
    ) -> tuple[list[Any], str | None]:
        """Page `k` of `listed` and its Link header (None: the last page, no header)."""
        self.served.append(f"{path}?page={k}")
        chunk = listed[(k - 1) * self.per_page : k * self.per_page]
        more = k * self.per_page < len(listed) or self.links == "endless"
        if not more:
            return chunk, (f'<{path}>; rel="next"' if self.links == "cycle" and k > 1 else None)
        target = {
            "host": f"http://localhost:{port}{path}?page={k + 1}",
            "scheme": f"https://127.0.0.1:{port}{path}?page={k + 1}",
            "port": f"http://127.0.0.1:1{path}?page={k + 1}",  # another port: another origin
            "lost": f"{path}/gone",  # the registry's 404
            "other": "/v2/",  # the registry's `{}`: JSON, no index
        }.get(self.links, f"{path}?page={k + 1}")
        return chunk, f'<{target}>; rel="next"'


@contextmanager
def referrers_front(upstream: str, paging: Paging | None = None) -> Iterator[str]:
    """host:port of a front for the registry at `upstream` (host:port); `paging`: its listings
    paged so (else one page)."""
    index: dict[tuple[str, str], list[dict[str, Any]]] = {}
    client = httpx.Client(base_url=f"http://{upstream}", timeout=30)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
            self.send_response(status)
            for k, v in headers.items():
                if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            m = _REFERRERS.match(self.path)
            if m and self.command == "GET":
                self._list(index.get((m["repo"], m["digest"]), []), m["page"])
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("content-length",)}
            resp = client.request(self.command, self.path, headers=headers, content=body)
            extra = {}
            m = _MANIFEST.match(self.path)
            if m and self.command == "PUT" and resp.status_code == 201:
                extra = self._index(m["repo"], body)
            if m and self.command == "DELETE" and resp.status_code == 202:
                # A deleted manifest is no longer a referrer (what a registry with the API does).
                for listed in index.values():
                    listed[:] = [e for e in listed if e["digest"] != m["ref"]]
            self._send(resp.status_code, {**dict(resp.headers), **extra}, resp.content)

        def _list(self, listed: list[dict[str, Any]], page: str | None) -> None:
            headers = {"Content-Type": INDEX}
            if paging is not None and paging.links == "html" and int(page or 1) > 1:
                self._send(200, {"Content-Type": "text/html"}, b"<html>not here</html>")
                return
            if paging is not None:
                headers["Content-Type"] = f"{INDEX}; charset=utf-8"
                path = self.path.partition("?")[0]
                port = self.server.server_address[1]
                listed, link = paging.page(listed, path, int(page or 1), int(port))
                headers |= {"Link": link} if link else {}
            doc = {"schemaVersion": 2, "mediaType": INDEX, "manifests": listed}
            self._send(200, headers, json.dumps(doc).encode())

        def _index(self, repo: str, body: bytes) -> dict[str, str]:
            doc = json.loads(body)
            subject = doc.get("subject")
            if not isinstance(subject, dict):
                return {}
            entry = {
                "mediaType": doc.get("mediaType"),
                "digest": digest_of(body),
                "size": len(body),
                "artifactType": doc.get("artifactType"),
                "annotations": doc.get("annotations") or {},
            }
            listed = index.setdefault((repo, subject["digest"]), [])
            if entry not in listed:
                listed.append(entry)
            return {"OCI-Subject": subject["digest"]}

        do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _forward

    with ThreadingHTTPServer(("127.0.0.1", 0), Handler) as server, client:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
