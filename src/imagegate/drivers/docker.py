"""The docker driver: Docker Engine or Podman through the Docker API (the SDK honours
DOCKER_HOST). The bundle is streamed through the container's stdin into its tmpfs /tmp: this
works with a read-only root, remote engines and Podman alike (put_archive into a read-only root
is refused, and bind mounts need the file on the engine's host).

Sandbox: no network, all capabilities dropped, no new privileges, read-only root, pids and
memory limits, GPUs hidden; the container is removed on every path."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from imagegate._support import interrupts
from imagegate._support.jsontypes import JsonMapping, JsonObject, obj
from imagegate.domain import servemodel as modelpath
from imagegate.domain.digest import is_digest
from imagegate.domain.gpus import HIDING_ENV, GpuRequest, Grant
from imagegate.domain.results import ImageFacts, Status
from imagegate.drivers.interface import (
    STDERR_CAP,
    STDOUT_CAP,
    BundleRequest,
    BundleRun,
    CappedBuffer,
    Checked,
    DriverBase,
    OnOutput,
    Refusal,
    first_usable,
    verification_facts,
)
from imagegate.drivers.loader import HIDDEN_GPU_ENV, LOADER, LOADER_FLAGS, TOO_OLD_EXIT, loader_payload
from imagegate.errors import EngineError, ImagegateError, UsageError
from imagegate.oci import engineapi
from imagegate.oci.manifest import Platform
from imagegate.oci.ran import RanManifest, ran_manifest
from imagegate.oci.reference import ImageName, parse_image_name

if TYPE_CHECKING:  # loaded when an image is verified or read from a registry, not to run one
    # The Docker SDK: imported when a container runs, an image is pulled or exported
    # (oci/engineapi.py reads the engine's JSON answers without it).
    import docker
    import docker.errors
    import docker.types

    from imagegate.oci.layercheck import VerifyReport
    from imagegate.oci.sources.interface import Source

LABEL = "io.imagegate.run"
# Who made a container: a container is a leftover only when all of these name this machine's
# boot and PID namespace and its runner's process (PID and start time) is gone. CI jobs in
# containers share a hostname and reuse PIDs: the host and PID alone would call another job's
# live container a leftover.
PID_LABEL = "io.imagegate.pid"
START_LABEL = "io.imagegate.pid-start"  # /proc/PID/stat field 22: a reused PID starts later
PIDNS_LABEL = "io.imagegate.pidns"  # the inode of /proc/self/ns/pid: which PID numbering
BOOT_LABEL = "io.imagegate.boot"  # /proc/sys/kernel/random/boot_id: which boot of which kernel
HOST_LABEL = "io.imagegate.host"
log = logging.getLogger(__name__)

PULL_POLICIES = ("missing", "never", "always")


def device_requests(gpus: GpuRequest | None) -> list[docker.types.DeviceRequest] | None:
    """GPUs through the engine's device requests, as `docker run --gpus` makes them: the ids
    named, else a count (-1: all); none by default."""
    if gpus is None:
        return None
    import docker.types

    if gpus.ids:
        return [docker.types.DeviceRequest(device_ids=list(gpus.ids), capabilities=[["gpu"]])]
    return [docker.types.DeviceRequest(count=gpus.count, capabilities=[["gpu"]])]


def engine_grant(host_config: JsonMapping) -> Grant:
    """What a container's HostConfig (the engine's inspect) says it was given of GPUs: device
    requests with the gpu capability (`--gpus`), and GPU devices by CDI name or /dev path."""
    seen: list[str] = []
    for req in _iterated(host_config.get("DeviceRequests") or []):
        caps = obj(req).get("Capabilities")
        if isinstance(caps, list) and any(isinstance(c, list) and "gpu" in c for c in caps):
            ids = obj(req).get("DeviceIDs") or []
            seen.append(
                f"ids={','.join(map(str, _iterated(ids)))}" if ids else f"count={obj(req).get('Count')}"
            )
    for dev in _iterated(host_config.get("Devices") or []):
        path = str(obj(dev).get("PathOnHost") or "")
        if path.startswith("nvidia.com/gpu=") or re.fullmatch(r"/dev/nvidia\d+", path):
            seen.append(path)
    return Grant("device_requests", tuple(seen))


def _iterated(value: object) -> Iterable[object]:
    """`value` as a for loop takes it: a JSON number raises the TypeError iterating it always did."""
    if isinstance(value, Iterable):
        return value
    raise TypeError(f"{type(value).__name__!r} object is not iterable")


class _Closable(Protocol):
    def close(self) -> None: ...


def _no_gpu_runtime(err: docker.errors.APIError) -> bool:
    """The engine's refusal of a device request it cannot serve (no NVIDIA runtime or CDI spec)."""
    text = str(err.explanation or err).lower()
    return "could not select device driver" in text or ("gpu" in text and ("cdi" in text or "device" in text))


def _not_found(err: Exception) -> bool:
    text = str(err).lower()
    return "not found" in text or "no such file" in text


# The engine's words when a pull stopped at bytes that are not the declared ones (Docker:
# "filesystem layer verification failed for digest"; Podman: "digest ... does not match",
# "Digest did not match"): then the registry copy is worth verifying here.
_BYTES_REFUSED = re.compile(r"verif|digest|checksum|mismatch|corrupt|does not match", re.IGNORECASE)


class PullFailed(UsageError):
    """The engine could not pull an image: a name no registry has, or a registry out of reach."""

    def __init__(self, reference: str, detail: str, *, hint: str) -> None:
        super().__init__(f"image {reference}: pull failed: {detail}", hint=hint)
        self.detail = detail


class DockerDriver(DriverBase):
    name = "docker"
    isolated_runs = True  # each run_bundle is a container of its own
    has_image = True

    def __init__(
        self,
        *,
        memory: str = "8g",
        pids: int = 4096,
        tmpfs_size: str = "1g",
        pull: str = "missing",
        notify: Callable[[str], None] = lambda _m: None,
        gpus: GpuRequest | None = None,
        host: str | None = None,
        model: Path | None = None,
        insecure: bool = False,
    ) -> None:
        self.gpus = gpus
        self.insecure = insecure  # reading the registry's copy of what the engine pulled
        self.model = model  # bound read-only at modelpath.IN_SANDBOX
        # `host`: an engine address other than DOCKER_HOST's (--driver podman's default socket).
        self.host = host or os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        # A bounded /version answers for the engine (the SDK's ping and "auto" read whole bodies).
        self.engine = engineapi.connect(host, timeout=120)
        if pull not in PULL_POLICIES:
            raise UsageError(f"--pull {pull!r}: unknown policy", hint=f"one of {', '.join(PULL_POLICIES)}")
        self.pull = pull
        self.notify = notify
        self.memory = memory
        self.pids = pids
        self.tmpfs_size = tmpfs_size
        self._env: JsonObject | None = None
        self.live: set[str] = set()  # containers created and not (yet) confirmed removed
        # Images the engine would not pull and imagegate's own verification refused.
        self.refused: dict[ImageFacts, tuple[Refusal, VerifyReport]] = {}

    @property
    def client(self) -> docker.DockerClient:
        """The Docker SDK's client: made when a container runs, an image is pulled or exported."""
        return self.engine.sdk

    def environment(self) -> JsonObject:
        if self._env is None:
            v = engineapi.version(self.engine)
            names = [c.get("Name", "") for c in v.get("Components") or []]
            engine = "podman" if any("podman" in n.lower() for n in names) else "docker"
            self._env = {
                "driver": self.name,
                "engine": engine,
                "engine_version": v.get("Version"),
                "api_version": v.get("ApiVersion"),
                "os": v.get("Os"),
                "arch": v.get("Arch"),
                "docker_host": self.host,
                "gpus_requested": self.gpus.spec if self.gpus else None,
                # The image's files and Env only: no file, variable or process of the runner's.
                "key_isolation": {"method": "container"},
            }
        return self._env

    def checked(self, image: ImageFacts) -> Checked:
        # The layers stage reads the image itself; a refused pull's verification is reported.
        refused = self.refused.get(image)
        return Checked(refused[1], refused[0]) if refused else Checked()

    def _refused_by_registry(self, name: ImageName, pull_error: PullFailed) -> ImageFacts | None:
        """The engine would not pull the image: imagegate reads the registry copy itself. When
        its own verification fails (a tampered or corrupt blob, a config that is not the
        manifest's) that is the refusal, signed like any outcome and named by the manifest read
        and hashed here; None otherwise (the pull failure stands: a name, a network, a login)."""
        from imagegate.oci.layercheck import verify_source
        from imagegate.oci.transports import open_source

        reference, repository = name.text, name.repository
        if not _BYTES_REFUSED.search(pull_error.detail):
            return None  # a name, a network, a login, a full disk: not worth reading the image for
        try:
            source = open_source(f"docker://{reference}")
            try:
                report = verify_source(source)
            finally:
                source.close()
        except ImagegateError:
            return None
        if report.ok or report.manifest_digest is None:
            return None
        image = ImageFacts(
            reference=reference,
            config_digest=report.config.actual_digest,
            manifest_digest=report.manifest_digest,
            repo_digests=(f"{repository}@{report.manifest_digest}",) if repository else (),
            platform=report.platform,
            repository=repository,
            index_digest=report.index_digest,
        )
        failed = report.failed_layers
        why = (
            "; ".join(
                [
                    *(f"layer {x.index + 1}/{len(report.layers)} {x.status}: {x.detail}" for x in failed),
                    *report.problems,
                ]
            )
            or report.config.detail
        )
        facts = {
            "refused": "PullRefused",
            "error": f"the engine would not pull it ({pull_error.detail}); read from the registry: {why}",
            "hint": "the registry does not hold the image's declared bytes (tampered or corrupt)",
            **verification_facts(report, failed[0].index if failed else None),
            "entry": None,
        }
        detail = f"the engine would not pull it, and the registry copy fails verification: {why}"
        self.refused[image] = (Refusal(Status.FAIL, detail, facts, report, stage="pull"), report)
        return image

    def left_behind(self) -> str | None:
        # Only containers the engine has not confirmed removed (`_remove` forgets the others).
        left = sorted(self.live)
        return f"container {', '.join(left)} may be left: docker rm -f {' '.join(left)}" if left else None

    def image_source(self, image: ImageFacts, timeout: float | None) -> Source | None:
        from imagegate.oci.sources.daemon import DaemonArchive

        # The very engine the probes ran in, by image ID: what is read is what ran.
        return (
            DaemonArchive(image.config_digest, self.engine, timeout=timeout) if image.config_digest else None
        )

    def _pull(self, name: ImageName, why: str = "") -> None:
        """Pull through the engine (its credentials and mirrors), as `docker run` does."""
        reference = name.text
        if name.reference is None or name.repository is None or reference.startswith("sha256:"):
            raise UsageError(
                f"image {reference}: an image ID cannot be pulled", hint="build or load it first"
            )
        repo, tag = name.repository, name.reference.ref  # a bare name means :latest
        self.notify(f"{why}; pulling it" if why else f"pulling {reference}")
        import docker.errors

        hint = "check the reference, the registry's reachability and your credentials (docker login)"
        try:
            for msg in self.client.api.pull(repo, tag=tag, stream=True, decode=True):
                if "error" in msg:
                    raise PullFailed(reference, str(msg.get("error")), hint=hint)
        except docker.errors.APIError as e:
            raise PullFailed(reference, str(e.explanation or e), hint=hint) from e

    def resolve(self, image: ImageName | str) -> ImageFacts:
        name = image if isinstance(image, ImageName) else parse_image_name(image)
        reference = name.text
        if self.pull == "always":
            try:
                self._pull(name)
            except PullFailed as pull_error:
                refused = self._refused_by_registry(name, pull_error)
                if refused is None:
                    raise
                return refused
        try:
            attrs = engineapi.inspect_image(self.engine, reference)
        except engineapi.EngineNotFound as e:
            missing = f"image {reference}: not found in the {self.environment()['engine']} engine"
            if self.pull == "missing":
                # Say first what the user can act on (a typo, an image not built yet), then why
                # the pull did not help: a registry's DNS or 404 message alone hides the cause.
                try:
                    self._pull(name, why=missing)
                except PullFailed as pull_error:
                    refused = self._refused_by_registry(name, pull_error)
                    if refused is not None:
                        return refused
                    raise UsageError(
                        f"{missing}, and pulling it failed: {pull_error.detail}",
                        hint="check the name (docker images lists the engine's), build it, or "
                        "check the registry's reachability and your credentials (docker login)",
                    ) from pull_error
                self.pull = "never"  # once: a pulled image that still cannot be inspected is an error
                return self.resolve(name)
            raise UsageError(
                missing, hint=f"build or pull it (docker pull {reference}), or drop --pull never"
            ) from e
        except engineapi.EngineAnswered as e:
            if 400 <= e.status_code < 500:
                raise UsageError(f"image reference {reference!r}: {e.explanation or e}") from e
            raise EngineError(f"inspecting image {reference}: {e}") from e
        image_id = attrs["Id"] if attrs["Id"].startswith("sha256:") else "sha256:" + attrs["Id"]
        _check_engine_digest(image_id, f"image {reference}: the engine's image ID")
        repo_digests = tuple(str(d) for d in attrs.get("RepoDigests") or ())
        for d in repo_digests:  # the engine's answer is untrusted: a digest, or nothing is read by it
            _check_engine_digest(d.partition("@")[2], f"image {reference}: the engine's repo digest")
        os_, arch, variant = (str(attrs.get(k) or "") for k in ("Os", "Architecture", "Variant"))
        ran = self._ran(name, image_id, repo_digests, Platform(os_, arch, variant or None))
        return ImageFacts(
            reference=reference,
            config_digest=image_id,
            manifest_digest=ran.manifest_digest,
            repo_digests=repo_digests,
            platform="/".join(x for x in (os_, arch, variant) if x) or None,
            repository=ran.repository or name.repository,
            index_digest=ran.index_digest,
            subject_note=ran.why,
        )

    def _ran(
        self, name: ImageName, image_id: str, repo_digests: tuple[str, ...], platform: Platform
    ) -> RanManifest:
        """The manifest whose config the engine runs. Its repo digests name what it was pulled
        by, which for an image pulled through an index is the index (Docker lists only that;
        Podman lists the index and the platform manifest): each is read from its registry."""
        if not repo_digests:
            return RanManifest(None, None)
        ran = ran_manifest(
            repo_digests,
            image_id,
            named=name.repository,
            platform=platform if platform.os and platform.architecture else None,
            insecure=self.insecure,
        )
        if ran.manifest_digest is None:
            self.notify(f"the subject is the image's config digest: {ran.why}")
        return ran

    def run_bundle(self, req: BundleRequest) -> BundleRun:
        deadline = time.monotonic() + req.deadline_s
        payload = loader_payload(req.bundle, req.event_key, req.stages)

        def attempt(interpreter: str) -> BundleRun | str:
            return self._run_once(
                req.image, payload, req.bundle_sha256, interpreter, deadline, req.on_stdout, req.cancel
            )

        return first_usable(req.interpreters, attempt, req.cancel)

    def _run_once(
        self,
        image: ImageFacts,
        payload: bytes,
        sha: str,
        interpreter: str,
        deadline: float,
        on_stdout: OnOutput | None = None,
        cancel: threading.Event | None = None,
    ) -> BundleRun | str:
        """A string says why this interpreter cannot run the bundle (absent, too old)."""
        import docker.errors

        api = self.client.api
        # Named before it exists: an interrupt that cuts the create call's answer still leaves a
        # name to remove by. An interrupt is held while the engine creates and removes it.
        name = f"imagegate-{secrets.token_hex(8)}"
        out, err = CappedBuffer(STDOUT_CAP, on_stdout), CappedBuffer(STDERR_CAP)
        sock: _Closable | None = None  # the SDK's attach socket
        self.live.add(name)
        try:
            log.debug("creating container %s", name)
            with interrupts.critical():
                cid = self._create(image, interpreter, sha, name)
            attached = api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            sock = attached
            raw: socket.socket = getattr(attached, "_sock", attached)
            cannot = self._start(cid, image, interpreter)
            if cannot is not None:
                return cannot
            raw.settimeout(max(0.1, deadline - time.monotonic()))
            raw.sendall(payload)
            log.info("container %s started; bundle sent (%d bytes)", name, len(payload))
            timed_out = not _read_frames(raw, out, err, deadline, cancel)
            exit_code = None if timed_out else self._wait_exit(cid, deadline)
            cannot = self._cannot_run(image, interpreter, cid, exit_code, out.total, err.value())
            return (
                cannot if cannot is not None else self._finished(out, err, exit_code, interpreter, cid, name)
            )
        except docker.errors.APIError as e:
            if self.gpus is not None and _no_gpu_runtime(e):
                raise self._gpu_refused(e) from e
            raise EngineError(f"running {image.reference}: {e}") from e
        finally:
            if sock is not None:
                with contextlib.suppress(Exception):
                    sock.close()
            with interrupts.critical():
                self._remove(name)

    def _finished(
        self,
        out: CappedBuffer,
        err: CappedBuffer,
        exit_code: int | None,
        interpreter: str,
        cid: str,
        name: str,
    ) -> BundleRun:
        """What the container's run gives the runner: its output, its end, the sandbox's facts."""
        return BundleRun(
            out.value(),
            err.value(),
            exit_code,
            timed_out=exit_code is None,
            interpreter=interpreter,
            stdout_total=out.total,
            stderr_total=err.total,
            error="overall deadline reached; container killed" if exit_code is None else None,
            facts={
                "container_id": cid,
                "container_name": name,
                "memory": self.memory,
                "pids_limit": self.pids,
            },
            gpus=self._granted(cid),
        )

    def _granted(self, cid: str) -> Grant | None:
        """The GPUs this container was given, as the engine recorded them for it (read back,
        not what was asked): a GPU level rests on this, never on the image's report."""
        if self.gpus is None:
            return None
        doc = engineapi.get_json(self.engine, "/containers/{0}/json", cid)
        host = doc.get("HostConfig") if isinstance(doc, dict) else None
        return engine_grant(host if isinstance(host, dict) else {})

    def _create(self, image: ImageFacts, interpreter: str, sha: str, name: str) -> str:
        """The container, isolated, created (not started): its ID."""
        api = self.client.api
        host_config = api.create_host_config(
            network_mode="none",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            read_only=True,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={self.tmpfs_size}"},
            pids_limit=self.pids,
            mem_limit=self.memory,
            device_requests=self._device_requests(),
            binds={str(self.model): {"bind": modelpath.IN_SANDBOX, "mode": "ro"}} if self.model else None,
        )
        container = api.create_container(
            image.config_digest or image.reference,
            entrypoint=[interpreter, *LOADER_FLAGS, "-c", LOADER, sha],
            stdin_open=True,
            tty=False,
            environment=self._container_env(),
            labels=run_labels(),
            host_config=host_config,
            network_disabled=True,
            name=name,
        )
        log.debug("created container %s from %s with %s", name, image.config_digest, interpreter)
        return str(container["Id"])

    def _start(self, cid: str, image: ImageFacts, interpreter: str) -> BundleRun | str | None:
        """Start it. None: started; else this interpreter cannot run the bundle: why (absent), or
        the run's end (an image for another machine)."""
        import docker.errors

        try:
            self.client.api.start(cid)
        except docker.errors.APIError as e:
            if self.gpus is not None and _no_gpu_runtime(e):
                raise self._gpu_refused(e) from e
            if _not_found(e):
                return "not found in the image"
            if "exec format error" in str(e).lower():
                return self._foreign(image, interpreter)
            raise EngineError(f"starting a container of {image.reference}: {e}") from e
        return None

    def _cannot_run(
        self, image: ImageFacts, interpreter: str, cid: str, exit_code: int | None, out_total: int, err: bytes
    ) -> BundleRun | str | None:
        """None when the loader ran the bundle; else, read from how it ended, why this interpreter
        could not (absent, too old), or the run's end (an image for another machine)."""
        if exit_code == 127 and not out_total and b"not found" in err.lower():
            return "not found in the image"  # podman reports a missing executable as exit 127 on some paths
        if not out_total and b"exec format error" in err.lower():
            return self._foreign(image, interpreter, cid)
        if exit_code == TOO_OLD_EXIT and b"imagegate: too old:" in err:
            found = err.decode(errors="replace").split("too old:", 1)[1].strip()
            return f"{found}; the probes need Python 3.8 or newer"
        return None

    def _device_requests(self) -> list[docker.types.DeviceRequest] | None:
        return device_requests(self.gpus)

    def _gpu_refused(self, e: docker.errors.APIError) -> EngineError:
        env = self.environment()
        return EngineError(
            f"--gpus {self.gpus.spec if self.gpus else ''}: the {env['engine']} engine at {env['docker_host']} "
            f"cannot give containers GPUs (it has no GPU runtime): {e.explanation or e}",
            hint="install the NVIDIA Container Toolkit for this engine (nvidia-ctk runtime configure) and "
            "restart it, run with --here on the GPU host, or leave --gpus out",
        )

    def _container_env(self) -> dict[str, str]:
        if self.gpus is None:
            return HIDDEN_GPU_ENV
        return {k: v for k, v in HIDDEN_GPU_ENV.items() if k not in HIDING_ENV}

    def _foreign(self, image: ImageFacts, interpreter: str, cid: str | None = None) -> BundleRun:
        """An image for another architecture: every stage is ERROR, with this reason."""
        engine = self.environment()
        return BundleRun(
            b"",
            b"",
            None,
            interpreter=interpreter,
            error=f"this {engine.get('os')}/{engine.get('arch')} engine cannot execute the image's {interpreter} "
            f"(exec format error, the image says {image.platform or 'no platform'}): run it on a matching host "
            "or with binfmt emulation",
            facts={"container_id": cid} if cid else {},
        )

    def _wait_exit(self, cid: str, deadline: float) -> int | None:
        # wait(timeout=) is only an HTTP timeout (ConnectionError on a unix socket): poll instead,
        # briefly at first: after the stream's EOF the container is usually already gone.
        pause = 0.005
        while time.monotonic() < deadline:
            state = self.client.api.inspect_container(cid)["State"]
            if not state.get("Running"):
                code = state.get("ExitCode")
                return int(code) if code is not None else None
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        return None

    def _remove(self, name: str) -> None:
        """Remove the container by name; `live` keeps it only when that was not confirmed. An
        engine busy with the container (starting, being killed) is asked again, briefly."""
        import docker.errors

        log.debug("removing container %s", name)
        last: docker.errors.APIError | None = None
        for attempt in range(6):
            try:
                self.client.api.remove_container(name, force=True, v=True)
            except docker.errors.NotFound:
                break  # never created (the create failed), or already gone
            except docker.errors.APIError as e:  # busy with it (already being removed, starting)
                last = e
                time.sleep(0.1 * (attempt + 1))
            else:
                break
        else:
            if self._exists(name):
                raise EngineError(
                    f"container {name} could not be removed: {last}", hint=f"remove it: docker rm -f {name}"
                ) from last
        self.live.discard(name)

    def _exists(self, name: str) -> bool:
        import docker.errors

        try:
            self.client.api.inspect_container(name)
        except docker.errors.NotFound:
            return False
        return True

    def leftovers(self) -> list[str]:
        """Containers an earlier imagegate run of this machine created and never removed (it was
        killed): named so that the user can remove them. A container whose runner may be alive,
        or cannot be told (another host, boot or PID namespace, labels of an older version), is
        never named: it may be another job's run in flight. Those are only counted (-v)."""
        found, others = [], 0
        try:  # bounded and typed like every engine answer; advice only, so never fatal
            listed = engineapi.get_json(
                self.engine,
                "/containers/json",
                params={"all": "1", "filters": json.dumps({"label": [LABEL]})},
            )
        except EngineError as e:
            log.info("could not list imagegate containers: %s", e)
            return []
        for c in listed if isinstance(listed, list) else []:
            if not isinstance(c, dict):
                continue
            labels = c.get("Labels")
            dead = runner_dead(labels if isinstance(labels, dict) else {})
            if dead is None:
                others += 1
            if not dead:
                continue
            names = [n.lstrip("/") for n in c.get("Names") or [] if isinstance(n, str)]
            found.append(names[0] if names else str(c.get("Id", ""))[:12])
        if others:
            log.info("%d imagegate containers of other runs exist", others)
        return found


def _read_frames(
    raw: socket.socket,
    out: CappedBuffer,
    err: CappedBuffer,
    deadline: float,
    cancel: threading.Event | None = None,
) -> bool:
    """Demultiplex the attach stream (8-byte headers: stream id, size) until EOF, passing each
    payload on as it arrives (a frame is never held whole). False when the deadline passed (or
    the run was cancelled) first."""
    header = bytearray()
    sink: CappedBuffer | None = None
    left = 0  # bytes of the current frame's payload still to come
    sinks = {1: out, 2: err}
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or (cancel is not None and cancel.is_set()):
            return False
        raw.settimeout(min(remaining, 0.5))
        try:
            chunk = raw.recv(1 << 20)
        except TimeoutError:
            continue
        except OSError:
            return True
        if not chunk:
            return True
        view = memoryview(chunk)
        while view:
            if left:
                part = view[:left]
                if sink is not None:
                    sink.feed(bytes(part))
                left -= len(part)
                view = view[len(part) :]
                continue
            need = 8 - len(header)
            header += view[:need]
            view = view[need:]
            if len(header) == 8:
                stream, left = struct.unpack(">BxxxL", header)
                sink = sinks.get(stream)
                header.clear()


def _check_engine_digest(value: str, what: str) -> None:
    """An ID or digest from the engine becomes a folder name and a signed subject: only
    `sha256:` and hex, never a path (`sha256:/../x`)."""
    if not is_digest(value):
        raise EngineError(
            f"{what} {value!r} is not a digest (sha256: and 64 lowercase hex characters)",
            hint="the engine answered something no Docker or Podman engine does; check what DOCKER_HOST points at",
        )


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(4096).strip()
    except OSError:
        return None


def start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (clock ticks after boot); None: no such process (or unreadable)."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat or ")" not in stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses
    return fields[19] if len(fields) > 19 else None  # field 3 is fields[0]


def _pid_namespace() -> str | None:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None


def run_labels() -> dict[str, str]:
    pid = os.getpid()
    labels = {
        LABEL: "1",
        PID_LABEL: str(pid),
        START_LABEL: start_time(pid),
        PIDNS_LABEL: _pid_namespace(),
        BOOT_LABEL: _read("/proc/sys/kernel/random/boot_id"),
        HOST_LABEL: socket.gethostname(),
    }
    return {k: v for k, v in labels.items() if v}


def runner_dead(labels: dict[str, str]) -> bool | None:
    """Is the run that made a container with these labels over? True: its runner is gone (a
    leftover); False: it is alive; None: it cannot be told from here (another host, boot or PID
    namespace, or labels without the runner's start time)."""
    own = run_labels()
    if any(not labels.get(k) or labels.get(k) != own.get(k) for k in (HOST_LABEL, BOOT_LABEL, PIDNS_LABEL)):
        return None
    try:
        pid = int(labels.get(PID_LABEL, ""))
    except ValueError:
        return None
    started = labels.get(START_LABEL)
    if not started or pid <= 0:
        return None
    now = start_time(pid)
    if now is None:
        return not os.path.exists(f"/proc/{pid}")  # unreadable but present: cannot be told
    return now != started  # the same PID, started later: the runner is gone, its PID reused
