from __future__ import annotations

import re

import pytest

from imagegate.domain.digest import is_digest
from imagegate.errors import UsageError
from imagegate.oci.reference import is_loopback_registry, parse_image_name, parse_reference
from imagegate.oci.transports import open_source
from tests.helpers import imagegate


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest"),
    [
        ("python", "docker.io", "library/python", None, None),
        ("python:3.11", "docker.io", "library/python", "3.11", None),
        ("vllm/vllm-openai:v0.11.0", "docker.io", "vllm/vllm-openai", "v0.11.0", None),
        ("127.0.0.1:5000/team/app:1", "127.0.0.1:5000", "team/app", "1", None),
        ("localhost/app", "localhost", "app", None, None),
        ("ghcr.io/a/b@sha256:" + "a" * 64, "ghcr.io", "a/b", None, "sha256:" + "a" * 64),
        ("[::1]:5000/app:x", "[::1]:5000", "app", "x", None),
    ],
)
def test_parses_references(
    text: str, registry: str, repository: str, tag: str | None, digest: str | None
) -> None:
    ref = parse_reference(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (registry, repository, tag, digest)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("UPPER/case", "lowercase"),
        ("app@sha256:1234", "not a digest"),
        ("app:bad tag", "not a valid tag"),
        ("app:-x", "not a valid tag"),
        ("a//b", "not a repository path"),
        ("127.0.0.1:5000/", "no repository"),
        ("x" * 300, "longer than"),
    ],
)
def test_refuses_malformed_references(text: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        parse_reference(text)


def test_loopback_registries_are_plain_http() -> None:
    assert is_loopback_registry("127.0.0.1:5000") and is_loopback_registry("localhost:1")
    assert is_loopback_registry("[::1]:5000")
    assert not is_loopback_registry("registry.example:5000")


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("ftp://x/y", "invalid image source 'ftp://x/y': transport 'ftp' is not supported"),
        ("containers-storage:app", "transport 'containers-storage' is not supported"),
        ("docker-archive:", "invalid image source 'docker-archive:': no path after docker-archive:"),
        ("oci:", "no directory after oci:"),
        ("docker-daemon:", "no image after docker-daemon:"),
        ("docker://Bad/Name", "invalid image reference 'Bad/Name': repository names must be lowercase"),
    ],
)
def test_refuses_malformed_sources(spec: str, problem: str) -> None:
    with pytest.raises(UsageError, match=re.escape(problem)):
        open_source(spec)


def test_cli_malformed_reference_is_a_usage_error() -> None:
    r = imagegate("layers", "docker://UPPER/case:1")
    assert r.returncode == 3
    assert "invalid image reference 'UPPER/case:1'" in r.stderr and "lowercase" in r.stderr
    r = imagegate("compare", "app@sha256:12", "app:1")
    assert r.returncode == 3 and "not a digest" in r.stderr
    r = imagegate("layers", "x:1", "--expect-config", "sha256:nothex")
    assert r.returncode == 3 and "--expect-config" in r.stderr


ID = "sha256:" + "c" * 64
DIGEST = "sha256:" + "d" * 64


@pytest.mark.parametrize(
    ("text", "repository", "one_image"),
    [
        ("python", "python", "python:latest"),  # as written: an engine resolves short names itself
        ("python:3.11", "python", "python:3.11"),
        ("127.0.0.1:5000/team/app", "127.0.0.1:5000/team/app", "127.0.0.1:5000/team/app:latest"),
        (
            f"127.0.0.1:5000/team/app:1@{DIGEST}",
            "127.0.0.1:5000/team/app",
            f"127.0.0.1:5000/team/app:1@{DIGEST}",
        ),
        (f"ghcr.io/a/b@{DIGEST}", "ghcr.io/a/b", f"ghcr.io/a/b@{DIGEST}"),
        (ID, None, ID),  # an image ID names no repository and is saved as is
        ("c" * 12, "c" * 12, "c" * 12),  # a short hex ID: an engine tries it as an ID first
    ],
)
def test_an_image_name_is_parsed_once_and_keeps_its_text(
    text: str, repository: str | None, one_image: str
) -> None:
    name = parse_image_name(text)
    assert str(name) == text
    assert name.repository == repository
    assert name.pinned_or_tagged == one_image
    assert (name.reference is None) == (text == ID)


def test_an_image_id_is_refused_where_only_a_reference_will_do() -> None:
    with pytest.raises(UsageError, match="is an image ID, not an image reference"):
        parse_image_name(ID, "--image", engine_id=False)
    with pytest.raises(UsageError, match=r"IMAGE '\.\./x' is not an image reference or ID"):
        parse_image_name("../x")


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        (DIGEST, True),
        ("sha512:" + "e" * 128, True),
        (DIGEST + "\n", False),  # a trailing newline (a file read without strip) is no digest
        ("sha256:" + "d" * 63, False),
        ("sha256:" + "D" * 64, False),
        ("sha512:" + "e" * 64, False),
        ("md5:" + "e" * 32, False),
    ],
)
def test_one_digest_check(text: str, ok: bool) -> None:
    assert is_digest(text) is ok
