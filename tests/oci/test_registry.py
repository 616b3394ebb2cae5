"""The registry client against real registries: Basic auth with credentials from the places
Docker and Podman keep them, retries through a proxy that fails on purpose, a blob read cut
mid-way, the push primitives, and platform choice in an index."""

from __future__ import annotations

import base64
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagegate.oci.layercheck import verify_source
from imagegate.oci.manifest import OCI_INDEX, parse_platform
from imagegate.oci.reference import parse_reference
from imagegate.oci.registry import RegistryClient, RegistryError
from imagegate.oci.sources.registry import RegistrySource
from tests.helpers import imagegate
from tests.oci.conftest import Pushed
from tests.oci.infra import FaultyProxy, Registry, skopeo

pytestmark = pytest.mark.engine

USER, PASSWORD = "alice", "s3cret-pass"


@pytest.fixture(scope="module")
def private_ref(pushed: Pushed, auth_registry: Registry) -> str:
    ref = f"{auth_registry.host}/private/app:1"
    skopeo(
        "copy",
        "-q",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
        "--dest-creds",
        f"{USER}:{PASSWORD}",
        f"docker://{pushed.ref}",
        f"docker://{ref}",
    )
    return ref


def _no_creds_env(tmp_path: Path) -> dict[str, str]:
    # An empty Docker config and no auth file: nothing of the host's leaks into the test.
    (tmp_path / "empty").mkdir(exist_ok=True)
    return {
        "DOCKER_CONFIG": str(tmp_path / "empty"),
        "REGISTRY_AUTH_FILE": "",
        "XDG_RUNTIME_DIR": str(tmp_path),
    }


def test_401_without_credentials(private_ref: str, tmp_path: Path) -> None:
    r = imagegate("layers", private_ref, env=_no_creds_env(tmp_path))
    assert r.returncode == 2
    assert "requires authentication (401) and no credentials were found" in r.stderr
    assert "docker login" in r.stderr


def test_wrong_password_is_refused(private_ref: str, tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text(
        json.dumps({"auths": {private_ref.split("/")[0]: {"auth": base64.b64encode(b"alice:nope").decode()}}})
    )
    r = imagegate("layers", private_ref, env={**_no_creds_env(tmp_path), "REGISTRY_AUTH_FILE": str(auth)})
    assert r.returncode == 2 and "authentication failed" in r.stderr


def test_registry_auth_file(private_ref: str, pushed: Pushed, tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    auth.write_text(json.dumps({"auths": {private_ref.split("/")[0]: {"auth": token}}}))
    r = imagegate(
        "layers",
        private_ref,
        "--expect-config",
        pushed.config_digest,
        env={**_no_creds_env(tmp_path), "REGISTRY_AUTH_FILE": str(auth)},
    )
    assert r.returncode == 0, r.stderr
    assert "3/3 layers verified" in r.stdout


def test_docker_config_auths(private_ref: str, tmp_path: Path) -> None:
    env = _no_creds_env(tmp_path)
    Path(env["DOCKER_CONFIG"], "config.json").write_text(
        json.dumps(
            {"auths": {f"http://{private_ref.split('/')[0]}": {"username": USER, "password": PASSWORD}}}
        )
    )
    r = imagegate("layers", private_ref, env=env)
    assert r.returncode == 0, r.stderr


def _helper(bin_dir: Path, name: str, log: Path) -> None:
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / f"docker-credential-{name}"
    # The credential helper protocol: server URL on stdin, JSON on stdout.
    script.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = get ] || exit 1\nread server\necho "$server" >> {log}\n'
        f'echo \'{{"ServerURL":"\'"$server"\'","Username":"{USER}","Secret":"{PASSWORD}"}}\'\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("where", ["credsStore", "credHelpers"])
def test_credential_helpers(private_ref: str, tmp_path: Path, where: str) -> None:
    env = _no_creds_env(tmp_path)
    host = private_ref.split("/")[0]
    _helper(tmp_path / "bin", "imagegate-test", tmp_path / "helper.log")
    conf = (
        {"credsStore": "imagegate-test"}
        if where == "credsStore"
        else {"credHelpers": {host: "imagegate-test"}}
    )
    Path(env["DOCKER_CONFIG"], "config.json").write_text(json.dumps(conf))
    env["PATH"] = f"{tmp_path / 'bin'}:{os.environ['PATH']}"
    r = imagegate("layers", private_ref, env=env)
    assert r.returncode == 0, r.stderr
    assert host in (tmp_path / "helper.log").read_text()


def test_missing_helper_is_a_clear_error(private_ref: str, tmp_path: Path) -> None:
    env = _no_creds_env(tmp_path)
    Path(env["DOCKER_CONFIG"], "config.json").write_text(json.dumps({"credsStore": "not-installed-here"}))
    r = imagegate("layers", private_ref, env=env)
    assert r.returncode == 2 and "docker-credential-not-installed-here" in r.stderr


@pytest.fixture
def proxy(official: Registry) -> Iterator[FaultyProxy]:
    p = FaultyProxy(official.host).start()
    yield p
    p.stop()


def test_500_then_recovers(pushed: Pushed, proxy: FaultyProxy) -> None:
    proxy.fail_first = 3
    ref = pushed.ref.replace(pushed.ref.split("/")[0], proxy.host)
    r = imagegate("layers", ref, "--expect-config", pushed.config_digest)
    assert r.returncode == 0, r.stderr
    assert proxy.failed == 3 and "3/3 layers verified" in r.stdout


def test_500_forever_gives_up(pushed: Pushed, proxy: FaultyProxy) -> None:
    proxy.fail_first = 1000
    ref = parse_reference(pushed.ref.replace(pushed.ref.split("/")[0], proxy.host))
    client = RegistryClient(proxy.host, retries=2, backoff_s=0.01)
    with pytest.raises(RegistryError, match=r"^registry \S+ answered 500\b.*, 3 tries\)$"):
        verify_source(RegistrySource(ref, parse_platform("linux/amd64"), client=client))
    assert proxy.failed == 3


def test_429_waits_as_long_as_retry_after_says(pushed: Pushed, proxy: FaultyProxy) -> None:
    proxy.fail_first, proxy.fail_status, proxy.retry_after = 1, 429, "2"
    ref = parse_reference(pushed.ref.replace(pushed.ref.split("/")[0], proxy.host))
    # a tiny own backoff: only Retry-After can make the client wait seconds
    client = RegistryClient(proxy.host, backoff_s=0.01)
    report = verify_source(RegistrySource(ref, parse_platform("linux/amd64"), client=client), jobs=1)
    assert report.ok, report
    assert proxy.failed == 1 and proxy.seen[1] == proxy.seen[0]  # the same request, again
    # a lower bound read from the registry's side: a loaded machine can only make it longer
    assert proxy.times[1] - proxy.times[0] >= 2 * 0.75, proxy.times[:2]


def test_429_forever_gives_up_naming_it(pushed: Pushed, proxy: FaultyProxy) -> None:
    proxy.fail_first, proxy.fail_status = 1000, 429
    ref = parse_reference(pushed.ref.replace(pushed.ref.split("/")[0], proxy.host))
    client = RegistryClient(proxy.host, retries=2, backoff_s=0.01)
    with pytest.raises(RegistryError, match=r"^registry \S+ answered 429\b.*, 3 tries\)$"):
        verify_source(RegistrySource(ref, parse_platform("linux/amd64"), client=client))
    assert proxy.failed == 3


def test_blob_read_cut_midway_resumes_with_range(pushed: Pushed, proxy: FaultyProxy) -> None:
    proxy.cut_first_blob = True
    ref = parse_reference(pushed.ref.replace(pushed.ref.split("/")[0], proxy.host))
    client = RegistryClient(proxy.host, backoff_s=0.01)
    report = verify_source(RegistrySource(ref, parse_platform("linux/amd64"), client=client), jobs=1)
    assert report.ok, report
    assert proxy.cut == 1 and proxy.ranges and proxy.ranges[0].startswith("bytes=")


def test_blob_read_stalled_midway_times_out_and_resumes(pushed: Pushed, proxy: FaultyProxy) -> None:
    # The body is read from the socket directly: its read timeout must still hold there.
    proxy.stall_first_blob_s = 300  # ended by the proxy's stop, once the test is done
    ref = parse_reference(pushed.ref.replace(pushed.ref.split("/")[0], proxy.host))
    client = RegistryClient(proxy.host, backoff_s=0.01, timeout_s=1.5)
    report = verify_source(RegistrySource(ref, parse_platform("linux/amd64"), client=client), jobs=1)
    assert report.ok, report
    # The resumed read came while the first one still stalled: the client gave up on its own
    # read timeout (an order of events, not a wall time that a busy machine stretches).
    assert proxy.ranges_while_stalled == [True], "the stalled read was not given up after its timeout"
    assert proxy.cut == 1 and proxy.ranges and proxy.ranges[0].startswith("bytes=")


def test_push_primitives_round_trip(official: Registry) -> None:
    with RegistryClient(official.host) as c:
        payload = b'{"payloadType":"application/vnd.in-toto+json"}'
        digest = c.upload_blob("team/att", payload)
        assert c.blob_size("team/att", digest) == len(payload)
        assert c.upload_blob("team/att", payload) == digest  # already there: no second upload
        config = c.upload_blob("team/att", b"{}")
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 2},
            "layers": [
                {"mediaType": "application/vnd.dsse.envelope.v1+json", "digest": digest, "size": len(payload)}
            ],
        }
        raw = json.dumps(manifest).encode()
        mdigest = c.put_manifest("team/att", "sha256-abc.att", raw, manifest["mediaType"])
        got = c.get_manifest("team/att", "sha256-abc.att")
        assert got.raw == raw and got.digest == mdigest
        assert c.head_manifest("team/att", "sha256-abc.att") is not None
        assert c.head_manifest("team/att", "nope") is None
        assert "sha256-abc.att" in c.list_tags("team/att")


def test_index_without_the_platform_lists_what_exists(pushed: Pushed, official: Registry) -> None:
    with RegistryClient(official.host) as c:
        m = c.get_manifest("team/app", "1")
        entry = {"mediaType": m.media_type, "digest": m.digest, "size": len(m.raw)}
        index = {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {**entry, "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
                {**entry, "platform": {"os": "linux", "architecture": "s390x"}},
            ],
        }
        index_digest = c.put_manifest("team/app", "multi", json.dumps(index).encode(), OCI_INDEX)
    ref = f"{official.host}/team/app:multi"
    r = imagegate("layers", ref)
    assert r.returncode == 3
    assert "no image for platform linux/amd64 in the index; it has: linux/arm64/v8, linux/s390x" in r.stderr
    r = imagegate("layers", ref, "--platform", "linux/arm64")
    assert r.returncode == 0, r.stderr
    assert f"index:    {index_digest}" in r.stdout and "platform: linux/arm64/v8" in r.stdout
    r = imagegate("layers", ref, "--platform", "linux")
    assert r.returncode == 3 and "invalid platform" in r.stderr
