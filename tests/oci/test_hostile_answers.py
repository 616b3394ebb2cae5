"""Hostile registries, engines and files: every command ends promptly, in bounded memory, with one
message and the documented exit code, never a traceback.

The servers are real HTTP servers on 127.0.0.1 (a registry) and on a unix socket (an engine, for
DOCKER_HOST): they send endless bodies, bodies declaring 10 GB, wrong-typed JSON and redirect
loops. A body is cut after SENT_CAP bytes so that a client that reads it whole (the old code)
fails the memory assertion instead of taking the machine's memory."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.oci.infra import free_port

SENT_CAP = 400 << 20  # more than MAX_RSS: a client that buffers it all is caught
MAX_RSS_KIB = 200 << 10
DECLARED = str(10 << 30)
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
EMPTY = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


class Hostile(http.server.BaseHTTPRequestHandler):
    """Answers by the repository or engine path named in the request."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def endless(self, declared: str | None = None, content_type: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        if declared:
            self.send_header("Content-Length", declared)
        else:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = b'{"a":"' + b"x" * (1 << 20)
        try:
            for _ in range(SENT_CAP // len(chunk)):
                self.wfile.write(chunk if declared else b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass  # the client stopped reading: what a bounded client does
        self.close_connection = True

    def json(self, doc: object, status: int = 200, content_type: str = "application/json") -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def redirect(self, to: str) -> None:
        self.send_response(302)
        self.send_header("Location", to)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/v2/":
            self.json({})
        elif path.startswith("/v2/endless/manifests/"):
            self.endless(content_type=OCI_MANIFEST)
        elif path.startswith("/v2/huge/manifests/"):
            self.endless(DECLARED, OCI_MANIFEST)
        elif path.startswith("/v2/loop/"):
            self.redirect(path)
        elif path.startswith("/v2/wrongtype/manifests/"):
            config = {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": EMPTY, "size": 2}
            self.json({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config, "layers": "abc"},
                      content_type=OCI_MANIFEST)  # fmt: skip
        elif path.startswith("/v2/tokenloop/") or path.startswith("/v2/tokenjunk/"):
            realm = "/token-loop" if "loop" in path else "/token-junk"
            self.send_response(401)
            host = self.headers["Host"]
            self.send_header("WWW-Authenticate", f'Bearer realm="http://{host}{realm}",service="s"')
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/token-loop":
            self.redirect("/token-loop")
        elif path == "/token-junk":
            self.json(["not", "an", "object"])
        # The engine's answers (the SDK asks /version, /vX.Y/images/NAME/json).
        elif path.endswith("/version"):
            if self.server.engine_mode == "endless-version":  # type: ignore[attr-defined]
                self.endless()
            else:
                self.json({"Version": "20.10", "ApiVersion": "1.41", "Os": "linux", "Arch": "amd64"})
        elif path.endswith("/containers/json"):
            self.json([])  # no leftover containers: the run goes on to the image
        elif "/images/huge/json" in path:
            self.endless(DECLARED)
        elif "/images/endless/json" in path:
            self.endless()
        elif "/images/listid/json" in path:
            self.json({"Id": ["sha256:" + "0" * 64], "RepoDigests": []})
        else:
            self.json({"message": "no such thing"}, status=404)

    do_HEAD = do_GET


class ThreadingUnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    engine_mode = ""


class ThreadingServer(http.server.ThreadingHTTPServer):
    daemon_threads = True


@pytest.fixture(scope="module")
def registry() -> Iterator[str]:
    server = ThreadingServer(("127.0.0.1", free_port()), Hostile)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[ThreadingUnixServer]:
    sock = tmp_path / "engine.sock"
    server = ThreadingUnixServer(str(sock), Hostile)
    server.engine_mode = ""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@dataclass
class Ran:
    rc: int
    stderr: str
    rss_kib: int
    seconds: float


# A fresh, small parent for the command: a child forked from pytest itself starts with pytest's
# peak RSS (Linux carries it into ru_maxrss across fork and exec), which grows as the suite runs.
_MEASURE = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.call(sys.argv[2:])\n"
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
    "sys.exit(rc if rc >= 0 else 128 - rc)\n"
)


def imagegate(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> Ran:
    """The real CLI in a subprocess; its peak RSS from its own rusage, read by a small parent."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "wb") as null:
        rss_file = os.path.join(tmp, "rss")
        p = subprocess.Popen(
            [sys.executable, "-c", _MEASURE, rss_file, sys.executable, "-m", "imagegate", *args],
            stdout=null,
            stderr=subprocess.PIPE,
            env={**os.environ, "COLUMNS": "200", **(env or {})},
            start_new_session=True,
        )
        timer = threading.Timer(timeout, os.killpg, (p.pid, signal.SIGKILL))
        timer.start()
        assert p.stderr is not None
        err = p.stderr.read().decode(errors="replace")
        p.wait()
        timer.cancel()
        rss_text = Path(rss_file).read_text() if os.path.exists(rss_file) else ""
        rss = int(rss_text) if rss_text else 1 << 30  # no figure: never a pass
    return Ran(p.returncode, err, rss, time.monotonic() - t0)


def assert_refused(ran: Ran, rc: int, *words: str) -> None:
    assert ran.seconds < 25, f"did not end promptly ({ran.seconds:.0f} s): {ran.stderr[-500:]}"
    assert ran.rss_kib <= MAX_RSS_KIB, f"peak RSS {ran.rss_kib >> 10} MiB: {ran.stderr[-500:]}"
    assert "Traceback" not in ran.stderr and "internal error" not in ran.stderr, ran.stderr[-2000:]
    errors = [line for line in ran.stderr.splitlines() if line.startswith("imagegate: error:")]
    assert len(errors) == 1, ran.stderr[-2000:]
    for word in words:
        assert word in errors[0], errors[0]
    assert ran.rc == rc, ran.stderr[-2000:]


@pytest.mark.parametrize(
    ("repo", "words"),
    [
        ("endless", ("manifest", "larger than 4194304 bytes")),
        ("huge", ("manifest", f"declares {DECLARED}")),
        ("loop", ("redirected more than 5 times",)),
        ("tokenloop", ("token server", "redirected")),
    ],
)
def test_layers_from_a_hostile_registry(registry: str, repo: str, words: tuple[str, ...]) -> None:
    assert_refused(imagegate("layers", f"docker://{registry}/{repo}:1"), 2, *words)


def test_compare_and_rootfs_run_stop_at_the_manifest_limit(registry: str, tmp_path: Path) -> None:
    assert_refused(
        imagegate("compare", f"docker://{registry}/huge:1", f"docker://{registry}/endless:1"),
        2,
        "larger than",
    )
    ran = imagegate(
        "run", f"docker://{registry}/endless:1", "--driver", "rootfs", "-p", "python", "--no-sign",
        "-o", str(tmp_path / "out"), env={"XDG_CACHE_HOME": str(tmp_path / "cache")},
    )  # fmt: skip
    assert_refused(ran, 2, "larger than 4194304 bytes")


@pytest.mark.parametrize(
    ("mode", "image", "words"),
    [
        ("endless-version", "any", ("/version", "larger than")),
        ("", "huge", ("images/huge/json", f"declares {DECLARED}")),
        ("", "endless", ("images/endless/json", "larger than")),
        ("", "listid", ("`Id` is a list",)),
    ],
)
def test_run_against_a_hostile_engine(
    engine: ThreadingUnixServer, tmp_path: Path, mode: str, image: str, words: tuple[str, ...]
) -> None:
    engine.engine_mode = mode
    ran = imagegate(
        "run", image, "-p", "python", "--no-sign", "-o", str(tmp_path / "out"),
        env={"DOCKER_HOST": f"unix://{engine.server_address}"},
    )  # fmt: skip
    assert_refused(ran, 2, *words)


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_verify_refuses_special_files(tmp_path: Path, special: str) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = tmp_path / "k.pub"
    public = ec.generate_private_key(ec.SECP256R1()).public_key()
    key.write_bytes(
        public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    path = special
    if special == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    assert_refused(imagegate("verify", path, "--key", str(key)), 3, path, "not a regular file")
    assert_refused(imagegate("verify", path, "--trusted-keys", path), 3, path, "not a regular file")
