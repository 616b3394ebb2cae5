"""`run --driver NAME`: which driver runs the bundle, made from the command line's options.

- `docker`: a Docker Engine through its API (DOCKER_HOST honoured); the default.
- `podman`: Podman's Docker-compatible API: DOCKER_HOST when set, else CONTAINER_HOST (Podman's
  own variable), else Podman's default socket (rootful or rootless); the engine must be Podman.
- `rootfs`: no engine: IMAGE from any transport, its layers verified while unpacked, the probes
  run in that root under bubblewrap (drivers/rootfs.py).
- `here`: this environment (`--here` is the same).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from imagegate.domain.gpus import GpuRequest
from imagegate.drivers.interface import Driver
from imagegate.errors import EngineError, UsageError


class DriverName(str, enum.Enum):
    docker = "docker"
    podman = "podman"
    rootfs = "rootfs"
    here = "here"


ENGINES = (DriverName.docker, DriverName.podman)
ROOTFS_HINT = (
    "or run without an engine: --driver rootfs reads IMAGE from its registry (or docker-archive:, "
    "oci:), verifies every layer while unpacking it, and runs the probes under bubblewrap"
)


def driver_name(driver: str | None, here: bool) -> DriverName | None:
    """The driver the options ask for; None: the default (an engine, docker). `--here` is
    `--driver here`; given together with another driver it is a contradiction."""
    name = None
    if driver is not None:
        try:
            name = DriverName(driver.strip().lower())
        except ValueError as e:
            raise UsageError(
                f"--driver {driver!r}: unknown driver",
                hint=f"one of {', '.join(d.value for d in DriverName)}",
            ) from e
    if here:
        if name not in (None, DriverName.here):
            raise UsageError(f"--here and --driver {driver} contradict each other", hint="give one of them")
        return DriverName.here
    return name


def needs_engine(name: DriverName | None) -> bool:
    return name is None or name in ENGINES


@dataclass
class DriverOptions:
    """The command line's options that drivers take."""

    memory: str = "8g"
    pull: str = "missing"
    notify: Callable[[str], None] = lambda _m: None
    gpus: GpuRequest | None = None
    python: str | None = None
    expect_config: str | None = None
    platform: str | None = None
    insecure: bool = False
    signing: bool = False  # the attempt will be signed (--here: the key must be hidden from the probes)
    signing_key: Path | None = None  # the key file that signs, masked from the probes of --here
    sign_unisolated: bool = False
    cache_dir: str | None = None  # the rootfs driver's root cache (None: the default folder)
    model: Path | None = None  # --model: bound read-only at modelpath.IN_SANDBOX (--here: used in place)


def make_driver(name: DriverName | None, opts: DriverOptions) -> Driver:
    if name is DriverName.here:
        from imagegate.drivers.local import LocalDriver, key_isolation

        isolation = key_isolation(
            signing=opts.signing,
            key=opts.signing_key,
            sign_unisolated=opts.sign_unisolated,
            notify=opts.notify,
        )
        return LocalDriver(opts.python, gpus=opts.gpus, isolation=isolation, model=opts.model)
    if opts.python:
        raise UsageError("--python goes with --here", hint="in a container the image's own python is used")
    if opts.sign_unisolated:
        raise UsageError(
            "--sign-unisolated goes with --here",
            hint="a container or the rootfs sandbox never holds the key: drop it",
        )
    if name is DriverName.rootfs:
        return _rootfs(opts)
    return _engine(name, opts)


def podman_host(env: Mapping[str, str] = os.environ) -> str:
    """Where Podman's API listens: DOCKER_HOST, CONTAINER_HOST, then Podman's own defaults."""
    if env.get("DOCKER_HOST"):
        return env["DOCKER_HOST"]
    if env.get("CONTAINER_HOST", "").startswith("unix://"):
        return env["CONTAINER_HOST"]  # ssh:// is Podman's own remote protocol, not its Docker API
    if os.geteuid() == 0:
        return "unix:///run/podman/podman.sock"
    runtime = env.get("XDG_RUNTIME_DIR") or f"/run/user/{os.geteuid()}"
    return f"unix://{runtime}/podman/podman.sock"


def _engine(name: DriverName | None, opts: DriverOptions) -> Driver:
    from imagegate.drivers.docker import DockerDriver

    host = podman_host() if name is DriverName.podman else None
    try:
        driver = DockerDriver(
            memory=opts.memory,
            pull=opts.pull,
            notify=opts.notify,
            gpus=opts.gpus,
            host=host,
            model=opts.model,
            insecure=opts.insecure,
        )
    except EngineError as e:
        if name is None:  # no driver asked for: say that one needs no engine
            raise EngineError(str(e), hint=f"{e.hint}; {ROOTFS_HINT}" if e.hint else ROOTFS_HINT) from e
        if name is DriverName.podman:
            raise EngineError(
                str(e), hint="start it: podman system service --time=0 unix:///run/podman/podman.sock"
            ) from e
        raise
    engine = driver.environment()["engine"]
    if name is DriverName.podman and engine != "podman":
        raise UsageError(
            f"--driver podman: the engine at {driver.environment()['docker_host']} is {engine}, not Podman",
            hint="point DOCKER_HOST (or CONTAINER_HOST) at Podman's socket, or use --driver docker",
        )
    for left in driver.leftovers():
        opts.notify(f"container {left} was left by an imagegate run that was killed: docker rm -f {left}")
    return driver


def _rootfs(opts: DriverOptions) -> Driver:
    if opts.pull != "missing":
        raise UsageError(
            f"--pull {opts.pull}: the rootfs driver has no engine to pull through",
            hint="it always reads IMAGE from its transport; drop --pull",
        )
    from imagegate.drivers import cdi
    from imagegate.drivers.rootfs import RootfsDriver, materializer

    # Read before any byte of the image: a GPU the host lacks, or a stale spec, is said now.
    gpus = cdi.for_request(opts.gpus) if opts.gpus is not None else None
    return RootfsDriver(
        materializer(
            expect_config=opts.expect_config,
            platform=opts.platform,
            insecure=opts.insecure,
            cache_dir=opts.cache_dir,
        ),
        memory=opts.memory,
        notify=opts.notify,
        platform=opts.platform,
        insecure=opts.insecure,
        gpus=gpus,
        model=opts.model,
    )
