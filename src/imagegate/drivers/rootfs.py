"""The rootfs driver (`run --driver rootfs`): no engine. The image is read from any transport,
each layer verified while it is unpacked into a root folder (a layer that fails verification
discards the root: probes never run on unverified bytes, and the run ends in a signed FAIL that
names it: `Refused`), and the bundle runs with the image's own python inside that root under
bubblewrap (drivers/bwrap.py says what the sandbox applies).

The bundle and the event key go in as with the docker driver: the same loader reads them from
stdin, writes the bundle to the sandbox's tmpfs and hands the key to the controller through an
inherited pipe (IMAGEGATE_EVENT_KEY_FD); no file in the root, no argv, no environment holds it."""

from __future__ import annotations

import errno
import platform as host_platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from imagegate._support.jsontypes import JsonObject
from imagegate.domain import servemodel as modelpath
from imagegate.domain.gpus import nodes_grant
from imagegate.domain.results import ImageFacts, Status
from imagegate.drivers import bwrap, cdi, seccomp
from imagegate.drivers.interface import (
    BundleRequest,
    BundleRun,
    Checked,
    DriverBase,
    Refusal,
    first_usable,
    verification_facts,
)
from imagegate.drivers.loader import HIDDEN_GPU_ENV, LOADER, LOADER_FLAGS, TOO_OLD_EXIT, loader_payload
from imagegate.drivers.process import Completed
from imagegate.errors import ImagegateError, UsageError
from imagegate.oci.layercheck import LayerResult, VerifyReport

if TYPE_CHECKING:  # the unpacking and the sources load when an image is read, not with the driver
    from imagegate.oci.sources.interface import Source
    from imagegate.rootfs import Root, UnpackError


@dataclass(frozen=True)
class PreparedRoot:
    """A verified, unpacked image: the folder the sandbox binds read-only at /, and where its
    bytes came from."""

    path: Path
    config: JsonObject  # the image config's `config` object (Env, WorkingDir, User, ...)
    config_digest: str
    manifest_digest: str | None  # the platform's manifest where the source is an index
    source: str  # the transport string the bytes were read from (a tag: pinned to its digest then)
    platform: str | None = None
    index_digest: str | None = None  # the index the platform's manifest was chosen from
    repository: str | None = None  # a registry's repository, where the source is one
    chain_id: str | None = None
    facts: JsonObject = field(default_factory=dict)  # unpacking: cache hit, layers, seconds
    # The layer verification done while unpacking (oci.layercheck.VerifyReport), for the layers stage.
    report: VerifyReport | None = None


# reference (any transport) -> its verified root; raises ImagegateError when it cannot be made.
RootMaker = Callable[[str], PreparedRoot]


class RootfsDriver(DriverBase):
    name = "rootfs"
    isolated_runs = True  # each run_bundle is a sandbox of its own (own pid, ipc, net namespaces)
    has_image = True

    def __init__(
        self,
        make_root: RootMaker,
        *,
        memory: str = "8g",
        pids: int = 4096,
        tmpfs_size: str = "1g",
        notify: Callable[[str], None] = lambda _m: None,
        platform: str | None = None,
        insecure: bool = False,
        gpus: cdi.Injection | None = None,
        model: Path | None = None,
    ) -> None:
        # --model: bound read-only where the serve stages look for it
        self.ro_binds = ((str(model), modelpath.IN_SANDBOX),) if model else ()
        self.bwrap = bwrap.check_host()  # before any byte is read: a host that cannot sandbox says so now
        bwrap.check_seccomp()  # the same: no filter, no run (weaker than an engine's default profile)
        self.make_root = make_root
        self.limits = bwrap.Limits(
            nproc=pids,
            data_bytes=bwrap.parse_size(memory),
            tmpfs_bytes=bwrap.parse_size(tmpfs_size),
        )
        self.notify = notify
        self.platform, self.insecure = platform, insecure
        self.gpus = gpus
        self.roots: dict[str, PreparedRoot] = {}
        self.refused: dict[ImageFacts, Refused] = {}
        self._env: JsonObject | None = None

    def environment(self) -> JsonObject:
        if self._env is None:
            self._env = {
                "driver": self.name,
                "engine": None,  # no engine was involved: the bytes were verified and run here
                "sandbox": "bubblewrap",
                "sandbox_version": bwrap.version(self.bwrap),
                "os": host_platform.system().lower(),
                "arch": host_platform.machine(),
                "limits": self.limits.facts(),
                "seccomp": seccomp.facts(),
                "gpus_requested": self.gpus.request if self.gpus else None,
                # Which CDI spec (or the host-derived one) and exactly what the sandbox was given.
                "gpu_injection": self.gpus.facts() if self.gpus else None,
                # The image's root and Env only (the host's environment cleared), own pid namespace.
                "key_isolation": {"method": "bubblewrap"},
            }
        env = dict(self._env)
        if self.roots:
            root = next(iter(self.roots.values()))
            env["image_source"] = {
                "source": root.source,
                "manifest_digest": root.manifest_digest,
                "config_digest": root.config_digest,
                "chain_id": root.chain_id,
                **root.facts,
            }
        for image, refused in self.refused.items():
            env["image_source"] = {
                "source": refused.source,
                "manifest_digest": image.manifest_digest,
                "config_digest": image.config_digest,
                "refused": type(refused.error).__name__,
            }
        return env

    def resolve(self, reference: str) -> ImageFacts:
        """The image's facts once its root is made; for an image refused while unpacking (a
        layer, the config or an entry that failed verification) the facts of what was read, its
        refusal kept for refusal(): the run goes on to a signed FAIL. Raises when not even a
        digest of the image could be read (nothing to attest to)."""
        from imagegate.rootfs import UnpackError

        try:
            root = self.make_root(reference)
        except UnpackError as e:
            refused = Refused.of(reference, e)
            if refused is None:
                raise
            self.refused[refused.image] = refused
            return refused.image
        self.roots[root.config_digest] = root
        repo_digests: tuple[str, ...] = ()
        if root.repository and root.manifest_digest:
            repo_digests = (f"{root.repository}@{root.manifest_digest}",)
        return ImageFacts(
            reference=reference,
            config_digest=root.config_digest,
            manifest_digest=root.manifest_digest,
            repo_digests=repo_digests,
            platform=root.platform,
            repository=root.repository,
            index_digest=root.index_digest,
        )

    def checked(self, image: ImageFacts) -> Checked:
        return Checked(self._verified_report(image), self._refusal(image))

    def _verified_report(self, image: ImageFacts) -> VerifyReport | None:
        """The layer verification of the image the probes run on (the layers stage reports it
        instead of reading the image a second time): each layer read in this run (while unpacking,
        or to vouch for a cached root), or a verified pair this machine recorded earlier, marked
        as such (LayerResult.pair_recorded_at). None when a layer is neither."""
        if image in self.refused:
            return self.refused[image].verified_report()
        root = self.roots.get(image.config_digest or "")
        if root is None or root.report is None:
            return None
        report: VerifyReport = root.report
        if not report.ok or len(report.layers) != len(report.diff_ids):
            return None
        return report

    def _refusal(self, image: ImageFacts) -> Refusal | None:
        refused = self.refused.get(image)
        return refused.refusal() if refused is not None else None

    def image_source(self, image: ImageFacts, timeout: float | None) -> Source | None:
        """The source this driver read the image from, opened again (an oci.sources Source): how
        an outside stage reads the bytes of an image whose root came from the cache."""
        from imagegate.oci.transports import open_source

        root = self.roots.get(image.config_digest or "")
        return open_source(root.source, platform=self.platform, insecure=self.insecure) if root else None

    def run_bundle(self, req: BundleRequest) -> BundleRun:
        root = self.roots.get(req.image.config_digest or "")
        if root is None:
            raise UsageError(f"image {req.image.reference}: not resolved by the rootfs driver")
        sandbox = bwrap.Sandbox(
            root.path,
            bwrap.ImageConfig.from_config(root.config),
            self.limits,
            HIDDEN_GPU_ENV if self.gpus is None else {"TMPDIR": "/tmp"},
            gpus=self.gpus,
            ro_binds=self.ro_binds,
        )
        payload = loader_payload(req.bundle, req.event_key, req.stages)

        def attempt(interpreter: str) -> BundleRun | str:
            command = [interpreter, *LOADER_FLAGS, "-c", LOADER, req.bundle_sha256]
            with seccomp.program_fd() as fd:
                argv, ident = sandbox.argv(self.bwrap, command, seccomp_fd=fd)
                done = bwrap.run(
                    argv,
                    stdin=payload,
                    deadline_s=req.deadline_s,
                    on_stdout=req.on_stdout,
                    cancel=req.cancel,
                    pass_fds=(fd,),
                )
            return interpret(done, req.image, interpreter, ident, self.limits)

        run = first_usable(req.interpreters, attempt, req.cancel)
        if self.gpus is not None:  # the CDI spec's device nodes as bound: what the sandbox got
            run.gpus = nodes_grant("cdi", self.gpus.device_nodes)
        return run


@dataclass(frozen=True)
class Refused:
    """An image the unpacking refused (rootfs.ImageRefused: FAIL) or could not finish reading
    (another rootfs.UnpackError: ERROR), with the verification so far."""

    image: ImageFacts  # named only by digests whose bytes were read and hashed in this run
    error: UnpackError
    report: VerifyReport
    source: str

    @classmethod
    def of(cls, reference: str, error: UnpackError) -> Refused | None:
        """None when nothing of the image was read and hashed: no subject to sign for."""
        report: VerifyReport | None = error.report
        if report is None:
            return None
        # The manifest's digest is the hash of the manifest read (the registry client and the
        # OCI index reader check it); the config's, of the config blob read. A digest the
        # manifest merely claims (a config that was never read) names nothing here.
        manifest, config = report.manifest_digest, report.config.actual_digest
        if manifest is None and config is None:
            return None
        repository = _repository(reference)
        image = ImageFacts(
            reference=reference,
            config_digest=config,
            manifest_digest=manifest,
            repo_digests=(f"{repository}@{manifest}",) if repository and manifest else (),
            platform=report.platform,
            repository=repository,
            index_digest=report.index_digest,
        )
        return cls(image, error, report, report.source or reference)

    @property
    def status(self) -> Status:
        from imagegate.rootfs import ImageRefused

        return Status.FAIL if isinstance(self.error, ImageRefused) else Status.ERROR

    def verified_report(self) -> VerifyReport | None:
        """The verification so far, for a layers stage to report (FAIL with its table). A
        hostile entry or a bomb stops the unpack in a layer whose bytes verify: the refusal is
        then one of the report's problems, so that the report is never read as a pass."""
        if self.status is not Status.FAIL:
            return None
        report, problems = self.report, list(self.report.problems)
        if report.ok:
            problems.append(str(self.error))
        read, declared = len(report.layers), len(report.diff_ids)
        if report.layers and read < declared:
            problems.append(f"layers {read + 1}-{declared} not read: the unpack stopped at layer {read}")
        return replace(report, problems=tuple(problems))

    def refusal(self) -> Refusal:
        e = self.error
        facts = {
            "refused": type(e).__name__,
            "error": str(e),
            "hint": e.hint,
            **verification_facts(self.report, getattr(e, "layer", None)),
            "source": self.source,
            "entry": getattr(e, "entry", None),
        }
        why = "refused while unpacking" if self.status is Status.FAIL else "its source failed while unpacking"
        return Refusal(self.status, f"{why}: {e}", facts, self.report)


def interpret(
    done: Completed, image: ImageFacts, interpreter: str, ident: bwrap.Identity, limits: bwrap.Limits
) -> BundleRun | str:
    """One sandboxed run as the runner takes it; a string when the interpreter was unusable."""
    if not done.stdout_total and not done.timed_out:
        failed = bwrap.exec_failure(done.stderr)
        if failed == errno.ENOENT:
            return "not found in the image"
        if failed == errno.ENOEXEC:
            return (
                f"this {host_platform.machine()} host cannot execute the image's {interpreter} "
                f"(exec format error, the image says {image.platform or 'no platform'}): run it on a "
                "matching host or with binfmt emulation"
            )
        if done.exit_code == TOO_OLD_EXIT and b"imagegate: too old:" in done.stderr:
            found = done.stderr.decode(errors="replace").split("too old:", 1)[1].strip()
            return f"{found}; the probes need Python 3.8 or newer"
    return BundleRun(
        done.stdout,
        done.stderr,
        done.exit_code,
        timed_out=done.timed_out,
        interpreter=interpreter,
        stdout_total=done.stdout_total,
        stderr_total=done.stderr_total,
        error="overall deadline reached; sandbox killed" if done.timed_out else None,
        facts={
            "sandbox": "bubblewrap",
            "uid": ident.uid,
            "gid": ident.gid,
            "limits": limits.facts(),
            "wall_s": done.wall_s,
        },
    )


def materializer(
    *, expect_config: str | None, platform: str | None, insecure: bool, cache_dir: str | None = None
) -> RootMaker:
    """The RootMaker of the command line: any transport string (a bare reference is docker://),
    verified and unpacked by imagegate.rootfs.materialize into the root cache (`cache_dir`, else
    the default folder). A layer that fails verification raises (rootfs.LayerRefused, exit 1)
    before anything runs, also when the root of the same layers is in the cache."""
    from imagegate import rootfs
    from imagegate.oci.sources.interface import ImageSource
    from imagegate.oci.transports import open_source

    def make(reference: str) -> PreparedRoot:
        # The folder is checked before any byte is read. Held until this process ends: no other
        # run evicts the root while the probes use it.
        cache = rootfs.RootCache(cache_dir)
        source = None
        try:
            source = open_source(reference, platform=platform, insecure=insecure)
            t0 = time.monotonic()
            root = rootfs.materialize(source, cache=cache, expect_config=expect_config)
        except BaseException:
            cache.close()
            raise
        finally:
            if source is not None:
                source.close()
        # A tag is kept as the digest it named when read: the outside stages reopen this very
        # image, whatever the tag names by then.
        pinned = source.pinned() if isinstance(source, ImageSource) else None
        return prepared(root, pinned or reference, time.monotonic() - t0, cache.notes)

    return make


def _layer_fact(x: LayerResult, cached: bool) -> JsonObject:
    """How one layer of the root was vouched for: read in this run (while unpacking it, or to
    check a cached root), or a verified pair this machine recorded earlier."""
    if x.pair_recorded_at:
        return {"digest": x.expected_digest, "verified": "known_pair", "pair_recorded_at": x.pair_recorded_at}
    how = "now, to reuse the cached root" if cached else "now, while unpacking"
    return {"digest": x.expected_digest, "verified": how}


def prepared(root: Root, reference: str, seconds: float, notes: Sequence[str] = ()) -> PreparedRoot:
    """A rootfs.Root as the driver uses it: its config (Env, WorkingDir, User) is this image's own,
    also for a root from the cache (a cached root is content, never identity)."""
    return PreparedRoot(
        path=Path(root.path),
        config={"Env": list(root.env), "WorkingDir": root.working_dir, "User": root.user},
        config_digest=root.config_digest,
        manifest_digest=root.manifest_digest,
        source=reference,
        platform=root.report.platform,
        index_digest=root.report.index_digest,
        repository=_repository(reference),
        chain_id=root.chain_id,
        facts={
            "cached": root.cached,
            "unpacked_from": root.unpacked_from,
            "not_applied": list(root.not_applied),
            "size": root.size,
            "prepare_s": round(seconds, 3),
            "layers": [_layer_fact(x, root.cached) for x in root.report.layers],
            **({"cache_notes": list(notes)} if notes else {}),
        },
        report=root.report,
    )


def _repository(reference: str) -> str | None:
    """The registry repository a docker:// (or bare) reference names; None for other transports."""
    from imagegate.oci.reference import parse_reference

    if reference.startswith(("docker-daemon:", "docker-archive:", "oci:")):
        return None
    try:
        ref = parse_reference(reference.removeprefix("docker://"))
    except ImagegateError:
        return None
    return f"{ref.registry}/{ref.repository}"
