"""`--gpus all|N|ID[,ID]|device=ID`: which GPUs a run gets. Zero is the default everywhere: without the
option, GPUs are hidden from the probes."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from imagegate.errors import UsageError

# What hides GPUs from CUDA and from the NVIDIA container runtime.
HIDING_ENV = {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}


@dataclass(frozen=True)
class GpuRequest:
    """`count` -1: all; else `count` GPUs, or the GPUs named in `ids` (indexes or UUIDs)."""

    spec: str
    count: int = -1
    ids: tuple[str, ...] = ()

    @property
    def cuda_visible_devices(self) -> str | None:
        """What CUDA_VISIBLE_DEVICES says for this request on a host (None: leave it alone)."""
        if self.ids:
            return ",".join(self.ids)
        if self.count > 0:
            return ",".join(str(i) for i in range(self.count))
        return None


def parse(spec: str | None) -> GpuRequest | None:
    if spec is None:
        return None
    text = spec.strip()
    if text.startswith("device="):  # docker's `--gpus device=1`: one index (or several) by name
        ids = tuple(x.strip() for x in text.removeprefix("device=").split(","))
        if ids and all(re.fullmatch(r"\d+|(GPU|MIG)-[0-9A-Za-z-]+", x) for x in ids):
            return GpuRequest(text, ids=ids)
    if text == "all":
        return GpuRequest("all")
    if text.isdigit():
        n = int(text)
        if n < 1:
            raise UsageError(
                f"--gpus {spec}: give 1 or more GPUs", hint="leave --gpus out for a run without GPUs"
            )
        return GpuRequest(text, count=n)
    ids = tuple(x.strip() for x in text.split(","))
    if len(ids) >= 1 and all(re.fullmatch(r"\d+|(GPU|MIG)-[0-9A-Za-z-]+", x) for x in ids) and "," in text:
        return GpuRequest(text, ids=ids)
    if re.fullmatch(r"(GPU|MIG)-[0-9A-Za-z-]+", text):
        return GpuRequest(text, ids=(text,))
    raise UsageError(
        f"--gpus {spec!r}: not all, a count, or a list of GPU ids",
        hint="e.g. --gpus all, --gpus 2, --gpus 0,1, --gpus device=1 or --gpus GPU-<uuid>",
    )


@dataclass(frozen=True)
class Grant:
    """GPUs as the runner gave them to one container or process, and what it saw of them itself:
    the fact a GPU level rests on, never the image's own report (which a lying interpreter
    writes as it likes). `via`: how they were given (device_requests, cdi, host_devices,
    pod_limits); `seen`: what the runner saw (the engine's record of the container's device
    requests, the device nodes bound, the Pod's limits); nothing seen, nothing granted."""

    via: str
    seen: tuple[str, ...]

    @property
    def granted(self) -> bool:
        return bool(self.seen)

    def to_json(self) -> dict[str, object]:
        return {"via": self.via, "seen": list(self.seen), "granted": self.granted}


GPU_NODE = re.compile(r"/dev/nvidia\d+")  # one GPU's device node (not the control nodes)


def nodes_grant(via: str, nodes: Iterable[tuple[str, str]]) -> Grant:
    """GPUs given as device nodes, (host path, path where the run sees it): those seen where a GPU's
    node goes, whose host path is a character device now, are what the runner saw."""
    seen = []
    for host, path in nodes:
        try:
            char = stat.S_ISCHR(os.stat(host).st_mode)
        except OSError:
            char = False
        if char and GPU_NODE.fullmatch(path):
            seen.append(path)
    return Grant(via, tuple(sorted(seen)))
