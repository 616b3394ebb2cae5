"""`imagegate audit` of whole mirrored repositories: a mirror set lists a namespace's repositories
(the registry's catalog) and their tags, pairs each with its official image by a pattern, reads
every unique blob once across the run (and not again where this machine verified it before), and
still names a tampered layer in one tag. Real registries (distribution), real skopeo copies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from imagegate.oci.registry import RegistryClient
from tests.helpers import imagegate
from tests.oci.conftest import Pushed
from tests.oci.infra import FaultyProxy, Registry, other_gzip_layer, skopeo, start_registry

pytestmark = pytest.mark.engine


@dataclass(frozen=True)
class Mirrored:
    official: Registry
    mirror: Registry
    blobs: int  # the unique layer blobs the mirror's tags name (the tampered one included)


def _copy(src: str, dest: str) -> None:
    skopeo(
        "copy",
        "-q",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
        f"docker://{src}",
        f"docker://{dest}",
    )


@pytest.fixture(scope="module")
def mirrored(
    pushed: Pushed, recompressed: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Mirrored]:
    """Official: vllm/openai:{v1,v2,v3,bad} and vllm/router:v1, all the test image. The mirror:
    the same tags re-compressed (other blobs, same config), one blob set under five tags; and
    vllm/openai:bad, whose third layer is other content under the same config."""
    off, mir = (start_registry(tmp_path_factory.mktemp(n)) for n in ("off", "mir"))
    for repo, tags in (("vllm/openai", ("v1", "v2", "v3", "bad")), ("vllm/router", ("v1",))):
        for tag in tags:
            _copy(pushed.ref, f"{off.host}/{repo}:{tag}")
            if tag != "bad":
                _copy(recompressed, f"{mir.host}/{repo}:{tag}")
    client = RegistryClient(mir.host)
    fetched = client.get_manifest("vllm/openai", "v1")
    manifest = json.loads(fetched.raw)
    layer = other_gzip_layer("tampered")
    manifest["layers"][2].update(digest=client.upload_blob("vllm/openai", layer), size=len(layer))
    client.put_manifest("vllm/openai", "bad", json.dumps(manifest).encode(), fetched.media_type)
    yield Mirrored(off, mir, blobs=len(manifest["layers"]) + 1)
    off.stop()
    mir.stop()


def _inventory(tmp_path: Path, sets: str) -> Path:
    p = tmp_path / "inventory.yaml"
    p.write_text(f"apiVersion: imagegate/v1\nkind: Inventory\nmirror_sets:\n{sets}")
    return p


def _audit(inv: Path, *args: str) -> dict:  # type: ignore[type-arg]
    r = imagegate("audit", str(inv), "--json", "-", "-q", "-j", "4", *args, cwd=inv.parent)
    assert r.stdout.strip(), r.stderr
    doc: dict = json.loads(r.stdout)  # type: ignore[type-arg]
    doc["_rc"], doc["_stderr"] = r.returncode, r.stderr
    return doc


def test_a_namespace_is_audited_with_each_unique_blob_read_once(mirrored: Mirrored, tmp_path: Path) -> None:
    off, mir = mirrored.official.host, mirrored.mirror.host
    inv = _inventory(
        tmp_path, f"  - {{mirror: '{mir}/vllm/*', official: '{off}/vllm/{{repository}}:{{tag}}'}}\n"
    )
    doc = _audit(inv)
    got = {i["name"]: i["outcome"] for i in doc["items"]}
    assert got == {
        "vllm/openai:v1": "SAME_CONTENT",
        "vllm/openai:v2": "SAME_CONTENT",
        "vllm/openai:v3": "SAME_CONTENT",
        "vllm/openai:bad": "CORRUPT",
        "vllm/router:v1": "SAME_CONTENT",
    }
    bad = next(i for i in doc["items"] if i["name"] == "vllm/openai:bad")
    assert "layer 3" in bad["detail"] and "DIFFID_MISMATCH" in bad["detail"]
    assert doc["_rc"] == 1 and doc["outcomes"] == {"SAME_CONTENT": 4, "CORRUPT": 1}
    # Fifteen layers named, each unique blob read once: the shared three and the tampered one.
    layers = doc["layers"]
    assert (layers["read"], layers["known"]) == (mirrored.blobs, 15 - mirrored.blobs)

    # Run again: what verified is known (a verified pair); the tampered blob, never recorded, is read.
    again = _audit(inv)
    assert {i["name"]: i["outcome"] for i in again["items"]} == got
    assert (again["layers"]["read"], again["layers"]["known"]) == (1, 14)
    # --no-cache: no pair of an earlier run; the run's own reads are still shared.
    fresh = _audit(inv, "--no-cache")
    assert (fresh["layers"]["read"], fresh["layers"]["known"]) == (mirrored.blobs, 15 - mirrored.blobs)


def test_an_audit_cut_short_reads_again_only_what_it_had_not_verified(
    mirrored: Mirrored, tmp_path: Path
) -> None:
    """Each blob's pair is kept as soon as it verifies: an audit ended half-way (here by its
    --timeout, while the registry sends nothing of one layer), run again, reads that layer alone."""
    off, mir = mirrored.official.host, mirrored.mirror.host
    proxy = FaultyProxy(mir, stall_first_blob_s=120, blob_over=100_000).start()
    try:
        sets = (
            f"  - {{mirror: '{proxy.host}/vllm/router', official: '{off}/vllm/router:{{tag}}', tags: [v1]}}\n"
        )
        cut = imagegate("audit", str(_inventory(tmp_path, sets)), "-q", "--timeout", "8", cwd=tmp_path)
    finally:
        proxy.stop()
    assert cut.returncode == 2 and proxy.cut == 1, cut.stdout + cut.stderr
    sets = f"  - {{mirror: '{mir}/vllm/router', official: '{off}/vllm/router:{{tag}}', tags: [v1]}}\n"
    again = _audit(_inventory(tmp_path, sets))
    assert again["outcomes"] == {"SAME_CONTENT": 1}
    assert (again["layers"]["read"], again["layers"]["known"]) == (1, 2)


def test_tags_by_pattern_or_by_name_without_listing(mirrored: Mirrored, tmp_path: Path) -> None:
    off, mir = mirrored.official.host, mirrored.mirror.host
    pattern = f"  - {{mirror: '{mir}/vllm/openai', official: '{off}/vllm/openai:{{tag}}', tags: ['v*']}}\n"
    doc = _audit(_inventory(tmp_path, pattern))
    assert sorted(i["name"] for i in doc["items"]) == ["vllm/openai:v1", "vllm/openai:v2", "vllm/openai:v3"]
    assert doc["_rc"] == 0

    # Listing off (every answer a 404 here): plain names need none; a namespace is named as unlistable.
    proxy = FaultyProxy(mir, fail_first=10**6, fail_status=404).start()
    try:
        sets = (
            f"  - {{mirror: '{proxy.host}/vllm/*', official: '{off}/vllm/{{repository}}:{{tag}}'}}\n"
            f"  - {{mirror: '{mir}/vllm/router', official: '{off}/vllm/router:{{tag}}', tags: [v1]}}\n"
            f"  - {{mirror: '{proxy.host}/vllm/openai', official: '{off}/vllm/openai:{{tag}}', tags: ['v*'], name: via}}\n"
            f"  - {{mirror: '{mir}/vllm/openai', official: '{off}/vllm/openai:{{tag}}', tags: ['zzz*']}}\n"
        )
        doc = _audit(_inventory(tmp_path, sets))
    finally:
        proxy.stop()
    items = {i["name"]: i for i in doc["items"]}
    assert items["vllm/router:v1"]["outcome"] == "SAME_CONTENT"
    unlisted = items[f"{proxy.host}/vllm/*"]
    assert unlisted["outcome"] == "ERROR"
    assert "the registry's catalog could not be read" in unlisted["detail"]
    assert "catalog listing is often disabled: name the repositories" in unlisted["detail"]
    assert unlisted["detail"].startswith(f"mirror set {proxy.host}/vllm/*: ")
    via = items["via"]
    assert via["outcome"] == "ERROR" and via["detail"].startswith(
        "mirror set via: the tags of vllm/openai could not be listed"
    )
    assert "tag listing may be disabled: name the tags (tags: [v1, v2]) in the inventory" in via["detail"]
    none = items[f"{mir}/vllm/openai"]
    assert none["exitCode"] == 3
    assert none["detail"].startswith(
        f"mirror set {mir}/vllm/openai: names no image (no repository or tag matched)"
    )
    assert proxy.seen and all(
        ("/v2/_catalog" in s or "/tags/list" in s or s.endswith("/v2/")) for s in proxy.seen
    )


def test_a_mirror_set_is_checked_before_anything_is_read(tmp_path: Path) -> None:
    for sets, words in (
        ("  - {mirror: 'r.example/ns/*', official: 'docker.io/x/{repository}'}\n", "put {tag}"),
        ("  - {mirror: 'r.example/ns/app:1', official: 'd.io/x:{tag}'}\n", "no tag or digest"),
        ("  - {mirror: 'r.example/ns/*/x', official: 'd.io/x:{tag}'}\n", "one * at the end"),
        ("  - {mirror: 'r.example/ns/a', official: 'd.io/x:{tag}-{arch}'}\n", "unknown placeholder {arch}"),
    ):
        r = imagegate("audit", str(_inventory(tmp_path, sets)))
        assert r.returncode == 3, r.stderr
        assert "mirror_sets[0]" in r.stderr and words in r.stderr, r.stderr
