"""docker-daemon: when the engine is slow to prepare its export (as it is for a 10 GB image) or
breaks off: the real engine behind a unix-socket proxy that holds back or cuts the export."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagegate.errors import EngineError
from imagegate.oci import engineapi
from imagegate.oci.layercheck import verify_source
from imagegate.oci.sources.daemon import DaemonArchive
from tests.helpers import DOCKER_SOCK, PODMAN_SOCK, imagegate
from tests.oci.infra import EngineProxy, sh

pytestmark = pytest.mark.engine

# The Docker SDK's default read timeout (docker.constants.DEFAULT_TIMEOUT_SECONDS): the CLI's
# client waits this long for a response before giving up.
SDK_TIMEOUT_S = 60


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="ig-proxy-"))  # short: unix socket paths are limited
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _image_id(ref: str, host: str = DOCKER_SOCK) -> str:
    return sh("docker", "-H", host, "image", "inspect", "-f", "{{.Id}}", ref).strip()


class Heard:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float, bool]] = []

    def started(self, key: int, label: str, total: int | None) -> None:
        pass

    def advanced(self, key: int, nbytes: int) -> None:
        pass

    def finished(self, key: int, status: str) -> None:
        pass

    def waiting(self, what: str, elapsed: float, done: bool) -> None:
        self.calls.append((what, elapsed, done))


def test_export_slower_than_the_clients_read_timeout(oci_image: str, sock_dir: Path) -> None:
    """The engine's first byte comes after the client's read timeout (the docker driver's client
    has one): the export still verifies, and the wait is heard and recorded."""
    proxy = EngineProxy(sock_dir / "e.sock", DOCKER_SOCK, delay=5)
    try:
        client = engineapi.connect(proxy.url, timeout=2)
        heard = Heard()
        report = verify_source(DaemonArchive(_image_id(oci_image), client), progress=heard)
        client.close()
    finally:
        proxy.close()
    assert proxy.exports == 1
    assert report.ok and report.verified == 3
    assert report.source_wait_s is not None and report.source_wait_s >= 5
    ticks = [c for c in heard.calls if not c[2]]
    assert len(ticks) >= 3 and ticks[-1][1] >= 3  # told every second while the engine prepared
    assert heard.calls[-1][2] and heard.calls[-1][1] >= 5


def test_cli_waits_past_the_sdk_timeout_and_says_why(oci_image: str, sock_dir: Path) -> None:
    """`imagegate layers docker-daemon:` with an engine that prepares its export for longer than
    the SDK's default read timeout (a 10 GB image): a verdict, not an internal error. ~65 s."""
    proxy = EngineProxy(sock_dir / "e.sock", DOCKER_SOCK, delay=SDK_TIMEOUT_S + 3)
    try:
        r = imagegate(
            "layers",
            f"docker-daemon:{oci_image}",
            "--expect-config",
            _image_id(oci_image),
            env={"DOCKER_HOST": proxy.url},
        )
    finally:
        proxy.close()
    assert r.returncode == 0, r.stderr
    assert "3/3 layers verified" in r.stdout
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    # Outside a terminal, a line every 15 s says what is going on.
    said = rf"docker-daemon:{re.escape(oci_image)}: the engine is preparing the export \(1[5-9] s\)"
    assert re.search(said, r.stderr), r.stderr
    # at least the engine's delay (a busy machine adds to it, never takes from it)
    prepared = re.search(r"the engine prepared the export in (\d+)", r.stderr)
    assert prepared and int(prepared.group(1)) >= SDK_TIMEOUT_S + 3, r.stderr


@pytest.mark.parametrize("cut_after", [0, 300_000], ids=["before-first-byte", "mid-stream"])
def test_engine_breaking_off_the_export_is_named(oci_image: str, sock_dir: Path, cut_after: int) -> None:
    proxy = EngineProxy(sock_dir / "e.sock", DOCKER_SOCK, cut_after=cut_after)
    try:
        r = imagegate("layers", f"docker-daemon:{oci_image}", env={"DOCKER_HOST": proxy.url})
    finally:
        proxy.close()
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    where = "before sending its first byte" if cut_after == 0 else r"after \d+\.\d KiB"
    said = rf"docker-daemon:{re.escape(oci_image)}: the engine \({re.escape(proxy.url)}\) broke off the export {where}"
    assert re.search(said, r.stderr), r.stderr
    assert "is the engine still running?" in r.stderr


def test_deadline_on_an_engine_that_never_answers(oci_image: str, sock_dir: Path) -> None:
    proxy = EngineProxy(sock_dir / "e.sock", DOCKER_SOCK, delay=30)
    try:
        client = engineapi.connect(proxy.url, timeout=60)
        with pytest.raises(
            EngineError, match=r"gave up after 2 s: the engine prepared no byte of the export"
        ):
            verify_source(DaemonArchive(oci_image, client, timeout=2))
        client.close()
    finally:
        proxy.close()


@pytest.mark.podman
def test_slow_export_through_podman(oci_image: str, sock_dir: Path, tmp_path: Path) -> None:
    """Podman writes the whole export to a temporary file before its first byte."""
    saved = tmp_path / "img.tar"
    sh("docker", "save", oci_image, "-o", str(saved))
    sh("podman", "load", "-q", "-i", str(saved))
    proxy = EngineProxy(sock_dir / "p.sock", PODMAN_SOCK, delay=15)
    try:
        # The client's 10 s read timeout leaves a busy machine's Podman time for the calls before
        # the export (its version, the image's inspect), whose 15 s wait still outlasts it.
        client = engineapi.connect(proxy.url, timeout=10)
        report = verify_source(DaemonArchive(oci_image, client))
        client.close()
    finally:
        proxy.close()
    assert proxy.exports == 1
    assert report.ok and report.verified == 3, report.problems
    assert report.source_wait_s is not None and report.source_wait_s >= 15
