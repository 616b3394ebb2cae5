"""`imagegate layers` on real images: pushed by the engine, copied by skopeo, then tampered
with the way a broken mirror or an attacker would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import imagegate
from tests.oci.conftest import Pushed
from tests.oci.infra import Layout, Registry, other_gzip_layer, zeros_gzip

pytestmark = pytest.mark.engine


def _layers_json(*args: str) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    r = imagegate("layers", *args, "--format", "json")
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else {}), r.stderr


def test_registry_image_verifies(pushed: Pushed) -> None:
    r = imagegate("layers", f"docker://{pushed.ref}", "--expect-config", pushed.config_digest)
    assert r.returncode == 0, r.stderr
    assert f"OK: config {pushed.config_digest}, 3/3 layers verified" in r.stdout
    assert "MATCH" in r.stdout
    rc, doc, _ = _layers_json(pushed.ref)  # a bare reference means docker://
    assert rc == 0 and doc["ok"] is True
    assert [x["status"] for x in doc["layers"]] == ["OK"] * 3
    assert {x["compression"] for x in doc["layers"]} == {"gzip"}
    assert all(x["expected_diff_id"] == x["actual_diff_id"] for x in doc["layers"])


def test_expect_config_mismatch_fails(pushed: Pushed) -> None:
    other = "sha256:" + "0" * 64
    r = imagegate("layers", pushed.ref, "--expect-config", other)
    assert r.returncode == 1
    assert f"expected: {other} DIFFERENT" in r.stdout
    # The config is not called OK, and the reason is the config, not "0 of 3 layers failed".
    assert f"config:   {pushed.config_digest} NOT THE EXPECTED CONFIG" in r.stdout, r.stdout
    assert f"config:   {pushed.config_digest} OK" not in r.stdout
    assert "0 of" not in r.stdout
    fail = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL: ")]
    assert fail == [f"FAIL: config {pushed.config_digest} is not the expected {other} (3/3 layers verified)"]


def test_zstd_layers_verify(zstd_mirror: str) -> None:
    rc, doc, err = _layers_json(zstd_mirror)
    assert rc == 0, err
    assert {x["compression"] for x in doc["layers"]} == {"zstd"}


def test_a_root_cache_that_cannot_be_used_reads_every_blob(pushed: Pushed, tmp_path: Path) -> None:
    """A home that is read-only (a Pod's) or a --cache-dir that is no folder: said, and every blob is
    read as it always was."""
    (tmp_path / "file").write_text("not a folder")
    r = imagegate("layers", f"docker://{pushed.ref}", "--cache-dir", str(tmp_path / "file"))
    assert r.returncode == 0, r.stderr
    assert "imagegate: no verified pairs used (root cache" in r.stderr and "every blob is read" in r.stderr
    assert "3/3 layers verified" in r.stdout and "by a verified pair" not in r.stdout


def test_flipped_byte_in_stored_blob_is_digest_mismatch(pushed: Pushed, tmp_path: Path) -> None:
    from tests.oci.infra import skopeo, start_registry

    reg = start_registry(tmp_path / "reg")
    try:
        ref = f"{reg.host}/team/app:1"
        skopeo(
            "copy",
            "-q",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
            f"docker://{pushed.ref}",
            f"docker://{ref}",
        )
        rc, doc, _ = _layers_json(ref)
        assert rc == 0
        victim = doc["layers"][1]["expected_digest"]
        data = bytearray(reg.blob_file(victim).read_bytes())
        data[len(data) // 2] ^= 0x01
        reg.blob_file(victim).write_bytes(bytes(data))
        # This machine verified those bytes a moment ago: its verified pair stands in for them,
        # said so; --no-cache reads what the registry holds now.
        known = imagegate("layers", ref)
        assert known.returncode == 0
        assert "3 by a verified pair, not read now; --no-cache reads them" in known.stdout
        r = imagegate("layers", ref, "--no-cache")
        assert r.returncode == 1
        assert "layer 2 DIGEST_MISMATCH: the blob hashes to sha256:" in r.stdout
        assert f"the manifest says {victim}" in r.stdout

        # Truncated in storage: shorter than the manifest says.
        victim = doc["layers"][2]["expected_digest"]
        data = reg.blob_file(victim).read_bytes()
        reg.blob_file(victim).write_bytes(data[: len(data) - 100])
        rc, doc2, _ = _layers_json(ref, "--no-cache")
        assert rc == 1
        third = doc2["layers"][2]
        assert third["status"] == "SIZE_MISMATCH"
        assert third["actual_size"] == len(data) - 100 and third["expected_size"] == len(data)
        assert "truncated" in third["detail"]
    finally:
        reg.stop()


def test_tampered_layer_is_diffid_mismatch_naming_the_layer(layout: Layout) -> None:
    m = layout.manifest()
    evil = layout.put_blob(other_gzip_layer("tamper"))
    m["layers"][1].update(evil)  # digest and size right, content not the config's
    layout.set_manifest(m)
    rc, doc, _ = _layers_json(f"oci:{layout.root}:1")
    assert rc == 1
    bad = doc["layers"][1]
    assert bad["status"] == "DIFFID_MISMATCH"
    assert bad["expected_digest"] == evil["digest"]
    assert bad["expected_diff_id"] == layout.config()["rootfs"]["diff_ids"][1]
    assert bad["actual_diff_id"] != bad["expected_diff_id"]
    r = imagegate("layers", f"oci:{layout.root}:1")
    assert "layer 2 DIFFID_MISMATCH: content differs" in r.stdout
    assert "FAIL: 1 of 3 layers failed" in r.stdout


def test_wrong_size_in_manifest(layout: Layout) -> None:
    m = layout.manifest()
    m["layers"][0]["size"] += 7
    layout.set_manifest(m)
    rc, doc, _ = _layers_json(f"oci:{layout.root}")
    assert rc == 1
    first = doc["layers"][0]
    assert first["status"] == "SIZE_MISMATCH"
    assert first["expected_size"] == first["actual_size"] + 7


def test_corrupt_gzip_is_decompress_error(layout: Layout) -> None:
    m = layout.manifest()
    blob = bytearray(layout.blob(m["layers"][2]["digest"]))
    blob[len(blob) // 2] ^= 0xFF  # still gzip magic, broken deflate stream
    m["layers"][2].update(layout.put_blob(bytes(blob)))
    layout.set_manifest(m)
    rc, doc, _ = _layers_json(f"oci:{layout.root}")
    assert rc == 1
    assert doc["layers"][2]["status"] == "DECOMPRESS_ERROR"
    assert "gzip" in doc["layers"][2]["detail"]


def test_missing_blob_and_foreign_layer(layout: Layout) -> None:
    m = layout.manifest()
    layout.blob_path(m["layers"][0]["digest"]).unlink()
    foreign = m["layers"][2]
    layout.blob_path(foreign["digest"]).unlink()
    foreign["mediaType"] = "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
    foreign["urls"] = ["https://example.invalid/base-layer"]
    layout.set_manifest(m)
    rc, doc, _ = _layers_json(f"oci:{layout.root}")
    assert rc == 1
    assert [x["status"] for x in doc["layers"]] == ["MISSING", "OK", "FOREIGN"]
    assert "not verified" in doc["layers"][2]["detail"]


def test_only_foreign_unverified_still_passes(layout: Layout) -> None:
    m = layout.manifest()
    foreign = m["layers"][2]
    layout.blob_path(foreign["digest"]).unlink()
    foreign["mediaType"] = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"
    layout.set_manifest(m)
    r = imagegate("layers", f"oci:{layout.root}")
    assert r.returncode == 0
    assert "2/3 layers verified (1 foreign layers not verified)" in r.stdout


def test_tampered_config_is_digest_mismatch(layout: Layout) -> None:
    m = layout.manifest()
    path = layout.blob_path(m["config"]["digest"])
    cfg = path.read_bytes().replace(b'"IMAGEGATE_TEST=1"', b'"IMAGEGATE_TEST=2"')
    path.write_bytes(cfg)
    rc, doc, _ = _layers_json(f"oci:{layout.root}")
    assert rc == 1
    assert doc["config"]["status"] == "DIGEST_MISMATCH"


# The goal docs/benchmarks.md and benchmarks/bench_layers.py state: verification in at most 100 MB.
MEMORY_GOAL_BYTES = 100_000_000


def test_decompression_bomb_is_stopped_with_bounded_memory(layout: Layout) -> None:
    m = layout.manifest()
    bomb = zeros_gzip(512 << 20)  # ~500 KB that inflates to 512 MiB
    m["layers"][0].update(layout.put_blob(bomb))
    layout.set_manifest(m)
    cmd = [sys.executable, "-m", "imagegate", "layers", f"oci:{layout.root}", "--max-layer-size", "64MiB"]
    code, out, peak_kib = run_measured(cmd)
    assert code == 1
    assert "layer 1 DECOMPRESS_ERROR: the layer decompresses to more than 67108864 bytes" in out
    assert "decompression bomb" in out
    assert peak_kib * 1024 <= MEMORY_GOAL_BYTES, f"peak RSS {peak_kib // 1024} MiB"


# A small launcher forks the command and reports its ru_maxrss: Linux carries ru_maxrss over
# fork+exec, so a command forked straight from pytest would report pytest's own size.
_LAUNCHER = (
    "import os, subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True)\n"
    "out = p.stdout.read()\n"
    "_, status, usage = os.wait4(p.pid, 0)\n"
    "sys.stdout.write(f'{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}\\n' + out)\n"
)


def run_measured(cmd: list[str]) -> tuple[int, str, int]:
    """(exit code, stdout, peak RSS in KiB) of `cmd`."""
    text = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, *cmd], capture_output=True, text=True, check=True
    ).stdout
    first, _, out = text.partition("\n")
    code, peak = first.split()
    return int(code), out, int(peak)


def test_bomb_memory_is_bounded(layout: Layout) -> None:
    """Peak RSS stays far below the inflated size, whatever the limit."""
    m = layout.manifest()
    bomb = zeros_gzip(512 << 20)
    m["layers"][0].update(layout.put_blob(bomb))
    layout.set_manifest(m)
    code = (
        "import resource,sys\n"
        "from imagegate.oci.transports import open_source\n"
        "from imagegate.oci.layercheck import verify_source\n"
        f"r = verify_source(open_source('oci:{layout.root}'), max_uncompressed=1<<40)\n"
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the forked (large) pytest.
        "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
        "print(r.layers[0].status, r.layers[0].uncompressed_size, hwm)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "DIFFID_MISMATCH" and int(out[1]) == 512 << 20  # fully inflated, not a real layer
    assert int(out[2]) * 1024 <= MEMORY_GOAL_BYTES, f"peak RSS {int(out[2]) // 1024} MiB"


def test_no_progress_noise_when_not_a_tty(pushed: Pushed) -> None:
    r = imagegate("layers", pushed.ref)
    assert r.returncode == 0 and r.stderr == ""


def test_help_has_examples() -> None:
    r = imagegate("layers", "--help")
    assert r.returncode == 0 and "imagegate layers docker-daemon:" in r.stdout and "Exit codes" in r.stdout
    r = imagegate("compare", "--help")
    assert r.returncode == 0 and "imagegate compare" in r.stdout and "--deep" in r.stdout


def test_unreachable_registry_is_undecided(official: Registry) -> None:
    from tests.oci.infra import free_port

    port = free_port()
    r = imagegate("layers", f"127.0.0.1:{port}/team/app:1")
    assert r.returncode == 2
    assert f"imagegate: error: registry 127.0.0.1:{port} refused the connection (GET " in r.stderr
    assert "Error" not in r.stderr  # in words, no exception's name


def test_unknown_tag_is_an_input_error_with_the_registry_message(official: Registry) -> None:
    """An image the registry does not have is "image not found", exit 3, as for the engine."""
    r = imagegate("layers", f"{official.host}/team/nothing:1")
    assert r.returncode == 3, r.stderr
    assert "image not found in the registry" in r.stderr and "MANIFEST_UNKNOWN" in r.stderr


def test_the_largest_layer_is_read_first_and_the_report_keeps_layer_order(layout: Layout) -> None:
    """With fewer jobs than layers, the biggest layer (the critical path) starts first."""
    from imagegate.oci.layercheck import NoProgress, verify_source
    from imagegate.oci.transports import open_sources

    # Smallest first in the manifest (and the config's diff_ids with it), so that reading in
    # manifest order would start with the smallest.
    m, config = layout.manifest(), layout.config()
    order = sorted(range(len(m["layers"])), key=lambda i: m["layers"][i]["size"])
    m["layers"] = [m["layers"][i] for i in order]
    config["rootfs"]["diff_ids"] = [config["rootfs"]["diff_ids"][i] for i in order]
    m["config"].update(layout.put_blob(json.dumps(config).encode()))
    layout.set_manifest(m)

    class Started(NoProgress):
        def __init__(self) -> None:
            self.keys: list[int] = []

        def started(self, key: int, label: str, total: int | None) -> None:
            self.keys.append(key)

    seen = Started()
    with open_sources([f"oci:{layout.root}:1"]) as (src,):
        report = verify_source(src, jobs=1, progress=seen)
    assert report.ok
    sizes = [layer["size"] for layer in m["layers"]]
    assert sizes[0] < sizes[-1]  # the test means something only when the sizes differ
    assert seen.keys == sorted(range(len(sizes)), key=lambda i: -sizes[i])
    assert [r.expected_digest for r in report.layers] == [layer["digest"] for layer in m["layers"]]
