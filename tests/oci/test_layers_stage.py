"""The `layers` pipeline stage: the image the probes ran, streamed from the same engine."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagegate.domain.results import ImageFacts, Status
from imagegate.drivers.docker import DockerDriver
from imagegate.oci import engineapi
from imagegate.oci.sources.daemon import DaemonArchive
from imagegate.pipeline.params import LayersParams
from imagegate.stages import ImageSourceOpener, OutsideContext
from imagegate.stages.layers import run_layers_stage
from tests.helpers import DOCKER_SOCK
from tests.oci.conftest import Pushed
from tests.oci.infra import Registry, free_port, sh

pytestmark = pytest.mark.engine


def _engine(image_id: str | None, base_url: str = DOCKER_SOCK) -> ImageSourceOpener:
    """What the docker driver offers the layers stage: its engine's export of the image it ran."""
    client = engineapi.connect(base_url, timeout=60)
    assert image_id is not None
    return lambda timeout: DaemonArchive(image_id, client, timeout=timeout)


def _ctx(tmp_path: Path, image: str, **kw: object) -> OutsideContext:
    image_id = sh("docker", "image", "inspect", "-f", "{{.Id}}", image).strip()
    facts = ImageFacts(reference=image, config_digest=image_id)
    return OutsideContext(
        image=facts, driver="docker", stage_dir=tmp_path, image_source=_engine(image_id), **kw
    )  # type: ignore[arg-type]


def test_verifies_the_image_that_ran(oci_image: str, tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, oci_image)
    out = run_layers_stage(ctx, LayersParams())
    assert out.status is Status.PASS, out.detail
    assert f"config={ctx.image.config_digest}" in out.detail and "diffids=3/3" in out.detail
    evidence = json.loads((tmp_path / "layers.json").read_text())
    assert evidence["probed_config_digest"] == ctx.image.config_digest
    assert [x["status"] for x in evidence["layers"]] == ["OK"] * 3


def test_expected_digest_from_cli_overrides_pipeline(oci_image: str, tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, oci_image, expect_config_digest="sha256:" + "1" * 64)
    out = run_layers_stage(ctx, LayersParams(expect_config_digest=ctx.image.config_digest))
    assert out.status is Status.FAIL and "is not the expected sha256:1111" in out.detail
    ctx = _ctx(tmp_path, oci_image)
    assert (
        run_layers_stage(ctx, LayersParams(expect_config_digest=ctx.image.config_digest)).status
        is Status.PASS
    )


def test_source_is_read_instead(oci_image: str, pushed: Pushed, zstd_mirror: str, tmp_path: Path) -> None:
    out = run_layers_stage(_ctx(tmp_path, oci_image, source=f"docker://{pushed.ref}"), LayersParams())
    assert out.status is Status.PASS, out.detail
    # The zstd copy has another config: it is not the image the probes ran.
    out = run_layers_stage(_ctx(tmp_path, oci_image, source=zstd_mirror), LayersParams())
    assert out.status is Status.FAIL and "the probed image is sha256:" in out.detail


def test_unreadable_source_is_error(oci_image: str, tmp_path: Path) -> None:
    out = run_layers_stage(_ctx(tmp_path, oci_image, source=f"127.0.0.1:{free_port()}/a:1"), LayersParams())
    assert out.status is Status.ERROR and "could not read the image" in out.detail
    assert json.loads((tmp_path / "layers.json").read_text())["error"]


def test_no_engine_and_no_source_is_error(tmp_path: Path) -> None:
    ctx = OutsideContext(image=ImageFacts("app:1", None), driver="kube", stage_dir=tmp_path)
    out = run_layers_stage(ctx, LayersParams())
    assert out.status is Status.ERROR and "--source" in out.detail


# -- which source: the registry the image was pulled from, else the engine ---------------------


@pytest.fixture
def pulled(oci_image: str, official: Registry, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """An image of its own (the test image plus a label unique to this test) pushed to the
    registry, removed from the engine and pulled back: the engine then names the registry
    manifest in RepoDigests, as for any pulled image. Yields (registry ref, image ID)."""
    tag = f"{official.host}/team/pulled:{tmp_path.name[-20:].strip('_').lower() or 'x'}"
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f'FROM {oci_image}\nLABEL org.example.unique="{tmp_path}"\n')
    sh(
        "docker",
        "build",
        "-q",
        "--network",
        "none",
        "-t",
        tag,
        str(ctx),
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )
    sh("docker", "push", "-q", tag)
    sh("docker", "rmi", tag)
    sh("docker", "pull", "-q", tag)
    try:
        yield tag, sh("docker", "image", "inspect", "-f", "{{.Id}}", tag).strip()
    finally:
        subprocess.run(["docker", "rmi", tag], capture_output=True)


def _facts(ref: str) -> ImageFacts:
    """What the docker driver learns about the image (its RepoDigests among them)."""
    return DockerDriver().resolve(ref)


def test_pulled_image_is_verified_from_its_registry(pulled: tuple[str, str], tmp_path: Path) -> None:
    ref, image_id = pulled
    facts = _facts(ref)
    assert facts.repo_digests and facts.config_digest == image_id
    ctx = OutsideContext(
        image=facts,
        driver="docker",
        stage_dir=tmp_path,
        image_source=_engine(facts.config_digest),
    )
    out = run_layers_stage(ctx, LayersParams())
    assert out.status is Status.PASS, out.detail
    assert "from registry" in out.detail and out.data["source"] == "registry"
    evidence = json.loads((tmp_path / "layers.json").read_text())
    choice = evidence["source_choice"]
    assert choice["kind"] == "registry" and choice["source"] == f"docker://{facts.repo_digests[0]}"
    assert "RepoDigests" in choice["why"] and choice["notes"] == []
    assert evidence["manifest_digest"] == facts.manifest_digest  # the registry's own manifest


def test_a_blob_verified_before_is_not_read_from_the_registry_again(
    pulled: tuple[str, str], tmp_path: Path
) -> None:
    """The root cache's verified pairs stand in for the registry's blobs the stage verified before
    (the evidence marks each one); --no-cache reads them all."""
    facts = _facts(pulled[0])

    def stage(name: str, **kw: object) -> tuple[str, list[dict[str, object]]]:
        folder = tmp_path / name
        folder.mkdir()
        ctx = OutsideContext(image=facts, driver="docker", stage_dir=folder, image_source=_engine(facts.config_digest),
                             cache_dir=str(tmp_path / "cache"), **kw)  # type: ignore[arg-type]  # fmt: skip
        out = run_layers_stage(ctx, LayersParams())
        assert out.status is Status.PASS and "from registry" in out.detail, out.detail
        return out.detail, json.loads((folder / "layers.json").read_text())["layers"]

    detail, layers = stage("first")
    assert "known verified pairs" not in detail and not any(x["pair_recorded_at"] for x in layers)
    detail, layers = stage("again")
    assert f"{len(layers)} known verified pairs, not read now" in detail
    assert all(x["pair_recorded_at"] and x["status"] == "OK" for x in layers)
    detail, layers = stage("no-cache", no_cache=True)
    assert "known verified pairs" not in detail and not any(x["pair_recorded_at"] for x in layers)


def test_a_tag_that_moved_since_the_run_is_not_read_again(
    pulled: tuple[str, str], oci_image: str, tmp_path: Path
) -> None:
    """The driver knows the manifest that ran (its digest, from the registry's copy): the stage
    reads that, by digest, even where the image was named by a tag that names another image now."""
    ref, image_id = pulled
    facts = _facts(ref)
    assert facts.manifest_digest is not None and facts.repository is not None
    sh("docker", "tag", oci_image, ref)  # the tag now names another image (another config)
    sh("docker", "push", "-q", ref)
    ctx = OutsideContext(
        image=dataclasses.replace(facts, reference=f"docker://{ref}"),
        driver="docker",
        stage_dir=tmp_path,
        image_source=_engine(facts.config_digest),
    )
    out = run_layers_stage(ctx, LayersParams())
    assert out.status is Status.PASS and f"config={image_id}" in out.detail, out.detail
    choice = json.loads((tmp_path / "layers.json").read_text())["source_choice"]
    assert choice["source"] == f"docker://{facts.repository}@{facts.manifest_digest}", choice
    assert choice["notes"] == []  # the moved tag was never asked


def test_unreachable_registry_falls_back_to_the_engine_with_a_note(
    pulled: tuple[str, str], official: Registry, tmp_path: Path
) -> None:
    ref, image_id = pulled
    facts = _facts(ref)
    gone = facts.repo_digests[0].replace(official.host, f"127.0.0.1:{free_port()}")
    # The registry that knew the image (its repo digest and the manifest that ran) is gone.
    facts = dataclasses.replace(facts, repo_digests=(gone,), repository=gone.partition("@")[0])
    ctx = OutsideContext(
        image=facts,
        driver="docker",
        stage_dir=tmp_path,
        image_source=_engine(facts.config_digest),
    )
    t0 = time.monotonic()
    out = run_layers_stage(ctx, LayersParams())
    assert out.status is Status.PASS, out.detail
    assert time.monotonic() - t0 < 30  # the unreachable registry is not retried for long
    assert "from engine (registry unreadable)" in out.detail
    choice = json.loads((tmp_path / "layers.json").read_text())["source_choice"]
    assert choice["kind"] == "engine" and choice["source"] == f"docker-daemon:{image_id}"
    assert len(choice["notes"]) == 1 and choice["notes"][0].startswith(
        f"registry copy docker://{gone} not used"
    )


def test_local_build_is_verified_from_the_engine(oci_image: str, tmp_path: Path) -> None:
    out = run_layers_stage(_ctx(tmp_path, oci_image), LayersParams())
    assert out.status is Status.PASS and "from engine" in out.detail
    choice = json.loads((tmp_path / "layers.json").read_text())["source_choice"]
    assert choice["kind"] == "engine" and "no registry digest" in choice["why"]


def test_kube_pod_image_is_verified_from_its_registry(pushed: Pushed, tmp_path: Path) -> None:
    """No engine at hand (a Pod's image), but the Pod status names the registry digest."""
    digest = sh(
        "skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}", f"docker://{pushed.ref}"
    ).strip()
    repo = pushed.ref.rsplit(":", 1)[0]
    facts = ImageFacts(pushed.ref, pushed.config_digest, digest, (f"{repo}@{digest}",))
    out = run_layers_stage(OutsideContext(image=facts, driver="kube", stage_dir=tmp_path), LayersParams())
    assert out.status is Status.PASS and "from registry" in out.detail, out.detail


def test_engine_export_stops_at_the_stage_timeout(oci_image: str, tmp_path: Path) -> None:
    """The engine export has no read timeout, but the stage's own deadline holds."""
    from tests.oci.infra import EngineProxy

    sock = Path(tempfile.mkdtemp(prefix="ig-proxy-"))
    proxy = EngineProxy(sock / "e.sock", DOCKER_SOCK, delay=300)  # ended by its close
    try:
        ctx = _ctx(tmp_path, oci_image, timeout_s=2.0)
        ctx.image_source = _engine(ctx.image.config_digest, proxy.url)
        out = run_layers_stage(ctx, LayersParams())
        # over before the engine's first byte: the stage's deadline ended it, not the engine
        # (an order of events, not a wall time that a busy machine stretches)
        assert proxy.exports == 1 and proxy.export_bytes_sent == 0
    finally:
        proxy.close()
        shutil.rmtree(sock, ignore_errors=True)
    assert out.status is Status.ERROR
    assert "gave up after 2 s: the engine prepared no byte of the export" in out.detail


def test_the_drivers_own_source_is_read_first_whatever_the_driver(pushed: Pushed, tmp_path: Path) -> None:
    """A driver that read the image from a source of its own (the rootfs driver: an OCI layout
    here) hands it over through image_source(); the stage reads it before any registry copy,
    and knows the driver by no name."""
    from imagegate.oci.transports import open_source
    from tests.oci.infra import skopeo

    layout = tmp_path / "layout"
    skopeo("copy", "-q", "--src-tls-verify=false", f"docker://{pushed.ref}", f"oci:{layout}:1")
    unreachable = f"127.0.0.1:{free_port()}/team/app@sha256:{'0' * 64}"
    facts = ImageFacts(f"oci:{layout}:1", pushed.config_digest, None, (unreachable,))
    stage_dir = tmp_path / "stage"
    stage_dir.mkdir()
    ctx = OutsideContext(
        image=facts,
        driver="a-new-driver",
        stage_dir=stage_dir,
        image_source=lambda _timeout: open_source(f"oci:{layout}:1"),
    )
    out = run_layers_stage(ctx, LayersParams())
    assert out.status is Status.PASS, out.detail
    choice = json.loads((stage_dir / "layers.json").read_text())["source_choice"]
    assert choice["kind"] == "source" and choice["source"] == f"oci:{layout}:1"
    assert choice["notes"] == []  # the unreachable registry copy was never tried


def test_no_image_at_all_is_skipped_whatever_the_driver(tmp_path: Path) -> None:
    """A run that checked an environment, not an image (its driver has none: Driver.has_image),
    has no layers to verify: SKIPPED, with the way to give it an image, for any driver."""
    ctx = OutsideContext(
        image=ImageFacts("python:3.12", None), driver="a-new-driver", stage_dir=tmp_path, has_image=False
    )
    out = run_layers_stage(ctx, LayersParams())
    assert out.status is Status.SKIPPED and "--source docker://REF" in out.detail, out.detail
