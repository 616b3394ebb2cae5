"""Fixtures for the attestation tests: keys, a real attempt folder made by `imagegate run --here`
(no engine needed), the CLI in a subprocess as a user runs it."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import io
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from imagegate.attest import keys, sign


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Result:
    p = subprocess.run(
        [sys.executable, "-c", "from imagegate.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        cwd=cwd,
        timeout=300,
    )
    return Result(p.returncode, p.stdout, p.stderr)


@pytest.fixture
def key() -> keys.FileKey:
    return keys.generate()


@pytest.fixture
def keypair(tmp_path: Path) -> tuple[Path, Path]:
    priv, pub = keys.write_keypair(tmp_path / "keys" / "gate", keys.generate(), None)
    return priv, pub


# a run that needs no engine: the python pipeline on this environment
HERE_RUN = ("run", "--here", "--python", sys.executable, "-p", "python", "-m", "json")


def make_attempt(out: Path) -> Path:
    """A real attempt folder: the python pipeline run in this environment."""
    r = cli(
        "run",
        "--here",
        "--python",
        sys.executable,
        "-p",
        "python",
        "-m",
        "json",
        "-o",
        str(out),
        "-q",
        "--no-sign",
    )
    assert r.returncode == 0, r.stderr
    (attempt,) = [p.parent for p in out.glob("*/*/statement.json")]
    return attempt


@pytest.fixture(scope="session")
def pristine_attempt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_attempt(tmp_path_factory.mktemp("runs"))


@pytest.fixture
def attempt(pristine_attempt: Path, tmp_path: Path) -> Path:
    """A private copy of the real attempt, free to tamper with."""
    import shutil

    dst = tmp_path / "attempt"
    shutil.copytree(pristine_attempt, dst)
    return dst


def statement_of(attempt: Path) -> dict[str, Any]:
    return json.loads((attempt / "statement.json").read_text())


@pytest.fixture
def signed(attempt: Path, keypair: tuple[Path, Path]) -> sign.Signed:
    return sign.sign_attempt(attempt, statement_of(attempt), keys.load_signing_key(keypair[0]))


def pub_of(key: keys.SigningKey, folder: Path) -> Path:
    """The key's public half in a file under `folder`: what `attach --key` and `verify --key` read."""
    path = folder / f"signer-{hashlib.sha256(key.public.pem).hexdigest()[:12]}.pub"
    if not path.exists():
        path.write_bytes(key.public.pem)
    return path


_CLOCK = itertools.count()
_BASE = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)


def said_now() -> tuple[str, str]:
    """(startedOn, finishedOn) of a made-up run, each later than the one before in this process
    and within the shipped policies' 168h: statements made in order are said in that order."""
    end = _BASE + datetime.timedelta(seconds=next(_CLOCK) * 2 + 1)
    fmt = "%Y-%m-%dT%H:%M:%S.000Z"
    return (end - datetime.timedelta(seconds=1)).strftime(fmt), end.strftime(fmt)


# A real registry (Debian's docker-registry on 127.0.0.1, no auth) and an image pushed to it by
# the real Docker engine, per test module.
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def start_registry(root: Path, *, delete: bool = True) -> Iterator[str]:
    """`delete`: whether the registry allows manifest deletion (distribution's default is off)."""
    exe = shutil.which("docker-registry")
    if exe is None:
        pytest.fail("docker-registry is not installed (Debian package docker-registry)")
    port = free_port()
    cfg = root / "config.yml"
    cfg.write_text(
        "version: 0.1\n"
        "log: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}, delete: {{enabled: {str(delete).lower()}}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n"
    )
    log = open(root / "registry.log", "wb")  # noqa: SIM115  (closed after the process stops)
    proc = subprocess.Popen([exe, "serve", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the registry did not start: " + (root / "registry.log").read_text()[-2000:])
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with start_registry(tmp_path_factory.mktemp("registry")) as host:
        yield host


def docker(*args: str, stdin: bytes | None = None) -> str:
    p = subprocess.run(["docker", *args], input=stdin, capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout.decode()


@contextlib.contextmanager
def one_file_image(ref: str, text: bytes) -> Iterator[str]:
    """A one-file image made with `docker import` (nothing to pull), tagged `ref`; the engine's
    copy removed afterwards."""
    docker("import", "-", ref, stdin=one_file_tar(text))
    try:
        yield ref
    finally:
        subprocess.run(["docker", "rmi", "-f", ref], capture_output=True)


def one_file_tar(text: bytes) -> bytes:
    """A layer holding one file, hello.txt, that says `text`."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
    return buf.getvalue()


def push_one_file_image(ref: str, text: bytes) -> str:
    """A one-layer image (`one_file_tar(text)`) pushed to `ref` (a tag) by imagegate's registry
    client, no engine needed: in a fresh repository, an image with no attestation. Returns `ref`."""
    from imagegate.attest import attach
    from imagegate.domain.digest import digest_of
    from imagegate.oci.manifest import OCI_MANIFEST

    layer = one_file_tar(text)
    config = json.dumps(
        {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [digest_of(layer)]}}
    ).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "size": len(config),
            "digest": digest_of(config),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "size": len(layer),
                "digest": digest_of(layer),
            }
        ],
    }
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        client.upload_blob(parsed.repository, config)
        client.upload_blob(parsed.repository, layer)
        client.put_manifest(parsed.repository, parsed.ref, json.dumps(manifest).encode(), OCI_MANIFEST)
    return ref


@pytest.fixture(scope="module")
def image(registry: str) -> Iterator[str]:
    """A one-file image, pushed."""
    with one_file_image(f"{registry}/attest/app:1", b"imagegate attach test\n") as ref:
        docker("push", ref)
        yield ref
