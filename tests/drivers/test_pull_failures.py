"""A pull that fails says whose failure it is: an image or a registry that does not exist is an
input error (exit 3); a registry that could not answer is "could not decide" (exit 2), so a CI
outage never reads as the user's mistake. Either way the message names the registry and the
cause in words, through the engine (`run`, the docker driver) and through imagegate's own
registry client (`layers docker://`), against a real registry on 127.0.0.1, a closed port and
a name no resolver knows."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagegate.oci.pullfailure import engine_pull_cause
from tests.helpers import imagegate
from tests.oci.infra import Registry, free_port

NO_HOST = "nonexistent.invalid"


def _run(ref: str, tmp_path: Path, *more: str) -> tuple[int, str]:
    r = imagegate("run", ref, "-p", "python", "--no-sign", "-o", str(tmp_path), *more)
    assert "Traceback" not in r.stderr and "Error(" not in r.stderr, r.stderr
    return r.returncode, r.stderr


@pytest.mark.parametrize("pull", ["missing", "always"])
def test_engine_pull_of_an_image_the_registry_lacks_is_an_input_error(
    engine: str, registry: Registry, pull: str, tmp_path: Path
) -> None:
    code, err = _run(f"{registry.host}/imagegate-test/never-pushed:1", tmp_path, "--pull", pull)
    assert code == 3, err
    assert f"registry {registry.host} has no such image (manifest unknown)" in err


@pytest.mark.parametrize("pull", ["missing", "always"])
def test_engine_pull_from_a_closed_port_could_not_decide(engine: str, pull: str, tmp_path: Path) -> None:
    host = f"127.0.0.1:{free_port()}"
    code, err = _run(f"{host}/team/app:1", tmp_path, "--pull", pull)
    assert code == 2, err
    assert f"registry {host} refused the connection" in err
    assert "try again later" in err


def test_engine_pull_from_a_host_that_does_not_exist_is_an_input_error(engine: str, tmp_path: Path) -> None:
    code, err = _run(f"{NO_HOST}/team/app:1", tmp_path)
    assert code == 3, err
    assert f"not found in the docker engine, and pulling it failed: {NO_HOST}: no such host" in err


def test_registry_client_names_a_missing_image_a_closed_port_and_an_unknown_host(registry: Registry) -> None:
    missing = imagegate("layers", f"docker://{registry.host}/imagegate-test/never-pushed:1")
    assert missing.returncode == 3, missing.stderr
    assert "image not found in the registry" in missing.stderr and "MANIFEST_UNKNOWN" in missing.stderr
    host = f"127.0.0.1:{free_port()}"
    closed = imagegate("layers", f"docker://{host}/team/app:1")
    assert closed.returncode == 2, closed.stderr
    assert (
        f"imagegate: error: registry {host} refused the connection (GET /v2/team/app/manifests/1"
        in closed.stderr
    )
    unknown = imagegate("layers", f"docker://{NO_HOST}/team/app:1")
    assert unknown.returncode == 3, unknown.stderr
    assert f"imagegate: error: {NO_HOST}: no such host" in unknown.stderr


@pytest.mark.parametrize(
    ("said", "words", "code"),
    [
        (
            'Get "https://reg.example/v2/": net/http: TLS handshake timeout',
            "registry reg.example did not answer in time",
            2,
        ),
        (
            'Get "https://reg.example/v2/": read tcp 10.0.0.2:4431->10.0.0.9:443: read: connection reset by peer',
            "registry reg.example reset the connection",
            2,
        ),
        (
            "received unexpected HTTP status: 503 Service Unavailable",
            "registry reg.example answered 503 Service Unavailable",
            2,
        ),
        (
            "toomanyrequests: You have reached your pull rate limit. 429 Too Many Requests",
            "registry reg.example answered 429 Too Many Requests",
            2,
        ),
        (
            "reading manifest 1 in reg.example/team/app: name unknown: repository name not known to registry",
            "registry reg.example has no such image (name unknown)",
            3,
        ),
        (
            'Get "https://reg.example/v2/": dial tcp: lookup reg.example on 10.0.0.53:53: server misbehaving',
            "reg.example: the name could not be looked up now",
            2,
        ),
    ],
)
def test_an_engines_pull_failure_in_words(said: str, words: str, code: int) -> None:
    """Docker's and Podman's words for failures a test registry cannot stage (a TLS stall, a
    reset, a 503 or 429, a resolver that is down)."""
    cause = engine_pull_cause(said, "reg.example")
    assert (cause.words, cause.exit_code) == (words, code)


@pytest.mark.parametrize(
    ("docker_host", "cause"),
    [
        ("unix:///nonexistent.sock", "no such file or directory"),
        ("tcp://127.0.0.1:{free_port}", "connection refused"),  # the port chosen when it runs
        (f"tcp://{NO_HOST}:2375", "no such host"),
    ],
)
def test_an_engine_out_of_reach_is_said_in_words(docker_host: str, cause: str, tmp_path: Path) -> None:
    """Not the reprs of the HTTP library's wrappers around the socket's error."""
    # Chosen here, not at collection: pytest-xdist's workers must collect the same test ids.
    docker_host = docker_host.format(free_port=free_port())
    r = imagegate(
        "run", "imagegate-test/python", "--no-sign", "-o", str(tmp_path), env={"DOCKER_HOST": docker_host}
    )
    assert r.returncode == 2, r.stderr
    assert f"imagegate: error: container engine at {docker_host}: not reachable ({cause})\n" in r.stderr
    d = imagegate("layers", "docker-daemon:imagegate-test/python", env={"DOCKER_HOST": docker_host})
    assert d.returncode == 2, d.stderr
    assert f"not reachable ({cause})\n" in d.stderr
