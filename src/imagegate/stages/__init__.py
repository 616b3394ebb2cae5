"""Outside stages: checks the runner does itself, beside the image (layer identity,
vulnerability audit), with the libraries in `oci` and `vulns`. Each probe's function is named
in the probe registry (pipeline/probes.py) and imported when its stage runs."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from imagegate._support.jsontypes import JsonObject
from imagegate.domain.results import ImageFacts, StageResult, Status
from imagegate.pipeline.probes import PROBES

if TYPE_CHECKING:  # the verification loads with the stage that verifies, not with every run
    from imagegate.oci.layercheck import Progress, VerifyReport
    from imagegate.oci.sources.interface import Source

# How to read the image the probes ran, from where they ran it (the docker driver: its engine,
# by image ID), within `timeout` seconds (None: no limit); None where a driver has no such way.
ImageSourceOpener = Callable[[float | None], "Source | None"]


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
    image_source: ImageSourceOpener | None = None
    inside_results: dict[str, StageResult] = field(default_factory=dict)
    advisory_db: Path | None = None  # --advisory-db: overrides the stage's own
    # The root cache whose verified pairs (blob digest -> size, diffID) stand in for reading a
    # registry's blob again (--cache-dir; None: the default folder); --no-cache: none.
    cache_dir: str | None = None
    no_cache: bool = False
    progress: Progress | None = None  # layer progress on a terminal, or wait lines in a CI log
    # A verification the driver already made of the very bytes the probes ran on (the rootfs
    # driver verifies every layer while unpacking it), or None.
    verified: VerifyReport | None = None
    # False where the run checked an environment, not an image (Driver.has_image): no layers.
    has_image: bool = True
    # Seconds the stage may take (its `timeout`), where the runner enforces one; None: no limit.
    timeout_s: float | None = None


@dataclass
class Outcome:
    status: Status
    detail: str
    data: JsonObject = field(default_factory=dict)


OutsideProbe = Callable[[OutsideContext, BaseModel], Outcome]


def load_outside_probe(name: str) -> OutsideProbe:
    target = PROBES[name].run
    if target is None:
        raise ValueError(f"probe {name!r} runs inside the image")
    module, _, func = target.partition(":")
    fn: OutsideProbe = getattr(importlib.import_module(module), func)
    return fn
