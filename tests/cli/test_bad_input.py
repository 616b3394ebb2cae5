"""Bad input at the command line: a clear message naming it, exit 3, and no engine call.

The engine's API puts an image name in a URL path, so a name like `../containers/ID` reaches
another endpoint; the tests point DOCKER_HOST at a listening socket that records connections
(never answering) to show that a refused input is refused before anything is sent, and run the
same inputs against the real engine to show what a user sees."""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import DOCKER_SOCK, image_of_its_own, imagegate
from tests.oci.infra import start_registry


class Listener:
    """A unix socket that counts connections: where an engine would be."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.connections = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Listener]:
    spy = Listener(tmp_path / "engine.sock")
    yield spy
    spy.close()


BAD_IMAGES = [
    ("", "IMAGE is empty"),
    ("   ", "IMAGE is empty"),
    ("../containers/ID", "IMAGE '../containers/ID' is not an image reference or ID"),
    ("foo bar", "IMAGE 'foo bar' is not an image reference or ID"),
    ("UPPER/case", "IMAGE 'UPPER/case' is not an image reference or ID: repository names must be lowercase"),
    ("app@sha256:12", "IMAGE 'app@sha256:12' is not an image reference or ID"),
]


@pytest.mark.parametrize(("image", "message"), BAD_IMAGES)
def test_run_refuses_a_bad_image_before_any_engine_call(
    image: str, message: str, listener: Listener, tmp_path: Path
) -> None:
    r = imagegate(
        "run", image, "-p", "python", "-o", str(tmp_path / "out"), "--no-sign",
        env={"DOCKER_HOST": f"unix://{listener.path}"},
        timeout=60,
    )  # fmt: skip
    assert r.returncode == 3, r.stderr
    assert f"imagegate: error: {message}" in r.stderr
    assert "Traceback" not in r.stderr
    assert listener.connections == 0
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args",
    [
        ("layers", "docker-daemon:../containers/ID"),
        ("compare", "docker-daemon:../containers/ID", "docker-daemon:imagegate-test/python"),
        ("pod", "render", "../containers/ID", "-p", "python"),
    ],
)
def test_other_commands_refuse_it_too(args: tuple[str, ...], listener: Listener) -> None:
    r = imagegate(*args, env={"DOCKER_HOST": f"unix://{listener.path}"}, timeout=60)
    assert r.returncode == 3, r.stderr
    assert "'../containers/ID' is not an image reference" in r.stderr
    assert listener.connections == 0


def test_pod_render_needs_a_reference_not_an_engine_id() -> None:
    r = imagegate("pod", "render", "8aceaa3bfd26dcc2", "-p", "python")
    assert r.returncode == 0, r.stderr  # a hex name is a valid reference (Docker Hub's library/…)
    for image, message in (
        ("", "IMAGE is empty"),
        ("sha256:" + "a" * 64, "is an image ID, not an image reference"),
    ):
        bad = imagegate("pod", "render", image, "-p", "python")
        assert bad.returncode == 3 and message in bad.stderr, bad.stderr


def test_a_path_into_the_engine_api_never_reaches_a_container(
    engine: str, images: dict[str, str], tmp_path: Path
) -> None:
    # A real container the path would name: it stays as it was, and is not taken for an image.
    cid = subprocess.run(
        ["docker", "-H", engine, "create", "--label", "io.imagegate.test=bad-input", images["python"], "true"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        r = imagegate("run", f"../containers/{cid}", "-p", "python", "-o", str(tmp_path / "out"), "--no-sign")
        assert r.returncode == 3, r.stderr
        assert f"IMAGE '../containers/{cid}' is not an image reference or ID" in r.stderr
        state = subprocess.run(
            ["docker", "-H", engine, "inspect", "-f", "{{.State.Status}}", cid],
            capture_output=True,
            text=True,
        )
        assert state.stdout.strip() == "created"
    finally:
        subprocess.run(["docker", "-H", engine, "rm", "-f", cid], capture_output=True)


def test_empty_image_is_not_pulled_as_local(engine: str, tmp_path: Path) -> None:
    r = imagegate(
        "run", "", "-p", "python", "-o", str(tmp_path / "out"), "--no-sign", env={"DOCKER_HOST": engine}
    )
    assert r.returncode == 3
    assert "IMAGE is empty" in r.stderr and "unset" in r.stderr
    assert "local" not in r.stderr and "pull" not in r.stderr


def test_image_ids_and_short_names_still_run(engine: str, images: dict[str, str], tmp_path: Path) -> None:
    image_id = subprocess.run(
        ["docker", "-H", engine, "image", "inspect", "-f", "{{.Id}}", images["python"]],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    for image in (image_id, image_id.removeprefix("sha256:")[:12]):
        r = imagegate("run", image, "-p", "python", "-o", str(tmp_path / "out"), "--no-sign", "-q")
        assert r.returncode == 0, r.stderr
        assert image_id in r.stdout


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("tcp//x", "no scheme"),
        ("foo://", "unknown scheme 'foo'"),
        ("tcp://", "needs HOST:PORT"),
        ("tcp://127.0.0.1", "needs HOST:PORT"),
        ("tcp://127.0.0.1:notaport", "Port could not be cast"),
        ("unix:///", "no socket path"),
        ("ssh://", "needs [USER@]HOST"),
    ],
)
def test_malformed_docker_host_is_named(host: str, why: str, images: dict[str, str], tmp_path: Path) -> None:
    for args in (
        ("run", images["python"], "-p", "python", "-o", str(tmp_path / "out"), "--no-sign"),
        ("layers", f"docker-daemon:{images['python']}"),
    ):
        r = imagegate(*args, env={"DOCKER_HOST": host}, timeout=60)
        assert r.returncode == 3, r.stderr
        assert f"imagegate: error: DOCKER_HOST {host!r} is not an engine address: {why}" in r.stderr
        assert "unix:///run/podman.sock" in r.stderr  # the hint shows the forms


def test_well_formed_docker_host_works(images: dict[str, str], tmp_path: Path) -> None:
    for host in (DOCKER_SOCK, "unix://", ""):
        r = imagegate(
            "run",
            images["python"],
            "-p",
            "python",
            "-o",
            str(tmp_path / "out"),
            "--no-sign",
            "-q",
            env={"DOCKER_HOST": host},
        )
        assert r.returncode == 0, (host, r.stderr)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("inf", "--timeout: inf is not a duration: give a finite number of seconds"),
        ("nan", "--timeout: nan is not a duration: give a finite number of seconds"),
        ("1e12", r"--timeout: 1e+12s is more than a day (86400s)"),
        ("0", "--timeout: 0 is not a duration: it must be positive"),
        ("-5", "--timeout: -5 is not a duration: it must be positive"),
    ],
)
def test_run_timeout_must_be_finite_positive_and_sane(
    value: str, message: str, images: dict[str, str], tmp_path: Path
) -> None:
    image = images["python"]
    r = imagegate(
        "run", image, "-p", "python", "-o", str(tmp_path / "out"), "--no-sign", f"--timeout={value}"
    )
    assert r.returncode == 3, r.stderr
    assert f"imagegate: error: {message}" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()  # refused before the run started


def test_pod_deadline_is_bounded_too() -> None:
    r = imagegate("pod", "render", "myorg/app:1", "-p", "python", "--deadline", "100000h")
    assert r.returncode == 3 and "--deadline '100000h': 3.6e+08s is more than a day" in r.stderr, r.stderr


def test_run_here_attach_needs_an_image(tmp_path: Path) -> None:
    """--attach pushes to IMAGE's repository: with --here and no IMAGE there is none, and that is
    said before anything runs (no attempt folder), not after the run as an internal error."""
    import sys

    out = tmp_path / "out"
    r = imagegate("run", "--here", "--python", sys.executable, "-p", "python", "-o", str(out), "--attach")
    assert r.returncode == 3, r.stderr
    assert "--attach" in r.stderr and "IMAGE" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


DIGEST = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("args", "message", "hint"),
    [
        (("-m", "requests,idna"), "--module 'requests,idna': not a dotted module name", "-m requests -m idna"),
        (("-m", "a b"), "--module 'a b': not a dotted module name", "-m requests"),
        (("-m", ""), "--module '': not a dotted module name", "-m requests"),
        (("--memory", "lots"), "--memory 'lots': not a memory size", "8g, 512m"),
        (("--memory", "64GiB"), "--memory '64GiB': not a memory size", "8g, 512m"),
        (("--memory", "1k"), "--memory '1k': below the engines' minimum of 6m", "8g"),
        (("--expect-config", "abc"), "--expect-config 'abc' is not a digest", "sha256:"),
        (("--expect-config", DIGEST), "--expect-config given, but pipeline 'python' runs no layers stage", "--driver rootfs"),
    ],
)  # fmt: skip
def test_run_refuses_bad_options_before_any_work(
    args: tuple[str, ...], message: str, hint: str, images: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    r = imagegate("run", images["python"], "-p", "python", *args, "-o", str(out), "--no-sign", timeout=60)
    assert r.returncode == 3, r.stderr
    assert f"imagegate: error: {message}" in r.stderr and hint in r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()  # no attempt folder, not even a half-written one


def test_good_memory_and_expect_config_still_run(images: dict[str, str], tmp_path: Path) -> None:
    # The layers stage reads --expect-config: a wrong digest there is a FAIL, not a usage error.
    r = imagegate(
        "run", images["python"], "-p", "python", "-m", "json", "-m", "os.path", "--memory", "512m",
        "-o", str(tmp_path / "out"), "--no-sign", "-q",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("pod", "render", "myorg/app:1", "-p", "python", "-m", "a b"), "--module 'a b': not a dotted"),
        (("pod", "render", "myorg/app:1", "-p", "python", "-m", "x,y"), "-m x -m y"),
        (("pod", "run", "myorg/app:1", "-p", "python", "-m", ""), "--module '': not a dotted"),
        (("pod", "run", "myorg/app:1", "-p", "python", "--expect-config", "abc"), "'abc' is not a digest"),
        (("pod", "run", "myorg/app:1", "-p", "python", "--expect-config", DIGEST), "runs no layers stage"),
        (("complete", "nowhere", "--memory", "lots"), "--memory 'lots': not a memory size"),
        (("audit", "inventory.yaml", "--memory", "lots"), "--memory 'lots': not a memory size"),
    ],
)
def test_pod_complete_and_audit_check_the_same_options(
    args: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    (tmp_path / "inventory.yaml").write_text("images: []\n")
    sign = () if args[0] == "audit" else ("--no-sign",)
    r = imagegate(*args, *sign, cwd=tmp_path, timeout=60)
    assert r.returncode == 3, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["inventory.yaml"]


def test_transport_references_name_the_driver_that_reads_them(tmp_path: Path) -> None:
    r = imagegate("run", "docker://127.0.0.1:5000/app:1", "-p", "python", "-o", str(tmp_path / "o"))
    assert r.returncode == 3, r.stderr
    assert "a docker transport reference" in r.stderr and "--driver rootfs" in r.stderr


def test_rootfs_with_a_name_only_the_local_engine_has_suggests_docker_daemon(
    images: dict[str, str], tmp_path: Path
) -> None:
    """A locally built image named without a registry: --driver rootfs would ask Docker Hub for
    it (retries, then "try again later"); the local engine is asked first, cheaply."""
    local = images["python"]
    r = imagegate("run", "--driver", "rootfs", local, "-p", "python", "-o", str(tmp_path / "o"), timeout=60)
    assert r.returncode == 3, r.stderr
    assert "only the local engine has it" in r.stderr
    assert f"--driver rootfs docker-daemon:{local}" in r.stderr
    assert not (tmp_path / "o").exists()


def test_rootfs_with_a_local_name_pushed_only_elsewhere_suggests_docker_daemon(
    images: dict[str, str], tmp_path: Path
) -> None:
    """The engine lists a registry digest for the image, from another registry: Docker Hub still
    does not have it under the name given, so the same advice, not retries against Docker Hub."""
    local = image_of_its_own(images["python"], "imagegate-test/pushed-elsewhere", tmp_path)
    registry = start_registry(tmp_path / "registry")
    elsewhere = f"{registry.host}/team/elsewhere:{local.rpartition(':')[2]}"
    try:
        subprocess.run(["docker", "tag", local, elsewhere], check=True)
        subprocess.run(["docker", "push", "-q", elsewhere], check=True, capture_output=True)
        r = imagegate(
            "run", "--driver", "rootfs", local, "-p", "python", "-o", str(tmp_path / "o"), timeout=60
        )
        assert r.returncode == 3, r.stderr
        assert "only the local engine has it" in r.stderr and f"docker-daemon:{local}" in r.stderr, r.stderr
    finally:
        subprocess.run(["docker", "rmi", local, elsewhere], capture_output=True)
        registry.stop()


def test_a_registry_digest_counts_for_the_name_however_docker_hub_is_spelled() -> None:
    """What `--driver rootfs` asks of the engine's registry digests: the same Docker Hub repository
    whichever way either side spells it, never a repository of another registry."""
    from imagegate.cli._checks import _hub_repository

    digest = "@sha256:" + "a" * 64
    for name, listed in (
        ("python", "python" + digest),
        ("python:3.12", "docker.io/library/python" + digest),
        ("team/app:1", "index.docker.io/team/app" + digest),
    ):
        assert _hub_repository(name) == _hub_repository(listed) is not None, (name, listed)
    assert _hub_repository("team/app:1") != _hub_repository("127.0.0.1:5000/team/app" + digest)
    assert _hub_repository("UPPER/case") is None  # not a reference: nothing to compare
