"""The local driver (`run --here`): the bundle runs with this environment's interpreter (or
--python PATH). It is what runs inside a Pod, and on any machine or virtual environment.

The environment under test runs as the runner's user, beside the runner, which holds the signing
key. So the probes (and the fingerprint's interpreter) run under bubblewrap (`KeyIsolation`): the
host's root read-only, a new pid namespace with its own /proc (the runner's environ, fds and
memory out of sight), a private /tmp, a minimal /dev (GPUs added when --gpus asks), every known
key file, the default key's folder and Vault's token file masked, the engines' sockets masked; and
their environment never holds a variable of the runner's IMAGEGATE_* (the key's name, its
passphrase), nor VAULT_TOKEN (a hashivault:// key's token), nor an identity token or what asks
for one (SIGSTORE_ID_TOKEN, GitHub's ACTIONS_ID_TOKEN_REQUEST_*: keyless signing's). Where
bubblewrap cannot run, signing is refused unless the user accepts it (--sign-unisolated), and the
statement says so (keyIsolation: none)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from imagegate._support.jsontypes import JsonObject
from imagegate._support.names import GITHUB_TOKEN_REQUEST_ENVS, SIGSTORE_TOKEN_ENV, VAULT_TOKEN_ENV
from imagegate.attest.keys import KEY_ENV, default_key_path
from imagegate.domain.gpus import HIDING_ENV, GpuRequest, nodes_grant
from imagegate.domain.results import ImageFacts
from imagegate.drivers import bwrap, seccomp
from imagegate.drivers.interface import BundleRequest, BundleRun, DriverBase, OnOutput
from imagegate.drivers.process import run_group
from imagegate.errors import UsageError

KEY_FD_ENV = "IMAGEGATE_EVENT_KEY_FD"  # probes/controller.py reads the key from this descriptor
STAGES_ENV = "IMAGEGATE_STAGES"  # the stage ids this controller runs
RUNNER_PREFIX = "IMAGEGATE_"  # the runner's own variables (the key's path, its passphrase): never passed on
# A hashivault:// key's token: whoever holds it signs with the key in Vault, so the code under
# test never does (the server's address is no secret, and passes on as any variable); an
# identity token, or GitHub's means to ask for one, signs keyless as the CI's workflow: never
# passed on either, whatever key this run signs with
SIGNER_SECRETS = (VAULT_TOKEN_ENV, SIGSTORE_TOKEN_ENV, *GITHUB_TOKEN_REQUEST_ENVS)
SIGN_UNISOLATED = "--sign-unisolated"

SANDBOX_TMP = "/tmp"
BUNDLE_IN_SANDBOX = "/tmp/imagegate-bundle/imagegate.pyz"
GPU_DEVICES = ("nvidia*", "dri", "infiniband")  # under /dev, given only when --gpus asks
# The engines' API sockets: whoever reaches one is root on this host, and can read any key file.
ENGINE_SOCKETS = (
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/run/podman/podman.sock",
    "/run/containerd/containerd.sock",
)


@dataclass(frozen=True)
class KeyIsolation:
    """How the probes are kept from the signing key. `bwrap` None: they are not, `reason` says why
    (and `accepted`: the user signs anyway). `hidden`: (what, path) masked in the sandbox."""

    bwrap: str | None
    reason: str | None = None
    accepted: bool = False
    hidden: tuple[tuple[str, str], ...] = ()

    def argv(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        *,
        gpus: bool,
        bundle: Path | None = None,
        seccomp_fd: int | None = None,
        also: Sequence[str] = (),
    ) -> list[str]:
        """bwrap and its options around `command`; `bundle` is bound read-only at BUNDLE_IN_SANDBOX;
        `seccomp_fd` (passed to the process) holds the seccomp filter bwrap applies; `also`:
        more paths the probes use (a --model folder), bound in when they live under /tmp."""
        assert self.bwrap is not None
        argv = [self.bwrap, "--unshare-user", "--unshare-pid", "--disable-userns", "--die-with-parent"]
        # The command is the pid namespace's init, as in a container: no bwrap process inside.
        argv += ["--new-session", "--as-pid-1", "--cap-drop", "ALL"]
        argv += ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
        for dev in _gpu_devices() if gpus else ():
            argv += ["--dev-bind", dev, dev]
        argv += ["--tmpfs", SANDBOX_TMP]
        # The working directory too: a checkout under /tmp (a CI job's) holds the tools its
        # pipeline names (a venv's python in a cli stage).
        lives = [
            command[0],
            os.getcwd(),
            env.get("VIRTUAL_ENV", ""),
            *env.get("PYTHONPATH", "").split(":"),
            *also,
        ]
        binds = _tmp_folders(lives)
        for folder in binds:
            argv += ["--ro-bind", folder, folder]
        if bundle is not None:
            argv += ["--ro-bind", str(bundle), BUNDLE_IN_SANDBOX]
        for _what, path in self.hidden:
            if _under(path, SANDBOX_TMP) and not any(_under(path, b) for b in binds):
                continue  # in the private /tmp: not there at all
            argv += ["--tmpfs", path] if os.path.isdir(path) else ["--ro-bind", "/dev/null", path]
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        return [*argv, "--", *command]

    @contextmanager
    def seccomp_fd(self) -> Iterator[int | None]:
        """The seccomp filter's descriptor for one sandboxed run; None without a sandbox, or where
        libseccomp is missing: the sandbox's job here is hiding the key (files, the pid namespace),
        which holds without the filter, so the run goes on and the facts say seccomp: false."""
        if self.bwrap is None or not seccomp.facts()["seccomp"]:
            yield None
            return
        with seccomp.program_fd() as fd:
            yield fd

    def facts(self) -> JsonObject:
        if self.bwrap is None:
            return {"method": "none", "reason": self.reason, "signed_anyway": self.accepted}
        return {
            "method": "bubblewrap",
            "sandbox_version": bwrap.version(self.bwrap),
            "pid_namespace": True,
            "read_only_root": True,
            "private_tmp": True,
            "hidden": [what for what, _ in self.hidden],
            "seccomp": seccomp.facts(),
        }


def key_isolation(
    *,
    signing: bool,
    key: Path | None = None,
    sign_unisolated: bool = False,
    notify: Callable[[str], None] = lambda _m: None,
) -> KeyIsolation:
    """bubblewrap around the probes when this host can run it; else, when the run would be signed,
    a refusal unless the user accepts it (`sign_unisolated`). Checked before any work."""
    exe = shutil.which("bwrap")
    try:
        if exe is None:
            raise bwrap.SandboxUnavailable(f"bubblewrap (bwrap) is not on PATH ({bwrap.INSTALL_HINT})")
        exe = bwrap.check_host(exe)
    except bwrap.SandboxUnavailable as e:
        if signing and not sign_unisolated:
            raise UsageError(
                f"--here cannot hide the signing key from the environment under test: {e.cause}",
                hint="make bubblewrap usable here (above), or --no-sign, or "
                f"{SIGN_UNISOLATED} to sign anyway (the statement then says keyIsolation: none)",
            ) from e
        if signing:
            notify(f"the probes can read the signing key ({e.cause}); signed anyway ({SIGN_UNISOLATED})")
        else:
            notify(f"the probes run without a sandbox: {e.cause}")
        return KeyIsolation(None, e.cause, accepted=signing)
    return KeyIsolation(exe, hidden=_key_places(key))


def _key_places(key: Path | None) -> tuple[tuple[str, str], ...]:
    """Where a signing key may be, as real paths: masked in the sandbox when present."""
    named = os.environ.get(KEY_ENV)
    places = [
        ("the signing key", key),
        (f"the key {KEY_ENV} names", Path(named).expanduser() if named else None),
        ("the default key's folder", default_key_path().parent),
        # where Vault's CLI keeps the token of `vault login`: a key of Vault's for whoever reads it
        ("Vault's token file", Path("~/.vault-token").expanduser()),
    ]
    engine = [os.environ.get("DOCKER_HOST", ""), os.environ.get("CONTAINER_HOST", ""), *ENGINE_SOCKETS]
    if runtime := os.environ.get("XDG_RUNTIME_DIR"):
        engine += [f"{runtime}/podman/podman.sock", f"{runtime}/docker.sock"]
    for sock in engine:
        path = sock.removeprefix("unix://")
        if path.startswith("/"):
            places.append((f"the engine socket {path}", Path(path)))
    out: dict[str, str] = {}
    for what, p in places:
        if p is not None and os.path.exists(p):  # False too where this user may not look
            out.setdefault(os.path.realpath(p), what)
    return tuple((what, path) for path, what in out.items())


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _tmp_folders(paths: Sequence[str]) -> list[str]:
    """The folders of /tmp the environment lives in (its interpreter, the working directory,
    VIRTUAL_ENV, PYTHONPATH): bound back, read-only, into the sandbox's private /tmp."""
    out: list[str] = []
    for p in paths:
        for q in {os.path.abspath(p), os.path.realpath(p)} if p else ():
            if _under(q, SANDBOX_TMP) and q != SANDBOX_TMP:
                top = os.path.join(SANDBOX_TMP, os.path.relpath(q, SANDBOX_TMP).split(os.sep)[0])
                if top not in out and os.path.exists(top):
                    out.append(top)
    return out


def _gpu_devices() -> list[str]:
    import glob

    return sorted(p for pattern in GPU_DEVICES for p in glob.glob(os.path.join("/dev", pattern)))


def probe_env(base: Mapping[str, str]) -> dict[str, str]:
    """The runner's environment without its own IMAGEGATE_* variables and a signer's token."""
    return {k: v for k, v in base.items() if not k.startswith(RUNNER_PREFIX) and k not in SIGNER_SECRETS}


class LocalDriver(DriverBase):
    name = "local"
    # Controllers here share a user and a process table: one at a time, so that no stage's code
    # runs beside another controller's stages.
    isolated_runs = False
    has_image = False  # this environment is under test, whatever image it may be in

    def __init__(
        self,
        python: str | None = None,
        gpus: GpuRequest | None = None,
        isolation: KeyIsolation | None = None,
        model: Path | None = None,
    ) -> None:
        self.python = python
        self.model = model  # --model: used where it is (bound in when it lives under /tmp)
        self.gpus = gpus
        # Unsigned by default: sandboxed where bubblewrap runs, as it is when signing.
        self.isolation = isolation or key_isolation(signing=False)
        self._fingerprint: JsonObject | None = None

    def gpu_env(self) -> dict[str, str]:
        """The probes' environment: the runner's, without its IMAGEGATE_* variables; this host's
        GPUs hidden unless --gpus asks for them; in the sandbox, TMPDIR its private /tmp."""
        env = probe_env(os.environ)
        env = {k: v for k, v in env.items() if k not in HIDING_ENV or v not in ("", "void", "none")}
        if self.isolation.bwrap is not None:
            env["TMPDIR"] = SANDBOX_TMP  # the host's TMPDIR is read-only there
        if self.gpus is None:
            return {**env, **HIDING_ENV}
        if (cvd := self.gpus.cuda_visible_devices) is not None:
            env["CUDA_VISIBLE_DEVICES"] = cvd
        return env

    def sandboxed(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        bundle: Path | None = None,
        seccomp_fd: int | None = None,
    ) -> list[str]:
        """`command` as it runs: under bubblewrap where it can, else as it is."""
        if self.isolation.bwrap is None:
            return list(command)
        return self.isolation.argv(
            command,
            env,
            gpus=self.gpus is not None,
            bundle=bundle,
            seccomp_fd=seccomp_fd,
            also=[str(self.model)] if self.model else [],
        )

    def _interpreter(self, interpreters: Sequence[str]) -> tuple[str | None, list[str]]:
        # "This environment" is the python a user would type here: an activated venv's, else the
        # PATH's; imagegate's own interpreter only as the last resort.
        candidates = [self.python] if self.python else [*interpreters, sys.executable]
        tried: list[str] = []
        for cand in candidates:
            tried.append(cand)
            exe = cand if os.path.sep in cand and os.access(cand, os.X_OK) else shutil.which(cand)
            if exe:
                return exe, tried
        return None, tried

    def fingerprint(self) -> JsonObject | None:
        """This environment's identity for `imagegate complete --here`: the interpreter and its
        installed distributions as the probes see them; the sha256 of that is compared."""
        if self._fingerprint is None:
            exe, _ = self._interpreter(DEFAULT_INTERPRETERS)
            self._fingerprint = {}
            if exe:
                env = self.gpu_env()
                with self.isolation.seccomp_fd() as fd:
                    argv = self.sandboxed([os.path.abspath(exe), "-c", _FINGERPRINT_CODE], env, seccomp_fd=fd)
                    self._fingerprint = environment_fingerprint(argv, env, () if fd is None else (fd,))
        return self._fingerprint or None

    def environment_fingerprint(self) -> str | None:
        sha = (self.fingerprint() or {}).get("sha256")
        return sha if isinstance(sha, str) else None

    def environment(self) -> JsonObject:
        return {
            "fingerprint": self.fingerprint(),
            "driver": self.name,
            "engine": None,
            "host": platform.node(),
            "os": platform.system().lower(),
            "arch": platform.machine(),
            "gpus_requested": self.gpus.spec if self.gpus else None,
            "key_isolation": self.isolation.facts(),
        }

    def resolve(self, reference: str) -> ImageFacts:
        # No image: the environment itself is under test. The reference (e.g. the Pod's image)
        # is recorded as given; its digest comes from elsewhere (pod collect, --expect-config).
        return ImageFacts(reference=reference, config_digest=None)

    def run_bundle(self, req: BundleRequest) -> BundleRun:
        exe, tried = self._interpreter(req.interpreters)
        if not exe:
            if self.python:
                raise UsageError(
                    f"--python {self.python}: not an executable", hint="give a python interpreter"
                )
            return BundleRun(
                b"", b"", None, tried=tried, error=f"no python interpreter (tried {', '.join(tried)})"
            )
        with tempfile.TemporaryDirectory(prefix="imagegate-local-") as tmp:
            path = Path(tmp) / "imagegate.pyz"
            path.write_bytes(req.bundle)
            # The key through a pipe the controller alone inherits (bwrap passes inherited
            # descriptors on); -I -S: the controller never runs this environment's site hooks.
            key_r, key_w = os.pipe()
            try:
                os.write(key_w, req.event_key.hex().encode() + b"\n")
            finally:
                os.close(key_w)
            env = {**self.gpu_env(), KEY_FD_ENV: str(key_r), STAGES_ENV: ",".join(req.stages or ())}
            sandboxed = self.isolation.bwrap is not None
            command = [os.path.abspath(exe), "-I", "-S", BUNDLE_IN_SANDBOX if sandboxed else str(path)]
            try:
                with self.isolation.seccomp_fd() as fd:
                    run = _run(
                        self.sandboxed(command, env, bundle=path, seccomp_fd=fd),
                        req.deadline_s,
                        interpreter=exe,
                        tried=tried,
                        env=env,
                        on_stdout=req.on_stdout,
                        pass_fds=(key_r,) if fd is None else (key_r, fd),
                        cancel=req.cancel,
                    )
            finally:
                os.close(key_r)
        if self.gpus is not None:  # this host's GPU nodes, bound into the sandbox (or left visible)
            run.gpus = nodes_grant("host_devices", ((p, p) for p in _gpu_devices()))
        return run


DEFAULT_INTERPRETERS = ("python3", "python")
_FINGERPRINT_CODE = (
    "import json,sys\n"
    "import importlib.metadata as m\n"
    "d=sorted({(str(x.metadata['Name'] or '').lower().replace('_','-').replace('.','-'),x.version)"
    " for x in m.distributions()})\n"
    "print(json.dumps({'python':sys.version,'executable':sys.executable,"
    "'distributions':['%s==%s'%p for p in d]}))\n"
)


def environment_fingerprint(
    argv: list[str], env: dict[str, str], pass_fds: tuple[int, ...] = ()
) -> JsonObject:
    """sha256 over the interpreter's version, path and every distribution it can import (name
    and version), as canonical JSON, from `argv` (the interpreter running _FINGERPRINT_CODE, in
    the sandbox: its site hooks run); {} when the interpreter cannot say."""
    try:
        for attempt in range(bwrap.MOUNT_RACE_TRIES):
            bwrap.mount_race_pause(attempt)
            done = subprocess.run(
                argv, env=env, capture_output=True, timeout=120, check=False, pass_fds=pass_fds
            )
            if not bwrap.mount_raced(done.returncode, done.stdout, done.stderr):
                break
        facts = json.loads(done.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return {}
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return {
        "sha256": digest,
        "python": str(facts.get("python", "")).split()[0],
        "executable": facts.get("executable"),
        "distributions": len(facts.get("distributions") or []),
    }


def _run(
    argv: list[str],
    deadline_s: float,
    *,
    interpreter: str,
    tried: list[str],
    env: dict[str, str],
    on_stdout: OnOutput | None = None,
    pass_fds: tuple[int, ...] = (),
    cancel: threading.Event | None = None,
) -> BundleRun:
    start = time.monotonic()
    for attempt in range(bwrap.MOUNT_RACE_TRIES):
        bwrap.mount_race_pause(attempt)
        done = run_group(
            argv,
            deadline_s=max(0.0, deadline_s - (time.monotonic() - start)),
            env=env,
            pass_fds=pass_fds,
            on_stdout=on_stdout,
            cancel=cancel,
        )
        if not bwrap.mount_raced(done.exit_code, done.stdout, done.stderr):
            break
    return BundleRun(
        done.stdout,
        done.stderr,
        done.exit_code,
        timed_out=done.timed_out,
        interpreter=interpreter,
        tried=tried,
        stdout_total=done.stdout_total,
        stderr_total=done.stderr_total,
        error="overall deadline reached; process group killed" if done.timed_out else None,
        facts={"wall_s": done.wall_s},
    )
