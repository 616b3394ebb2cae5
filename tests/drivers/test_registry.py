"""`--driver rootfs` on a registry image with no engine reachable: the bytes are verified while
unpacked, the probes run on them, the attestation says no engine was involved and which manifest
the bytes came from; a tampered mirror is refused before any probe runs, in a FAIL attempt."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.drivers.conftest import push
from tests.helpers import imagegate
from tests.oci.infra import Registry, sh, skopeo, start_registry
from tests.oci.moving_tag_front import moving_tag_front

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent"}


def attempt_dirs(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("sha256-*/*") if p.is_dir())


def outcome(statement: dict) -> tuple[str, dict[str, str]]:  # type: ignore[type-arg]
    p = statement["predicate"]
    return p["verdict"], {s["id"]: s["status"] for s in p["stages"]}


def test_registry_image_accepted_without_an_engine(
    pushed_vllm: str, images: dict[str, str], tmp_path: Path
) -> None:
    own_cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}  # cold: the session's may hold these layers
    official = sh("docker", "image", "inspect", "-f", "{{.Id}}", images["vllm-like"]).strip()
    args = ["-p", "vllm", "--expect-config", official, "--no-sign", "--format", "json"]
    cold = imagegate(
        "run", f"docker://{pushed_vllm}", "--driver", "rootfs", *args, "-o", str(tmp_path / "rootfs"),
        env={**NO_ENGINE, **own_cache},
    )  # fmt: skip
    assert cold.returncode == 0, cold.stderr
    docker = imagegate("run", pushed_vllm, *args, "-o", str(tmp_path / "docker"))
    subprocess.run(["docker", "rmi", pushed_vllm], capture_output=True)  # the tag the pull added
    assert docker.returncode == 0, docker.stderr
    statement, by_engine = cold.json(), docker.json()
    assert outcome(statement) == outcome(by_engine) == (
        "CPU_PASS_GPU_CLI_DEFERRED",
        {"pip_check": "PASS", "find_spec": "PASS", "gpu_cli": "DEFERRED", "cli_cpu": "PASS",
         "av_roundtrip": "PASS", "layers": "PASS"},
    )  # fmt: skip
    env = statement["predicate"]["environment"]
    assert env["driver"] == "rootfs" and env["engine"] is None and env["sandbox"] == "bubblewrap"
    manifest = by_engine["subject"][0]["digest"]["sha256"]  # the registry's, as the engine pulled it
    assert env["image_source"]["manifest_digest"] == f"sha256:{manifest}"
    assert statement["subject"][0]["digest"]["sha256"] == manifest
    assert env["image_source"]["cached"] is False
    # The layers stage is the unpack's own verification, not a second read.
    (attempt,) = attempt_dirs(tmp_path / "rootfs")
    layers = json.loads((attempt / "stages/06-layers/layers.json").read_text())
    assert layers["source_choice"]["kind"] == "driver"
    assert layers["config"]["matches_official"] is True and len(layers["layers"]) == 3
    # Warm: the root comes from the cache (its chainID), the verdict is the same.
    warm = imagegate(
        "run", f"docker://{pushed_vllm}", "--driver", "rootfs", *args, "-o", str(tmp_path / "warm"),
        env={**NO_ENGINE, **own_cache},
    )  # fmt: skip
    assert warm.returncode == 0, warm.stderr
    assert outcome(warm.json()) == outcome(statement)
    assert warm.json()["predicate"]["environment"]["image_source"]["cached"] is True


def test_tampered_mirror_is_refused(
    pushed_vllm: str, images: dict[str, str], root_cache: dict[str, str], tmp_path: Path
) -> None:
    mirror = start_registry(tmp_path / "mirror")
    try:
        ref = f"{mirror.host}/team/vllm:0.11"
        skopeo("copy", "-q", "--src-tls-verify=false", "--dest-tls-verify=false", f"docker://{pushed_vllm}",
               f"docker://{ref}")  # fmt: skip
        manifest = json.loads(skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{ref}"))
        victim = manifest["layers"][1]["digest"]
        data = bytearray(mirror.blob_file(victim).read_bytes())
        data[len(data) // 2] ^= 0x01
        mirror.blob_file(victim).write_bytes(bytes(data))
        official = sh("docker", "image", "inspect", "-f", "{{.Id}}", images["vllm-like"]).strip()
        args = ["--driver", "rootfs", "-p", "vllm", "--expect-config", official, "--no-sign"]
        # Nothing cached: refused while unpacking, before any probe runs; the root is discarded.
        cold = tmp_path / "cold-cache"
        r = imagegate(
            "run", f"docker://{ref}", *args, "-o", str(tmp_path / "out"),
            env={**NO_ENGINE, "XDG_CACHE_HOME": str(cold)},
        )  # fmt: skip
        assert r.returncode == 1, r.stdout + r.stderr
        assert "layer 2" in r.stderr and victim in r.stderr, r.stderr
        # No probe ran, and the refusal is an attempt like any other: FAIL, the layer named.
        (refused,) = attempt_dirs(tmp_path / "out")
        verdict, stages = outcome(json.loads((refused / "statement.json").read_text()))
        assert verdict == "FAIL" and stages["unpack"] == "FAIL" and stages["layers"] == "FAIL"
        assert {stages[s] for s in ("pip_check", "find_spec", "gpu_cli", "cli_cpu")} == {"SKIPPED"}
        assert list((cold / "imagegate/roots/roots").iterdir()) == []  # nothing of it kept
        # The same layers cached from the official copy, every blob of this very manifest (the
        # mirror's manifest is the official one, byte for byte) a verified pair recorded then: the
        # manifest names exactly the bytes verified before, so the root is reused without reading
        # the mirror's storage, and the layers stage says so (a blob that differs from what its
        # manifest names is refused: test_root_cache.py).
        cache = root_cache
        official = imagegate("run", f"docker://{pushed_vllm}", *args, "-o", str(tmp_path / "official"),
                             env={**NO_ENGINE, **cache})  # fmt: skip
        assert official.returncode == 0, official.stderr
        warm = imagegate(
            "run", f"docker://{ref}", *args, "--format", "json", "-o", str(tmp_path / "warm"),
            env={**NO_ENGINE, **cache},
        )  # fmt: skip
    finally:
        mirror.stop()
    assert warm.returncode == 0, warm.stderr
    statement = warm.json()
    source = statement["predicate"]["environment"]["image_source"]
    assert source["cached"] is True and {x["verified"] for x in source["layers"]} == {"known_pair"}
    (layers,) = [s for s in statement["predicate"]["stages"] if s["id"] == "layers"]
    assert layers["status"] == "PASS" and "3 known verified pairs, not read now" in layers["detail"], layers
    (attempt,) = attempt_dirs(tmp_path / "warm")
    evidence = json.loads((attempt / "stages/06-layers/layers.json").read_text())
    assert (
        evidence["source_choice"]["kind"] == "driver"
        and "pair_recorded_at" in evidence["source_choice"]["why"]
    )
    assert all(x["pair_recorded_at"] for x in evidence["layers"])


def _reopened(reference: str, cache: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, str]:
    """The image the rootfs driver resolves `reference` to, the report of verifying the source
    it reopens for outside stages, and that source's description."""
    from imagegate.drivers.rootfs import RootfsDriver, materializer
    from imagegate.oci.layercheck import verify_source

    monkeypatch.setenv("XDG_CACHE_HOME", cache["XDG_CACHE_HOME"])
    driver = RootfsDriver(materializer(expect_config=None, platform=None, insecure=False))
    image = driver.resolve(reference)
    source = driver.image_source(image, None)
    assert source is not None
    try:
        report = verify_source(source)
    finally:
        source.close()
    assert report.ok and report.config.actual_digest == image.config_digest
    assert report.manifest_digest == image.manifest_digest
    return image, report, source.description


def test_the_driver_reopens_its_source_for_outside_stages(
    pushed_vllm: str, root_cache: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cached root was unpacked from an earlier source: outside stages read the one given now.
    _reopened(f"docker://{pushed_vllm}", root_cache, monkeypatch)


def test_the_driver_reopens_the_digest_its_tag_named(
    pushed_vllm: str,
    images: dict[str, str],
    registry: Registry,
    root_cache: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tag names the image unpacked at its one read and another image after (a front before
    the real registry): the outside stages reopen the digest read, never the tag again."""
    push(images["nopython"], f"{registry.host}/team/vllm:other")
    with moving_tag_front(registry.host, "team/vllm", "moving", "0.11", "other") as front:
        image, _, reopened = _reopened(
            f"docker://{front.ref('team/vllm', 'moving')}", root_cache, monkeypatch
        )
        reads = front.reads
    assert reads == 1 and reopened.endswith(f":moving@{image.manifest_digest}"), (reads, reopened)


def test_an_oci_layout_and_a_docker_archive_run_without_an_engine(
    pushed_vllm: str, root_cache: dict[str, str], tmp_path: Path
) -> None:
    layout = tmp_path / "layout"
    skopeo("copy", "-q", "--src-tls-verify=false", f"docker://{pushed_vllm}", f"oci:{layout}:0.11")
    archive = tmp_path / "vllm.tar"
    skopeo(
        "copy",
        "-q",
        "--src-tls-verify=false",
        f"docker://{pushed_vllm}",
        f"docker-archive:{archive}:team/vllm:0.11",
    )
    for n, source in enumerate((f"oci:{layout}:0.11", f"docker-archive:{archive}")):
        r = imagegate(
            "run", source, "--driver", "rootfs", "-p", "python", "-m", "av", "--no-sign", "--format", "json",
            "-o", str(tmp_path / f"out{n}"), env={**NO_ENGINE, **root_cache},
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        env = r.json()["predicate"]["environment"]
        assert r.json()["predicate"]["verdict"] == "PASS"
        assert env["engine"] is None and env["image_source"]["source"] == source
