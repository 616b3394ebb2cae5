"""A test wrapper (not a real server) in front of the real `transformers serve`, imitating the
server bugs the serve stage must catch. Usage:

    serve_wrapper.py MODE PORT MODEL

MODE: 500-on-corrupt | early-ready | crash-on-corrupt (tests/images/transformers-serve/README.md).
The real server runs as this process's child on another loopback port, in the same process
group, so whatever kills the wrapper's group kills it too."""

from __future__ import annotations

import base64
import http.client
import http.server
import json
import os
import signal
import socket
import subprocess
import sys

MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def corrupt_image(body: bytes) -> bool:
    """True when the request carries an image part that is not a whole PNG or JPEG."""
    try:
        messages = json.loads(body).get("messages", [])
    except ValueError:
        return False
    for m in messages:
        for part in m.get("content") if isinstance(m.get("content"), list) else []:
            url = (part.get("image_url") or {}).get("url", "") if isinstance(part, dict) else ""
            if not url:
                continue
            raw = url.split(",", 1)[-1]
            try:
                data = base64.b64decode(raw, validate=True)
            except ValueError:
                return True
            if not data.startswith(MAGIC) or not data.rstrip().endswith((b"IEND\xaeB`\x82", b"\xff\xd9")):
                return True
    return False


class Proxy(http.server.BaseHTTPRequestHandler):
    mode = ""
    backend = 0
    child: subprocess.Popen[bytes] | None = None

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write("wrapper: %s\n" % (format % args))

    def do_GET(self) -> None:
        if self.mode == "early-ready" and self.path == "/health":
            return self.answer(200, b'{"status":"ok"}')  # before the real server can serve
        self.forward(b"")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.mode in ("500-on-corrupt", "crash-on-corrupt") and corrupt_image(body):
            sys.stderr.write("wrapper: PIL.UnidentifiedImageError: cannot identify image file\n")
            sys.stderr.flush()
            if self.mode == "crash-on-corrupt":
                os.killpg(os.getpgid(0), signal.SIGKILL)
            return self.answer(500, b'{"detail":"Internal Server Error"}')
        self.forward(body)

    def answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def forward(self, body: bytes) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.backend, timeout=120)
        try:
            conn.request(self.command, self.path, body or None, {"Content-Type": "application/json"})
            r = conn.getresponse()
        except OSError as e:
            return self.answer(503, json.dumps({"detail": "backend: %s" % e}).encode())
        self.send_response(r.status)
        self.send_header("Content-Type", r.getheader("Content-Type", "application/json"))
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes (streams pass through)
        while chunk := r.read1(65536):
            self.wfile.write(chunk)
            self.wfile.flush()
        conn.close()


def main(mode: str, port: int, model: str) -> None:
    Proxy.mode, Proxy.backend = mode, free_port()
    argv = ["transformers", "serve", "--host", "127.0.0.1", "--port", str(Proxy.backend), model]
    Proxy.child = subprocess.Popen(argv)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Proxy)
    sys.stderr.write("wrapper %s: listening on %d, real server on %d\n" % (mode, port, Proxy.backend))
    sys.stderr.flush()
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
