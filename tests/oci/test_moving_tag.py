"""One read per subject: a mirror's tag that names one image when first read and another after
(tests/oci/moving_tag_front.py) is never concluded about from the second read. `audit` says
nothing was judged (exit 2, the tag and both digests named); `layers` reads the tag once and
names the manifest it read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagegate.oci.registry import RegistryClient
from tests.helpers import imagegate
from tests.oci.conftest import Pushed
from tests.oci.infra import Registry
from tests.oci.moving_tag_front import moving_tag_front

pytestmark = pytest.mark.engine


def digests(mirror: Registry, *tags: str) -> list[str]:
    with RegistryClient(mirror.host) as c:
        return [c.get_manifest("team/app", t).digest for t in tags]


def test_audit_judges_no_mirror_whose_tag_moved(
    pushed: Pushed, recompressed: str, zstd_mirror: str, mirror: Registry, tmp_path: Path
) -> None:
    """Same content at the first read (the recompressed copy), another image (zstd: other
    config, other layers) at the next: not `same content` but undecided, saying why."""
    first, then = digests(mirror, "gzip9", "zstd")
    with moving_tag_front(mirror.host, "team/app", "moving", "gzip9", "zstd") as front:
        moving = front.ref("team/app", "moving")
        (tmp_path / "inv.yaml").write_text(
            "apiVersion: imagegate/v1\nkind: Inventory\nmirrors:\n"
            f'  - {{name: moving, official: "{pushed.ref}", mirror: "{moving}", deep: true}}\n'
        )
        r = imagegate("audit", "inv.yaml", "--json", "audit.json", "-q", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    (item,) = json.loads((tmp_path / "audit.json").read_text())["items"]
    assert (item["outcome"], item["exitCode"]) == ("ERROR", 2), item
    assert (
        f"docker://{moving}: the tag named {first} when it was read and names {then} now: it "
        "changed between reads" in item["detail"]
    ), item["detail"]
    assert (
        f"name the image by its digest and run again (the one read: {front.host}/team/app@{first})"
        in item["detail"]
    )


def test_layers_reads_a_tag_once_and_names_what_it_read(
    recompressed: str, zstd_mirror: str, mirror: Registry
) -> None:
    (first,) = digests(mirror, "gzip9")
    with moving_tag_front(mirror.host, "team/app", "moving", "gzip9", "zstd") as front:
        r = imagegate("layers", front.ref("team/app", "moving"), "--format", "json", "-q")
        reads = front.reads
    assert r.returncode == 0, r.stdout + r.stderr
    doc = r.json()
    assert doc["manifest_digest"] == first and reads == 1, (doc["manifest_digest"], reads)
