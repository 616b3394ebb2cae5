"""The `layers` pipeline stage: the image the probes ran, streamed from the same engine."""

from __future__ import annotations

import json
from pathlib import Path

import docker
import pytest

from imagegate.model import ImageFacts, Status
from imagegate.oci.stage import run_layers_stage
from imagegate.outside import OutsideContext
from imagegate.pipeline.params import LayersParams
from tests.helpers import DOCKER_SOCK
from tests.oci.conftest import Pushed
from tests.oci.infra import free_port, sh

pytestmark = pytest.mark.engine


def _ctx(tmp_path: Path, image: str, **kw: object) -> OutsideContext:
    image_id = sh("docker", "image", "inspect", "-f", "{{.Id}}", image).strip()
    client = docker.DockerClient(base_url=DOCKER_SOCK)
    facts = ImageFacts(reference=image, config_digest=image_id)
    return OutsideContext(image=facts, driver="docker", stage_dir=tmp_path, docker_client=client, **kw)  # type: ignore[arg-type]


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
