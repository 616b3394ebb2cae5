"""Real parts for the OCI tests: Debian's docker-registry on 127.0.0.1, skopeo copies with a
private blob-info cache, a small multi-layer image built by the engine, an HTTP proxy that
fails on purpose, and OCI layout surgery for tampering."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.client
import http.server
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

PY_LIB = Path(f"/usr/lib/python3.{__import__('sys').version_info.minor}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sh(*cmd: str, env: dict[str, str] | None = None, timeout: float = 300, cwd: str | None = None) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
    return p.stdout


@dataclass
class Registry:
    host: str
    root: Path
    proc: subprocess.Popen[bytes]

    def blob_file(self, digest: str) -> Path:
        hexpart = digest.split(":", 1)[1]
        return self.root / "docker/registry/v2/blobs/sha256" / hexpart[:2] / hexpart / "data"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def start_registry(workdir: Path, *, htpasswd: Path | None = None) -> Registry:
    """`docker-registry serve` on a free loopback port, storage in `workdir`."""
    port = free_port()
    root = workdir / "storage"
    root.mkdir(parents=True, exist_ok=True)
    auth = (
        f"auth:\n  htpasswd:\n    realm: imagegate-test\n    path: {htpasswd}\n"
        if htpasswd is not None
        else ""
    )
    # No blob descriptor cache: tests edit stored blobs and the registry must see the edits.
    config = (
        "version: 0.1\nlog:\n  level: error\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n{auth}"
    )
    cfg = workdir / "config.yml"
    cfg.write_text(config)
    log = open(workdir / "registry.log", "wb")  # noqa: SIM115  (the registry writes it until stopped)
    proc = subprocess.Popen(["docker-registry", "serve", str(cfg)], stdout=log, stderr=log)
    reg = Registry(f"127.0.0.1:{port}", root, proc)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://{reg.host}/v2/", timeout=2).status_code in (200, 401):
                return reg
        except httpx.TransportError:
            time.sleep(0.1)
    reg.stop()
    raise AssertionError(f"docker-registry did not start: {(workdir / 'registry.log').read_text()[-2000:]}")


def skopeo(*args: str) -> str:
    """skopeo with a private, empty blob-info cache: the shared one (root's
    /var/lib/containers/cache) once made copies reuse the wrong blobs. Root ignores HOME for
    it, so a private mount namespace puts an empty folder over it."""
    cache = tempfile.mkdtemp(prefix="skopeo-cache-")
    os.makedirs("/var/lib/containers/cache", exist_ok=True)
    script = 'mount --bind "$0" /var/lib/containers/cache && exec skopeo "$@"'
    try:
        return sh("unshare", "-m", "sh", "-c", script, cache, *args, timeout=600)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


# -- the test image -----------------------------------------------------------------------

IMAGE_PARTS = ("json", "email", "http")  # base layer: real Python sources, ~1.5 MB
COPY_PARTS = ("logging", "xml")  # one extra layer each


def build_test_image(workdir: Path) -> str:
    """A 3-layer image of real bytes; cached in the engine by a hash of its recipe."""
    dockerfile = (
        "FROM {base}\n"
        + "".join(f"COPY {p} /opt/{p}\n" for p in COPY_PARTS)
        + 'ENV IMAGEGATE_TEST=1\nLABEL org.example.test="oci"\nCMD ["/bin/true"]\n'
    )
    recipe = hashlib.sha256(
        json.dumps([str(PY_LIB), IMAGE_PARTS, COPY_PARTS, dockerfile]).encode()
    ).hexdigest()[:16]
    ref = f"imagegate-oci-test/img:{recipe}"
    if subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0:
        return ref
    base_tar = workdir / "base.tar"
    sh("tar", "-cf", str(base_tar), "-C", "/", *[str(PY_LIB / p)[1:] for p in IMAGE_PARTS])
    base = f"imagegate-oci-test/base:{recipe}"
    sh("docker", "import", str(base_tar), base)
    ctx = workdir / "ctx"
    ctx.mkdir()
    for p in COPY_PARTS:
        shutil.copytree(PY_LIB / p, ctx / p, ignore=shutil.ignore_patterns("__pycache__"))
    (ctx / "Dockerfile").write_text(dockerfile.format(base=base))
    return build_offline(ctx, ref)


def build_offline(ctx: Path, tag: str) -> str:
    """`docker build` of the folder `ctx` as `tag`, with no network (the classic builder); the tag."""
    sh(
        "docker",
        "build",
        "-q",
        "--network",
        "none",
        "-t",
        tag,
        str(ctx),
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )
    return tag


# -- OCI layout surgery -------------------------------------------------------------------


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Layout:
    """An OCI image layout (written by skopeo) that tests edit like an attacker would."""

    root: Path

    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / digest.split(":", 1)[1]

    def blob(self, digest: str) -> bytes:
        return self.blob_path(digest).read_bytes()

    def put_blob(self, data: bytes) -> dict[str, Any]:
        d = sha(data)
        self.blob_path(d).write_bytes(data)
        return {"digest": d, "size": len(data)}

    def index(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.root / "index.json").read_text())
        return doc

    def manifest(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.blob(self.index()["manifests"][0]["digest"]))
        return doc

    def config(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.blob(self.manifest()["config"]["digest"]))
        return doc

    def set_manifest(self, manifest: dict[str, Any]) -> None:
        raw = json.dumps(manifest).encode()
        desc = self.put_blob(raw)
        index = self.index()
        index["manifests"][0].update(desc)
        (self.root / "index.json").write_text(json.dumps(index))

    def set_index(self, index: dict[str, Any]) -> None:
        (self.root / "index.json").write_text(json.dumps(index))

    def copy(self, dest: Path) -> Layout:
        shutil.copytree(self.root, dest)
        return Layout(dest)


def other_gzip_layer(seed: str) -> bytes:
    """A valid gzip of a valid tar with other content (a real file, renamed)."""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "tampered"
        p.write_bytes((PY_LIB / "textwrap.py").read_bytes() + seed.encode())
        out = Path(d) / "layer.tar"
        sh("tar", "-cf", str(out), "-C", d, "tampered")
        return gzip.compress(out.read_bytes())


@contextlib.contextmanager
def local_http(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on a free loopback port (its host:port), stopped on the way out."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# -- an HTTP proxy that fails on purpose ---------------------------------------------------


@dataclass
class FaultyProxy:
    """Forwards to a registry, but answers `fail_status` (500, or 429 with `retry_after`) to the
    first `fail_first` requests and can cut the first blob body half-way; counts what it did and
    when each request came (`times`, monotonic seconds)."""

    upstream: str
    fail_first: int = 0
    fail_status: int = 500
    retry_after: str | None = None
    cut_first_blob: bool = False
    stall_first_blob_s: float = 0.0  # send half of the first blob, then nothing for this long
    blob_over: int = 1000  # what counts as a blob to cut or stall: a body over this many bytes
    stalling: bool = False  # the first blob's stall is under way
    ranges_while_stalled: list[bool] = field(default_factory=list)  # per Range request
    _released: threading.Event = field(default_factory=threading.Event)  # stop() ends a stall
    seen: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    failed: int = 0
    cut: int = 0
    ranges: list[str] = field(default_factory=list)
    host: str = ""
    _server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> FaultyProxy:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _forward(self) -> None:
                proxy.seen.append(f"{self.command} {self.path}")
                proxy.times.append(time.monotonic())
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if proxy.failed < proxy.fail_first:
                    proxy.failed += 1
                    self.send_response(proxy.fail_status)
                    if proxy.retry_after is not None:
                        self.send_header("Retry-After", proxy.retry_after)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.headers.get("Range"):
                    proxy.ranges.append(self.headers["Range"])
                    proxy.ranges_while_stalled.append(proxy.stalling)
                conn = http.client.HTTPConnection(proxy.upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                is_blob = self.command == "GET" and "/blobs/" in self.path and len(data) > proxy.blob_over
                cutting = proxy.cut_first_blob or proxy.stall_first_blob_s
                if cutting and is_blob and proxy.cut == 0 and resp.status == 200:
                    proxy.cut += 1
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    proxy.stalling = True
                    proxy._released.wait(proxy.stall_first_blob_s)
                    proxy.stalling = False
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = _forward

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def wait_for(pred: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def zeros_gzip(n: int) -> bytes:
    """gzip of `n` zero bytes, built in pieces: the test itself must not hold `n` bytes."""
    import zlib

    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"\0" * (1 << 20)
    out = [comp.compress(chunk) for _ in range(n >> 20)]
    return b"".join([*out, comp.flush()])


# -- a slow or failing engine: a unix-socket proxy in front of the real one ------------------


class EngineProxy:
    """A unix socket that forwards to the real engine's socket, except that the response to an
    image export (`GET /images/NAME/get`) is held back `delay` seconds before its first byte
    (an engine preparing a large export), and, with `cut_after` set, the connection is closed
    after that many bytes of it (an engine that dies mid-export)."""

    def __init__(self, path: Path, engine: str, *, delay: float = 0.0, cut_after: int | None = None) -> None:
        self.path, self.engine = path, engine
        self.delay, self.cut_after = delay, cut_after
        self.exports = 0
        self.export_bytes_sent = 0  # of an export's answer, to the client
        self._released = threading.Event()  # close() ends a delay
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(16)
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.engine.removeprefix("unix://"))
            state: dict[str, float | None] = {"export_at": None}
            threading.Thread(target=self._requests, args=(client, upstream, state), daemon=True).start()
            threading.Thread(target=self._responses, args=(upstream, client, state), daemon=True).start()

    def _requests(self, src: socket.socket, dst: socket.socket, state: dict[str, float | None]) -> None:
        try:
            while data := src.recv(1 << 16):
                if b"GET " in data and b"/get" in data.split(b"\r\n", 1)[0]:
                    self.exports += 1
                    state["export_at"] = time.monotonic()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _shut(dst)

    def _responses(self, src: socket.socket, dst: socket.socket, state: dict[str, float | None]) -> None:
        sent = 0
        try:
            while data := src.recv(1 << 16):
                export_at = state["export_at"]
                if export_at is not None:
                    if sent == 0:
                        self._released.wait(max(0.0, export_at + self.delay - time.monotonic()))
                    if self.cut_after is not None and sent + len(data) > self.cut_after:
                        dst.sendall(data[: self.cut_after - sent])
                        break  # the engine "dies": both sides closed mid-response
                    sent += len(data)
                dst.sendall(data)
                if export_at is not None:
                    self.export_bytes_sent += len(data)
        except OSError:
            pass
        finally:
            _shut(dst)
            _shut(src)

    def close(self) -> None:
        self._closed = True
        self._released.set()
        _shut(self._server)
        self.path.unlink(missing_ok=True)


def _shut(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    s.close()


# -- a two-platform index -----------------------------------------------------------------

DOCKER_MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
OCI_INDEX_TYPE = "application/vnd.oci.image.index.v1+json"


@dataclass(frozen=True)
class TwoPlatforms:
    """An OCI image index in a registry: the engine's real image for linux/amd64, and for
    linux/arm64 a manifest of the same layers with another config (its `architecture` arm64)."""

    ref: str  # registry/repository:tag, the tag naming the index
    index_digest: str
    amd64_digest: str  # the manifest the engine pushed: its config is the image's ID
    arm64_digest: str
    config_digest: str


def push_two_platforms(registry: Registry | str, image: str, repository: str, tag: str = "1") -> TwoPlatforms:
    """`image` (in the engine) pushed by the engine, then an arm64 manifest and the index written
    through the registry's API. A registry given by its host alone gets `image` copied with skopeo
    instead: the engine never tags or pushes the shared image (a push gives it a repository
    digest, which a test of an image never pushed would see)."""
    host = registry if isinstance(registry, str) else registry.host
    base = f"http://{host}/v2/{repository}"
    amd64_ref = f"{host}/{repository}:amd64"
    if isinstance(registry, str):
        skopeo("copy", "-q", "--format", "v2s2", "--dest-tls-verify=false",
               f"docker-daemon:{image}", f"docker://{amd64_ref}")  # fmt: skip
    else:
        sh("docker", "tag", image, amd64_ref)
        try:
            sh("docker", "push", "-q", amd64_ref)
        finally:
            subprocess.run(["docker", "rmi", amd64_ref], capture_output=True)  # the tag only
    with httpx.Client(timeout=60) as http:
        got = http.get(f"{base}/manifests/amd64", headers={"Accept": DOCKER_MANIFEST_TYPE})
        got.raise_for_status()
        amd64 = got.content
        manifest = json.loads(amd64)
        config = json.loads(http.get(f"{base}/blobs/{manifest['config']['digest']}").content)
        arm_config = json.dumps({**config, "architecture": "arm64", "variant": "v8"}).encode()
        upload = http.post(f"{base}/blobs/uploads/")
        upload.raise_for_status()
        location = upload.headers["Location"]
        location = location if location.startswith("http") else f"http://{host}{location}"
        sep = "&" if "?" in location else "?"
        http.put(f"{location}{sep}digest={sha(arm_config)}", content=arm_config).raise_for_status()
        arm_manifest = {
            **manifest,
            "config": {**manifest["config"], "digest": sha(arm_config), "size": len(arm_config)},
        }
        arm64 = json.dumps(arm_manifest).encode()
        headers = {"Content-Type": DOCKER_MANIFEST_TYPE}
        http.put(f"{base}/manifests/arm64", content=arm64, headers=headers).raise_for_status()
        index = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_INDEX_TYPE,
                "manifests": [
                    {"mediaType": DOCKER_MANIFEST_TYPE, "digest": sha(amd64), "size": len(amd64),
                     "platform": {"os": "linux", "architecture": "amd64"}},
                    {"mediaType": DOCKER_MANIFEST_TYPE, "digest": sha(arm64), "size": len(arm64),
                     "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
                ],
            }
        ).encode()  # fmt: skip
        headers = {"Content-Type": OCI_INDEX_TYPE}
        http.put(f"{base}/manifests/{tag}", content=index, headers=headers).raise_for_status()
    return TwoPlatforms(
        f"{host}/{repository}:{tag}",
        sha(index),
        sha(amd64),
        sha(arm64),
        manifest["config"]["digest"],
    )


def urljoin_registry(registry: Registry, location: str) -> str:
    """An upload's Location header, relative or absolute, as a URL."""
    return location if location.startswith("http") else f"http://{registry.host}{location}"
