"""One deadline covers the whole command: a registry or an engine that trickles (a byte now and
then, so no per-read timeout ever trips) or stalls ends every command at its --timeout, with
one message naming what it waited for and exit 2, never a traceback.

The servers are real HTTP servers on 127.0.0.1 and on a unix socket. Every trickle is endless:
without the deadline the command would wait for ever (the test's own kill, at 60 s, would catch
it and fail the time assertion)."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.oci.infra import free_port
from tests.oci.test_hostile_answers import (
    MAX_RSS_KIB,
    OCI_MANIFEST,
    Ran,
    ThreadingServer,
    ThreadingUnixServer,
    imagegate,
)

TIMEOUT = 4
SLACK = 5  # the bound: within its deadline + 5 s (process start included)
LAYER = b"\x1f\x8b" + b"\0" * 62  # never read whole: its first bytes only arrive
LAYER_DIGEST = "sha256:" + hashlib.sha256(LAYER).hexdigest()
CONFIG = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "0" * 64]}}).encode()  # fmt: skip
CONFIG_DIGEST = "sha256:" + hashlib.sha256(CONFIG).hexdigest()
MANIFEST = json.dumps({
    "schemaVersion": 2, "mediaType": OCI_MANIFEST,
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": CONFIG_DIGEST, "size": len(CONFIG)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": LAYER_DIGEST, "size": len(LAYER)}],
}).encode()  # fmt: skip


class Trickling(http.server.BaseHTTPRequestHandler):
    """A server that answers, but one byte at a time, every TICK seconds, for ever."""

    protocol_version = "HTTP/1.1"
    TICK = 0.5

    def log_message(self, *args: object) -> None:
        pass

    def trickle(self, data: bytes, *, endless: bool = False) -> None:
        try:
            while True:
                for b in data:
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(self.TICK)
                if not endless:
                    return
        except OSError:
            pass  # the client gave up: what a deadline does
        self.close_connection = True

    def head(self, length: int, content_type: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        self.wfile.flush()

    def plain(self, body: bytes, content_type: str) -> None:
        self.head(len(body), content_type)
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/v2/":
            self.plain(b"{}", "application/json")
        elif path.startswith("/v2/body/manifests/"):  # the manifest's body, a byte at a time
            self.head(1 << 20, OCI_MANIFEST)
            self.trickle(b" ", endless=True)
        elif path.startswith("/v2/headers/"):  # the headers never end
            self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            self.trickle(b"a", endless=True)
        elif path.startswith("/v2/blob/manifests/"):
            self.plain(MANIFEST, OCI_MANIFEST)
        elif path.endswith(f"/blobs/{CONFIG_DIGEST}"):
            self.plain(CONFIG, "application/octet-stream")
        elif path.endswith(f"/blobs/{LAYER_DIGEST}"):
            self.head(len(LAYER), "application/octet-stream")
            self.trickle(LAYER[:8])  # then nothing more: a stalled body
            time.sleep(3600)
        # The engine: a /version answer that trickles (the SDK asks it first).
        elif path.endswith("/version"):
            self.head(1 << 20)
            self.trickle(b" ", endless=True)
        else:
            self.send_error(404)

    do_HEAD = do_GET


@pytest.fixture(scope="module")
def registry() -> Iterator[str]:
    server = ThreadingServer(("127.0.0.1", free_port()), Trickling)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def assert_deadline(ran: Ran, *words: str, timeout: float = TIMEOUT) -> None:
    assert ran.seconds < timeout + SLACK, f"ended after {ran.seconds:.1f} s: {ran.stderr[-800:]}"
    assert ran.rss_kib <= MAX_RSS_KIB, f"peak RSS {ran.rss_kib >> 10} MiB"
    assert "Traceback" not in ran.stderr and "internal error" not in ran.stderr, ran.stderr[-2000:]
    errors = [line for line in ran.stderr.splitlines() if line.startswith("imagegate: error:")]
    assert len(errors) == 1, ran.stderr[-2000:]
    assert f"the {timeout:g} s deadline (--timeout) passed while waiting for" in errors[0], errors[0]
    for word in words:
        assert word in errors[0], errors[0]
    assert ran.rc == 2, ran.stderr[-2000:]


T = ("--timeout", str(TIMEOUT))


@pytest.mark.parametrize(
    ("repo", "words"),
    [
        ("body", ("the manifest served for body:1",)),
        ("headers", ("the manifest served for headers:1",)),
        ("blob", (LAYER_DIGEST,)),
    ],
)
def test_layers_ends_at_its_deadline(registry: str, repo: str, words: tuple[str, ...]) -> None:
    assert_deadline(imagegate("layers", f"docker://{registry}/{repo}:1", *T, timeout=60), *words)


def test_compare_cache_and_verify_end_at_their_deadline(registry: str, tmp_path: Path) -> None:
    ran = imagegate("compare", f"docker://{registry}/blob:1", f"docker://{registry}/body:1", *T, timeout=60)
    assert_deadline(ran)
    cache = ("--cache-dir", str(tmp_path / "cache"))
    ran = imagegate("cache", "unpack", f"docker://{registry}/blob:1", *cache, *T, timeout=60)
    assert_deadline(ran, LAYER_DIGEST)
    key = tmp_path / "k.pub"
    _public_key(key)
    ran = imagegate("verify", "--image", f"{registry}/headers:1", "--key", str(key), *T, timeout=60)
    assert_deadline(ran, "headers")


def test_run_rootfs_ends_at_its_deadline_naming_the_blob(registry: str, tmp_path: Path) -> None:
    ran = imagegate(
        "run", f"docker://{registry}/blob:1", "--driver", "rootfs", "-p", "python", "--no-sign",
        "-o", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), *T, timeout=60,
    )  # fmt: skip
    assert_deadline(ran, LAYER_DIGEST)


def test_run_ends_at_its_deadline_on_a_trickling_engine(tmp_path: Path) -> None:
    """An engine that trickles its /version: the SDK's own read, cut by the hard stop."""
    sock = tmp_path / "engine.sock"
    server = ThreadingUnixServer(str(sock), Trickling)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ran = imagegate(
            "run", "any", "-p", "python", "--no-sign", "-o", str(tmp_path / "out"), *T,
            env={"DOCKER_HOST": f"unix://{sock}"}, timeout=60,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert_deadline(ran, "/version")


def test_audit_ends_at_its_deadline(registry: str, tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    mirror = {"official": f"docker://{registry}/blob:1", "mirror": f"docker://{registry}/body:1"}
    inventory.write_text(json.dumps({"apiVersion": "imagegate/v1", "kind": "Inventory", "mirrors": [mirror]}))
    report = tmp_path / "audit.json"
    ran = imagegate(
        "audit", str(inventory), "-o", str(tmp_path / "out"), "--json", str(report), *T, timeout=60
    )
    assert ran.seconds < TIMEOUT + SLACK, f"ended after {ran.seconds:.1f} s: {ran.stderr[-800:]}"
    assert "Traceback" not in ran.stderr, ran.stderr[-2000:]
    assert ran.rc == 2, ran.stderr[-2000:]
    (item,) = json.loads(report.read_text())["items"]
    assert item["outcome"] == "ERROR", item
    assert "deadline (--timeout) passed while waiting for" in item["detail"], item


def _public_key(path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    public = ec.generate_private_key(ec.SECP256R1()).public_key()
    path.write_bytes(
        public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
