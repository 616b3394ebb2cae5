"""Outside stages: checks the runner does itself, beside the image (layer identity,
vulnerability audit), after the in-image stages reported. One function per probe, looked up by
name so that each lives in the package it belongs to."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from imagegate.model import ImageFacts, StageResult, Status


@dataclass
class OutsideContext:
    image: ImageFacts
    driver: str  # "docker", "local", "kube"
    stage_dir: Path  # evidence files of this stage go here (created by the runner)
    # Where to read the image from when not the driver's own engine: a transport string
    # (docker://REF, docker-daemon:REF, docker-archive:PATH, oci:DIR[:TAG]); --source.
    source: str | None = None
    # --expect-config on the command line; overrides the pipeline's expect_config_digest.
    expect_config_digest: str | None = None
    # The Docker SDK client of the docker driver (None for other drivers): docker-daemon reads
    # go through the very engine the probes ran in.
    docker_client: Any | None = None
    inside_results: dict[str, StageResult] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # e.g. advisory_db
    # A verification the driver already made of the very bytes the probes ran on (the rootfs
    # driver verifies every layer while unpacking it): an oci.verify.VerifyReport, or None.
    verified: Any | None = None
    # Seconds the stage may take (its `timeout`), where the runner enforces one; None: no limit.
    timeout_s: float | None = None


@dataclass
class Outcome:
    status: Status
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


OutsideProbe = Callable[[OutsideContext, BaseModel], Outcome]

# probe name -> "module:function"
OUTSIDE_PROBES: dict[str, str] = {
    "layers": "imagegate.oci.stage:run_layers_stage",
    "vulns": "imagegate.vulns.stage:run_vulns_stage",
}


def load_outside_probe(name: str) -> OutsideProbe:
    module, _, func = OUTSIDE_PROBES[name].partition(":")
    fn: OutsideProbe = getattr(importlib.import_module(module), func)
    return fn
