"""An image ID from the engine becomes the attempt's folder name (`OUT/sha256-<hex>/…`): an
engine that answers `sha256:/../../x` must not put evidence outside --out.

No real Docker or Podman engine can be made to answer such an ID, so this test uses a NAMED
FAKE: `FakeEngine`, a tiny HTTP server on a unix socket (used through DOCKER_HOST) that answers
/_ping, /version, /containers/json and /images/NAME/json with the hostile Id; nothing else."""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.helpers import imagegate

GOOD = "sha256:" + "a" * 64


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class FakeEngine:
    """The named fake: a Docker API that answers every image inspect with `image_id`."""

    def __init__(self, path: Path, image_id: str, repo_digests: list[str]) -> None:
        answer = {"Id": image_id, "RepoDigests": repo_digests, "Os": "linux", "Architecture": "amd64"}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path.endswith("/_ping"):
                    self._send(200, b"OK", "text/plain")
                elif path.endswith("/version"):
                    version = {"ApiVersion": "1.41", "Version": "fake", "Os": "linux", "Arch": "amd64"}
                    self._send(200, json.dumps(version).encode())
                elif path.endswith("/containers/json"):
                    self._send(200, b"[]")
                elif "/images/" in path and path.endswith("/json"):
                    self._send(200, json.dumps(answer).encode())
                else:
                    self._send(404, b'{"message": "not in the fake"}')

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = _UnixHTTPServer(str(path), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def fake_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    image_id, repo_digests = request.param
    sock = tmp_path / "fake-engine.sock"
    engine = FakeEngine(sock, image_id, repo_digests)
    yield sock
    engine.close()


@pytest.mark.parametrize(
    ("fake_engine", "bad"),
    [
        (("sha256:/../../x", []), "sha256:/../../x"),
        (("sha256:../../../escaped", []), "sha256:../../../escaped"),
        (("sha256:" + "a" * 63 + "/", []), "sha256:" + "a" * 63 + "/"),
        ((GOOD, ["app@sha256:/../../x"]), "sha256:/../../x"),
    ],
    indirect=["fake_engine"],
)
def test_an_engine_id_that_is_not_a_digest_is_an_engine_error(
    fake_engine: Path, bad: str, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    out = work / "deep" / "out"
    out.mkdir(parents=True)
    r = imagegate(
        "run", "app:1", "-p", "python", "-o", str(out), "--no-sign",
        env={"DOCKER_HOST": f"unix://{fake_engine}"}, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert f"{bad!r} is not a digest" in r.stderr
    # Nothing was made anywhere but inside --out (and nothing inside it either).
    assert sorted(p.relative_to(work) for p in work.rglob("*")) == [Path("deep"), Path("deep/out")]
    assert not (tmp_path / "x").exists() and not (tmp_path / "escaped").exists()


def test_the_evidence_store_refuses_an_id_that_is_a_path(tmp_path: Path) -> None:
    """Defence behind the driver's check: whatever hands the store an image ID (a driver, a Pod's
    status, an earlier attempt), it is never made a path. `sha256-` already there (an earlier
    answer `sha256:`) is what lets `sha256:/../../x` climb out of --out on the old code."""
    from imagegate.domain.evidence import Attempt
    from imagegate.domain.results import ImageFacts
    from imagegate.errors import EngineError

    out = tmp_path / "a" / "out"
    (out / "sha256-").mkdir(parents=True)
    for bad in ("sha256:/../../x", "sha256:", "sha256:" + "A" * 64, "sha256:" + "a" * 64 + "\n"):
        with pytest.raises(EngineError, match="is not a digest"):
            Attempt(out, ImageFacts(reference="app:1", config_digest=bad))
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == [
        Path("a"), Path("a/out"), Path("a/out/sha256-")
    ]  # fmt: skip
    good = Attempt(out, ImageFacts(reference="app:1", config_digest=GOOD))
    assert good.dir.parent == out / ("sha256-" + "a" * 64)
