"""A referrers front: a stand-in for a registry that serves the OCI 1.1 referrers API, since
Debian's docker-registry (distribution 2.8) does not and no registry that does installs here.
It passes every request to the real registry and adds only the API: a pushed manifest with a
`subject` is indexed (and answered with `OCI-Subject`), `GET /v2/NAME/referrers/DIGEST` lists
them, and a manifest the registry deleted is unlisted. Named as a fake; everything else is the real registry's answer."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from imagegate.oci.digest import digest_of

_REFERRERS = re.compile(r"^/v2/(?P<repo>.+)/referrers/(?P<digest>sha256:[0-9a-f]{64})$")
_MANIFEST = re.compile(r"^/v2/(?P<repo>.+)/manifests/(?P<ref>[^/]+)$")


@contextmanager
def referrers_front(upstream: str) -> Iterator[str]:
    """host:port of a front for the registry at `upstream` (host:port)."""
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
                listed = index.get((m["repo"], m["digest"]), [])
                doc = {
                    "schemaVersion": 2,
                    "mediaType": "application/vnd.oci.image.index.v1+json",
                    "manifests": listed,
                }
                self._send(
                    200, {"Content-Type": "application/vnd.oci.image.index.v1+json"}, json.dumps(doc).encode()
                )
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
