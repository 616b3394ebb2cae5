"""A registry may page its referrers listing (OCI distribution 1.1: each page an image index, the
next named by `Link: <…>; rel="next"`): `verify --image` and `attach` read every page, and a
listing they cannot read whole is refused, never read in part (the statement that refuses may be
on the page left out). Against the real registry the tests start, behind the referrers front
(tests/attest/referrers_front.py, a stand-in named as such: Debian's registry has no referrers
API), which pages as a registry may (N a page) or as a hostile one might (a cycle, a link to
another host or scheme, pages without end, a page that is no index)."""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from imagegate.attest import attach, keys, referrers
from imagegate.attest.attach import MAX_ATTESTATIONS, Flooded
from imagegate.attest.referrers import BUNDLE_TYPES, MAX_REFERRER_PAGES
from imagegate.domain.digest import digest_of
from imagegate.oci.registry import RegistryError
from tests.attest.conftest import cli, pub_of, push_one_file_image
from tests.attest.referrers_front import Paging, referrers_front
from tests.attest.test_registry import _signed

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
EMPTY = b"{}"
SBOM = "application/spdx+json"  # another tool's artifact: listed, never read as a statement
_SERIAL = itertools.count()


def _push(host: str, name: str) -> str:
    """A one-layer image in a fresh repository of `host` (no engine needed): every test starts
    with no attestation."""
    return push_one_file_image(f"{host}/pages/{name}:1", name.encode())


def _refer(ref: str, artifact_type: str, count: int) -> None:
    """`count` artifacts of `artifact_type` referring to the image, pushed through `ref`'s
    registry (the front indexes them)."""
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        repo = parsed.repository
        top = client.get_manifest(repo, parsed.ref)
        subject = {"mediaType": OCI_MANIFEST, "size": len(top.raw), "digest": top.digest}
        client.upload_blob(repo, EMPTY)
        empty = {"mediaType": "application/vnd.oci.empty.v1+json", "digest": digest_of(EMPTY), "size": 2}
        for _ in range(count):
            raw = json.dumps(
                {
                    "schemaVersion": 2,
                    "mediaType": OCI_MANIFEST,
                    "artifactType": artifact_type,
                    "config": empty,
                    "layers": [{**empty, "mediaType": artifact_type}],
                    "subject": subject,
                    "annotations": {"n": str(next(_SERIAL))},  # each its own manifest
                }
            ).encode()
            client.put_referrer(repo, raw, OCI_MANIFEST)


@contextlib.contextmanager
def _fronted(registry: str, name: str, paging: Paging, others: int = 0) -> Iterator[tuple[str, str]]:
    """A fresh image behind a front paging as `paging` says, `others` of another tool's artifacts
    listed first: (the front, the image through it)."""
    ref = _push(registry, name)
    with referrers_front(registry, paging) as front:
        via_front = ref.replace(registry, front)
        _refer(via_front, SBOM, others)
        yield front, via_front


def _keyed(tmp_path: Path) -> tuple[keys.SigningKey, Path]:
    key = keys.generate()
    (tmp_path / "k.pub").write_bytes(key.public.pem)
    return key, tmp_path / "k.pub"


def _attached(tmp_path: Path, ref: str, key: keys.SigningKey, verdict: str, name: str) -> Path:
    """`imagegate attach` of a new attempt's acceptance (its VSA and test-result with it)."""
    signed = _signed(tmp_path, ref, key, verdict, name)
    done = cli("attach", str(signed), ref, "--key", str(pub_of(key, tmp_path)))
    assert done.returncode == 0, done.stdout + done.stderr
    return signed


def _attach_in_process(tmp_path: Path, ref: str) -> None:
    """A new attempt's PASS attached by the Python API, verified with its own key."""
    key = keys.generate()
    referrers.attach_file(_signed(tmp_path, ref, key, "PASS", "pass"), ref, [key.public])


def _only_referrers(ref: str) -> None:
    """The image's `.att` tag deleted: what is verified then comes from the referrers alone."""
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        digest = attach.resolve(client, parsed).digests[0]
    url = f"http://{parsed.registry}/v2/{parsed.repository}/manifests"
    att = httpx.get(f"{url}/{attach.attestation_tag(digest)}", headers={"Accept": OCI_MANIFEST}, timeout=10)
    assert httpx.delete(f"{url}/{att.headers['Docker-Content-Digest']}", timeout=10).status_code == 202


def _listing(front: str, ref: str) -> list[dict[str, str]]:
    """Every entry the front lists for the image, read page by page as a client following the
    links would."""
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        digest = attach.resolve(client, parsed).digests[0]
    url: str | None = f"http://{front}/v2/{parsed.repository}/referrers/{digest}"
    out: list[dict[str, str]] = []
    while url:
        got = httpx.get(url, timeout=10)
        out += got.json()["manifests"]
        url = str(got.url.join(got.links["next"]["url"])) if "next" in got.links else None
    return out


@pytest.mark.parametrize(
    ("links", "code", "said"),
    [
        ("cycle", 2, "a cycle, not followed"),
        ("host", 2, "another host or scheme; not followed"),
        ("scheme", 2, "another host or scheme; not followed"),
        ("port", 2, "another host or scheme; not followed"),
        ("lost", 2, "(page http://127.0.0.1:"),  # the page named
        ("lost", 2, "not found (404)"),
        ("other", 2, "is no image index"),
        ("html", 2, "is no image index"),
        ("endless", 1, f"run past the {MAX_REFERRER_PAGES} pages read; nothing verified"),
    ],
)
def test_a_listing_that_cannot_be_read_whole_is_not_read_though_its_first_page_holds_a_statement(
    registry: str, tmp_path: Path, links: str, code: int, said: str
) -> None:
    paging = Paging(per_page=3)
    with _fronted(registry, f"bad-{links}", paging) as (_, ref):
        _attach_in_process(tmp_path, ref)  # page 1
        _refer(ref, SBOM, 1)  # page 2
        parsed = attach.parse_image(ref)
        with attach.client_for(parsed) as client:
            image = attach.resolve(client, parsed)
            assert len(referrers.fetch(client, image)) == 3
            paging.links, paging.served = links, []
            with pytest.raises((RegistryError, Flooded)) as refused:
                referrers.fetch(client, image)
    assert refused.value.exit_code == code and said in str(refused.value), refused.value
    if links in ("host", "scheme", "port"):  # named by another name of the same front: never asked
        assert len(paging.served) == 1, paging.served


def _fetched(ref: str) -> int:
    """How many statements `verify --image` would read among the image's referrers."""
    parsed = attach.parse_image(ref)
    with attach.client_for(parsed) as client:
        return len(referrers.fetch(client, attach.resolve(client, parsed)))


def test_as_many_pages_as_read_are_read_and_one_more_is_flooded(registry: str, tmp_path: Path) -> None:
    paging = Paging(per_page=1)
    with _fronted(registry, "pages", paging) as (_, ref):
        _attach_in_process(tmp_path, ref)
        _refer(ref, SBOM, MAX_REFERRER_PAGES - 3)
        paging.served.clear()
        assert _fetched(ref) == 3 and len(paging.served) == MAX_REFERRER_PAGES  # the statements, every page
        _refer(ref, SBOM, 1)
        with pytest.raises(Flooded) as refused:
            _fetched(ref)
    assert f"run past the {MAX_REFERRER_PAGES} pages read; nothing verified" in str(refused.value)


def test_as_many_entries_as_read_across_pages_are_read_and_one_more_is_flooded(
    registry: str, tmp_path: Path
) -> None:
    paging = Paging(per_page=100)
    with _fronted(registry, "entries", paging) as (_, ref):
        _attach_in_process(tmp_path, ref)
        _refer(ref, BUNDLE_TYPES + ".v0.3+json", MAX_ATTESTATIONS - 3)  # listed, read, none an envelope
        assert _fetched(ref) == 3
        _refer(ref, BUNDLE_TYPES + ".v0.3+json", 1)  # one past it, on page 3
        paging.served.clear()
        with pytest.raises(Flooded) as refused:
            _fetched(ref)
    said = f"more than the {MAX_ATTESTATIONS} attestations read for one image, by page 3; nothing verified"
    assert said in str(refused.value) and refused.value.exit_code == 1
    assert len(paging.served) == 3


def test_verify_finds_a_statement_on_the_second_page(registry: str, tmp_path: Path) -> None:
    paging = Paging(per_page=2)
    with _fronted(registry, "second", paging, others=2) as (_, ref):  # page 1: another tool's
        key, pub = _keyed(tmp_path)
        _attached(tmp_path, ref, key, "PASS", "pass")  # pages 2 and 3
        _only_referrers(ref)
        paging.served.clear()
        ok = cli("verify", "--image", ref, "--key", str(pub), "--expect-verdict", "PASS")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "(the referrers API)" in ok.stdout
    assert [p.rpartition("?")[2] for p in paging.served] == ["page=1", "page=2", "page=3"]


def test_attach_finds_its_own_statement_on_a_later_page_and_pushes_nothing_again(
    registry: str, tmp_path: Path
) -> None:
    with _fronted(registry, "again", Paging(per_page=2), others=3) as (front, ref):
        key, _ = _keyed(tmp_path)
        signed = _signed(tmp_path, ref, key, "PASS", "pass")
        assert cli("attach", str(signed), ref, "--key", str(pub_of(key, tmp_path))).returncode == 0
        before = _listing(front, ref)
        again = cli("attach", str(signed), ref, "--key", str(pub_of(key, tmp_path)))
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.count("already a referrer") == 3, again.stdout
        assert _listing(front, ref) == before and len(before) == 6


def test_attach_replaces_a_statement_whose_referrers_are_on_later_pages(
    registry: str, tmp_path: Path
) -> None:
    with _fronted(registry, "replace", Paging(per_page=2), others=2) as (front, ref):
        key, pub = _keyed(tmp_path)
        _attached(tmp_path, ref, key, "FAIL", "fail")  # pages 2 and 3
        passed = cli(
            "attach",
            str(_signed(tmp_path, ref, key, "PASS", "pass")),
            ref,
            "--key",
            str(pub_of(key, tmp_path)),
        )
        assert passed.returncode == 0, passed.stdout + passed.stderr
        assert passed.stdout.count("replaced referrer") == 3, passed.stdout
        listed = _listing(front, ref)
        assert len(listed) == 5 and sum(e["artifactType"] == SBOM for e in listed) == 2
        _only_referrers(ref)
        ok = cli("verify", "--image", ref, "--key", str(pub), "--expect-verdict", "PASS")
        assert ok.returncode == 0, ok.stdout + ok.stderr


def test_verify_and_attach_refuse_a_listing_whose_next_page_is_on_another_host(
    registry: str, tmp_path: Path
) -> None:
    paging = Paging(per_page=3)
    with _fronted(registry, "elsewhere", paging) as (_, ref):
        key, pub = _keyed(tmp_path)
        signed = _attached(tmp_path, ref, key, "PASS", "pass")  # page 1: the PASS, whole
        _refer(ref, SBOM, 1)  # page 2
        _only_referrers(ref)
        paging.links = "host"
        ran = cli("verify", "--image", ref, "--key", str(pub), "--expect-verdict", "PASS")
        again = cli("attach", str(signed), ref, "--key", str(pub_of(key, tmp_path)))
    for done in (ran, again):
        assert done.returncode == 2, done.stdout + done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("imagegate: error:")]
        assert len(errors) == 1 and "another host or scheme; not followed" in errors[0], done.stderr
        assert "Traceback" not in done.stderr
