"""A sandbox without an engine: a command inside an unpacked image root, through bubblewrap:
read-only root, every namespace new, no capability, a seccomp filter, limits, killed on every
path. What each run gets and why: docs/how-it-works.md, "The rootfs sandbox, field by field"."""

from __future__ import annotations

import errno
import itertools
import os
import resource
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from imagegate._support.jsontypes import JsonMapping, JsonObject
from imagegate.drivers import cdi, seccomp
from imagegate.drivers.interface import OnOutput
from imagegate.drivers.process import Completed, run_group
from imagegate.errors import EngineError, UsageError

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # as the engines set it
SANDBOX_HOSTNAME = "imagegate"


INSTALL_HINT = "install it: apt-get install bubblewrap (dnf install bubblewrap, apk add bubblewrap)"


class SandboxUnavailable(EngineError):
    """bubblewrap is missing, or this host does not let it make the namespaces it needs; `cause`
    says which, without naming the driver (`run --here` words its own refusal around it)."""

    def __init__(self, message: str, *, hint: str | None = None, cause: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.cause = cause or message


# -- the image config's User, looked up in the root ---------------------------------------------


@dataclass(frozen=True)
class ImageConfig:
    """What of the image config the sandbox applies (the OCI config's `config` object)."""

    env: tuple[str, ...] = ()
    working_dir: str = ""
    user: str = ""

    @classmethod
    def from_config(cls, config: JsonMapping | None) -> ImageConfig:
        c = config or {}
        env = c.get("Env") or []
        return cls(
            env=tuple(str(e) for e in env) if isinstance(env, list) else (),
            working_dir=str(c.get("WorkingDir") or ""),
            user=str(c.get("User") or ""),
        )


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    home: str | None  # from the root's /etc/passwd, where the user is listed there


MAX_LINKS = 40  # as the kernel's own limit on symlinks followed in one lookup


def read_in_root(root: Path, path: str, limit: int = 1 << 20) -> bytes | None:
    """A file of the root read as the sandbox would see it: every symlink is resolved inside the
    root (an `etc -> /etc` planted by the image points at the root's etc, never the host's), no
    component is followed out of it. None when absent or not a regular file."""
    parts = [p for p in path.split("/") if p and p != "."]
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    stack: list[int] = []  # the folders walked down, to go up on ".."
    links = 0
    try:
        while parts:
            name = parts.pop(0)
            if name == "..":
                if stack:
                    os.close(fd)
                    fd = stack.pop()
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                return None
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_LINKS:
                    return None
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    while stack:
                        os.close(fd)
                        fd = stack.pop()
                parts = [p for p in target.split("/") if p and p != "."] + parts
                continue
            if parts:
                if not stat.S_ISDIR(st.st_mode):
                    return None
                stack.append(fd)
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                continue
            if not stat.S_ISREG(st.st_mode):
                return None
            sub = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
            with os.fdopen(sub, "rb") as f:
                return f.read(limit)
        return None
    finally:
        os.close(fd)
        for d in stack:
            os.close(d)


def _table(root: Path, path: str) -> list[list[str]]:
    data = read_in_root(root, path) or b""
    rows = []
    for line in data.decode("utf-8", "replace").splitlines():
        if line.strip() and not line.startswith("#"):
            rows.append(line.split(":"))
    return rows


def resolve_user(root: Path, user: str) -> Identity:
    """`User` as the engines read it: NAME, UID, NAME:GROUP, UID:GID (empty: root). Names come
    from the root's /etc/passwd and /etc/group; a name that is not there is the image's error."""
    name, _, group = user.partition(":")
    name = name or "0"
    passwd = _table(root, "/etc/passwd")
    entry = None
    if name.isdigit():
        uid = int(name)
        entry = next((r for r in passwd if len(r) >= 4 and r[2] == name), None)
    else:
        entry = next((r for r in passwd if len(r) >= 4 and r[0] == name), None)
        if entry is None or not entry[2].isdigit():
            raise UsageError(
                f"the image's User {user!r}: no user {name!r} in the image's /etc/passwd",
                hint="fix the image's USER, or give it a numeric uid",
            )
        uid = int(entry[2])
    gid = int(entry[3]) if entry is not None and entry[3].isdigit() else 0
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            found = next((r for r in _table(root, "/etc/group") if len(r) >= 3 and r[0] == group), None)
            if found is None or not found[2].isdigit():
                raise UsageError(
                    f"the image's User {user!r}: no group {group!r} in the image's /etc/group",
                    hint="fix the image's USER, or give it a numeric gid",
                )
            gid = int(found[2])
    home = entry[5] if entry is not None and len(entry) >= 6 and entry[5] else None
    return Identity(uid, gid, home)


def sandbox_env(config: ImageConfig, ident: Identity, extra: dict[str, str]) -> dict[str, str]:
    """The image's Env as an engine would give it: PATH and HOME filled in when the image does
    not set them, HOSTNAME the sandbox's; then `extra` (GPUs hidden, TMPDIR)."""
    env: dict[str, str] = {"PATH": DEFAULT_PATH, "HOSTNAME": SANDBOX_HOSTNAME}
    env["HOME"] = ident.home or "/"
    for item in config.env:
        k, sep, v = item.partition("=")
        if sep and k:
            env[k] = v
    env.update(extra)
    return env


# -- limits -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    nofile: int = 4096  # as the engines' default ulimit
    nproc: int = 4096  # the docker driver's pids limit; counted per user (not enforced for host root)
    data_bytes: int | None = 8 << 30  # per process: heap and private writable mappings
    tmpfs_bytes: int = 1 << 30

    def prlimit_args(self) -> list[str]:
        """`prlimit` options that never raise a limit above what this process has (raising needs
        a privilege an unprivileged user lacks)."""

        def lowered(res: int, want: int) -> str:
            _soft, hard = resource.getrlimit(res)
            v = want if hard == resource.RLIM_INFINITY else min(want, hard)
            return f"{v}:{v}"

        args = [
            f"--nofile={lowered(resource.RLIMIT_NOFILE, self.nofile)}",
            f"--nproc={lowered(resource.RLIMIT_NPROC, self.nproc)}",
            "--core=0:0",
        ]
        if self.data_bytes is not None:
            args.append(f"--data={lowered(resource.RLIMIT_DATA, self.data_bytes)}")
        return args

    def facts(self) -> JsonObject:
        return {
            "nofile": self.nofile,
            "nproc": self.nproc,
            "data_bytes_per_process": self.data_bytes,
            "tmp_bytes": self.tmpfs_bytes,
            "memory_cgroup": None,  # not applied: see the module's docstring
        }


def parse_size(text: str) -> int:
    """`8g`, `512m`, `1024k`, `1073741824` (as --memory takes them) to bytes."""
    t = text.strip().lower().removesuffix("b")
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except ValueError as e:
        raise UsageError(f"size {text!r}: not a size", hint="e.g. 8g, 512m or bytes") from e


# -- can this host sandbox at all? ---------------------------------------------------------------

SYSCTLS = {
    "kernel.unprivileged_userns_clone": "/proc/sys/kernel/unprivileged_userns_clone",
    "user.max_user_namespaces": "/proc/sys/user/max_user_namespaces",
    "kernel.apparmor_restrict_unprivileged_userns": "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
}


def _sysctl(name: str) -> str | None:
    try:
        return Path(SYSCTLS[name]).read_text().strip()
    except OSError:
        return None


# `--ro-bind / /` binds every mount under / (recursively), then remounts each read-only; a mount
# that goes away in between (a container engine's overlay of a container that just stopped)
# fails the whole setup before the command runs. Nothing ran, so it is tried again.
MOUNT_RACE_TRIES = 8


def mount_race_pause(attempt: int) -> None:
    """Before try `attempt` (the first is 0: none): a short pause, growing, so that a burst of
    mount changes (an engine stopping several containers at once) passes; 1.5 s in all."""
    if attempt:
        time.sleep(min(0.02 * 2**attempt, 0.3))


def mount_raced(exit_code: int | None, stdout: bytes, stderr: bytes) -> bool:
    """Whether bwrap gave up in its setup because a mount under / vanished while it was bound
    (its own message, nothing from the command: stdout empty)."""
    # Its errno varies with the moment the mount went (ENOENT, EINVAL): the step is what counts.
    return (
        exit_code == 1
        and not stdout
        and stderr.startswith(
            b"bwrap: Can't bind mount /oldroot/ on /newroot/: Unable to apply mount flags: remount"
        )
    )


def userns_refusal(bwrap_stderr: str) -> str:
    """Why this host refused the sandbox's namespaces, and what to do, from the sysctls that
    control it (read, never changed)."""
    said = bwrap_stderr.strip().splitlines()[-1:] or ["no message"]
    if _sysctl("user.max_user_namespaces") == "0":
        return (
            f"user namespaces are switched off (user.max_user_namespaces = 0; bwrap: {said[0]}); "
            "allow them: sysctl -w user.max_user_namespaces=15000"
        )
    if os.geteuid() != 0 and _sysctl("kernel.unprivileged_userns_clone") == "0":
        return (
            "this kernel allows user namespaces to root only "
            f"(kernel.unprivileged_userns_clone = 0; bwrap: {said[0]}); allow them: "
            "sysctl -w kernel.unprivileged_userns_clone=1, or run imagegate as root"
        )
    if os.geteuid() != 0 and _sysctl("kernel.apparmor_restrict_unprivileged_userns") == "1":
        return (
            "AppArmor restricts unprivileged user namespaces "
            f"(kernel.apparmor_restrict_unprivileged_userns = 1; bwrap: {said[0]}); allow bwrap: "
            "install the distribution's bwrap AppArmor profile (Ubuntu: the apparmor package's "
            "bwrap-userns-restrict, then `apparmor_parser -r /etc/apparmor.d/bwrap-userns-restrict`), "
            "or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"
        )
    if "mount proc" in said[0]:
        # The namespaces were made: an engine's masked /proc paths stop the sandbox's own /proc.
        return (
            f"bwrap could not mount the sandbox's /proc ({said[0]}); inside a container, the engine's "
            f"masked /proc paths forbid it: docker run {CONTAINER_FLAGS}, or a privileged container"
        )
    return (
        f"bwrap could not make the sandbox's namespaces ({said[0]}); inside a container this "
        "needs a seccomp profile that allows unshare/clone of user namespaces and an unmasked "
        f"/proc: docker run {CONTAINER_FLAGS}, or a privileged container"
    )


# What `docker run` needs for bubblewrap inside (image/Dockerfile; tests/install/test_image.py):
# the default seccomp profile refuses user namespaces, the masked /proc paths refuse a new /proc,
# and on AppArmor hosts the default profile refuses the mounts.
CONTAINER_FLAGS = (
    "--security-opt seccomp=unconfined --security-opt systempaths=unconfined "
    "--security-opt apparmor=unconfined (AppArmor hosts)"
)


_checked: dict[str, str] = {}
_check_lock = threading.Lock()


def find_bwrap() -> str:
    exe = shutil.which("bwrap")
    if exe is None:
        raise SandboxUnavailable(
            "the rootfs driver needs bubblewrap (bwrap): not found on PATH",
            hint=INSTALL_HINT,
        )
    if shutil.which("prlimit") is None:
        raise SandboxUnavailable(
            "the rootfs driver needs prlimit (util-linux) for its resource limits: not found on PATH",
            hint="install it: apt-get install util-linux",
        )
    return exe


def check_host(bwrap: str | None = None) -> str:
    """A cheap probe: an empty sandbox with every namespace. Raises SandboxUnavailable naming
    the cause (a sysctl, AppArmor, a container's seccomp profile); returns bwrap's path."""
    exe = bwrap or find_bwrap()
    with _check_lock:
        if exe in _checked:
            return _checked[exe]
        true = shutil.which("true") or "/bin/true"
        # The very namespaces a run makes (--unshare-user too: as root bwrap would skip it).
        argv = [exe, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"]
        argv += ["--ro-bind", "/", "/", "--proc", "/proc"]
        for attempt in range(MOUNT_RACE_TRIES):
            mount_race_pause(attempt)
            try:
                done = subprocess.run([*argv, true], capture_output=True, timeout=30, check=False)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise SandboxUnavailable(f"bwrap could not be started: {e}") from e
            if not mount_raced(done.returncode, done.stdout, done.stderr):
                break
        if done.returncode != 0:
            cause = userns_refusal(done.stderr.decode("utf-8", "replace"))
            raise SandboxUnavailable(
                "the rootfs driver cannot sandbox on this host: " + cause,
                hint="or use a container engine: --driver docker (or podman)",
                cause=cause,
            )
        _checked[exe] = exe
        return exe


def check_seccomp() -> JsonObject:
    """The seccomp filter's facts; SandboxUnavailable where it cannot be built (no libseccomp)."""
    try:
        return seccomp.program()[1]
    except seccomp.SeccompUnavailable as e:
        raise SandboxUnavailable(
            f"the rootfs driver's seccomp filter cannot be built: {e}",
            hint=f"{seccomp.INSTALL_HINT}; or use a container engine: --driver docker (or podman)",
            cause=str(e),
        ) from e


def version(exe: str) -> str | None:
    """bwrap's version, as `bwrap --version` says it (None when it does not)."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().removeprefix("bubblewrap ").strip() or None


# -- one sandboxed run ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Sandbox:
    root: Path
    config: ImageConfig
    limits: Limits = field(default_factory=Limits)
    extra_env: dict[str, str] = field(default_factory=dict)
    gpus: cdi.Injection | None = None  # GPUs as CDI describes them; None: no GPU device at all
    ro_binds: tuple[tuple[str, str], ...] = ()  # (host path, sandbox path) under the sandbox's /tmp

    def argv(
        self, bwrap: str, command: Sequence[str], seccomp_fd: int | None = None
    ) -> tuple[list[str], Identity]:
        """The whole command line: prlimit, bwrap and its options, then `command`; `seccomp_fd`
        (seccomp.program_fd, passed to `run`) holds the filter bwrap applies before `command`."""
        if os.path.samestat(os.stat(self.root), os.stat("/")):
            # A root that is the host's own (a planted `rootfs -> /`): its /proc, /sys and sockets
            # are bound in with it; never a sandbox.
            raise UsageError(
                f"the image root {self.root} is this host's own root folder; not run",
                hint="the root cache was tampered with: remove the entry and look at who wrote into it",
            )
        ident = resolve_user(self.root, self.config.user)
        env = sandbox_env(self.config, ident, self.extra_env)
        if self.gpus is not None:
            env.update(self.gpus.sandbox_env(env))
        argv = ["prlimit", *self.limits.prlimit_args(), "--", bwrap]
        argv += ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"]
        # The command is the namespace's pid 1, as in a container: no bwrap process inside that a
        # stage could reach through /proc/1 (it holds the event pipe); when it exits, the
        # kernel kills everything left in the namespace.
        argv += ["--as-pid-1"]
        argv += ["--cap-drop", "ALL", "--hostname", SANDBOX_HOSTNAME]
        argv += ["--uid", str(ident.uid), "--gid", str(ident.gid)]
        binds = [a for host, inside in self.ro_binds for a in ("--ro-bind", host, inside)]
        if self.gpus is None and has_mount_points(self.root):
            argv += ["--ro-bind", str(self.root), "/", "--proc", "/proc", "--dev", "/dev"]
            argv += ["--size", str(self.limits.tmpfs_bytes), "--tmpfs", "/tmp", *binds]
        else:
            argv += self._own_root(self.gpus, binds)
        argv += ["--chdir", self.config.working_dir or "/", "--clearenv"]
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        for k, v in env.items():
            argv += ["--setenv", k, v]
        return [*argv, "--", *command], ident

    def _own_root(self, gpus: cdi.Injection | None, binds: list[str]) -> list[str]:
        """The image's top-level entries bound read-only onto bwrap's own (tmpfs) root, which can
        then take the mount points the image lacks (an image built FROM scratch has no /proc,
        /dev, /sys or /tmp; an engine makes them, and so does this, never in the unpacked copy)
        and cdi.DRIVER_DIR; the root made read-only once every mount point is made."""
        top = cdi.DRIVER_DIR.strip("/")
        with os.scandir(self.root) as scan:
            entries = list(itertools.islice(scan, MAX_TOP_ENTRIES + 1))
        if len(entries) > MAX_TOP_ENTRIES:
            raise UsageError(
                f"the image root {self.root} has more than {MAX_TOP_ENTRIES} top-level entries; not run",
                hint="an image's / holds a few dozen folders; look at how this image was built",
            )
        argv: list[str] = []
        for entry in sorted(entries, key=lambda e: e.name):
            if gpus is not None and entry.name == top:
                raise UsageError(
                    f"the image has its own /{top}, where the GPU driver's files go; not run with --gpus",
                    hint="run it with --driver docker (or podman) and the NVIDIA Container Toolkit",
                )
            if entry.name in ("proc", "dev", "tmp"):
                continue  # the sandbox's own, below
            if entry.is_symlink():
                argv += ["--symlink", os.readlink(entry.path), "/" + entry.name]
            elif entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False):
                argv += ["--ro-bind", entry.path, "/" + entry.name]
        if not any(e.name == "sys" for e in entries):
            argv += ["--dir", "/sys"]  # the mount point only: no sysfs here, with or without it
        argv += ["--proc", "/proc", "--dev", "/dev", *(gpus.bwrap_args() if gpus is not None else [])]
        argv += ["--size", str(self.limits.tmpfs_bytes), "--tmpfs", "/tmp", *binds]
        return [*argv, "--remount-ro", "/"]


# Past this a root is not an image's: each entry is one bind on the sandbox's command line.
MAX_TOP_ENTRIES = 4096
# The mount points bwrap fills; a root lacking one of them as a plain folder gets them on its own root.
MOUNT_POINTS = ("proc", "dev", "tmp")


def has_mount_points(root: Path) -> bool:
    """Whether `root` has /proc, /dev and /tmp as folders (not links), where bwrap mounts its own."""
    for name in MOUNT_POINTS:
        try:
            if not stat.S_ISDIR(os.lstat(root / name).st_mode):
                return False
        except OSError:
            return False
    return True


def run(
    argv: list[str],
    *,
    stdin: bytes,
    deadline_s: float,
    on_stdout: OnOutput | None = None,
    cancel: threading.Event | None = None,
    pass_fds: tuple[int, ...] = (),
) -> Completed:
    """Run `argv` (from Sandbox.argv) in a process group of its own (prlimit execs bwrap: it
    leads the group; bwrap's pid-namespace init dies with it and the kernel kills the rest of
    the namespace); `stdin` is written to it, stdout streamed to `on_stdout`; `pass_fds`: the
    seccomp filter's descriptor."""
    env = {"PATH": os.environ.get("PATH", DEFAULT_PATH), "LC_ALL": "C"}
    return run_group(
        argv,
        deadline_s=deadline_s,
        env=env,
        stdin=stdin,
        on_stdout=on_stdout,
        cancel=cancel,
        pass_fds=pass_fds,
    )


def exec_failure(stderr: bytes) -> int | None:
    """The errno bwrap reports when the command itself could not be executed, else None."""
    text = stderr.decode("utf-8", "replace")
    for line in text.splitlines():
        if line.startswith("bwrap: execvp "):
            low = line.lower()
            if "no such file" in low:
                return errno.ENOENT
            if "exec format error" in low:
                return errno.ENOEXEC
            if "permission denied" in low:
                return errno.EACCES
            return errno.EIO
    return None
