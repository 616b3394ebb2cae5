"""The seccomp filter of the bubblewrap sandbox: a deny list modelled on the Docker engine's
default profile (the syscalls it allows only with a capability the sandbox never has, or never
at all), each denied with EPERM; everything else allowed.

Compiled by libseccomp itself (the system's libseccomp2, through ctypes): it knows every
architecture's syscall table and emits the architecture checks, so no BPF is written here. No
Python binding package: Debian's python3-seccomp cannot be imported from a venv, and pyseccomp is
a thin ctypes layer of the same kind, unmaintained since 2021. The six calls used are libseccomp's
stable API (2.4 and later).

Architectures: the native one, and its 32-bit companion with the same rules (x86 on x86_64, arm
on aarch64: 32-bit programs still run, as under Docker). The x32 ABI is not added: libseccomp's
x86_64 filter sends x32 system calls (numbers with bit 30 set) to the bad-architecture action,
which is ENOSYS here, as on a kernel built without x32 (Debian's default).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import os
import platform
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from imagegate._support.jsontypes import JsonObject, JsonValue

# The Docker engine's default profile allows none of these to a container without CAP_SYS_ADMIN
# (or CAP_SYS_MODULE, CAP_SYS_TIME, CAP_SYS_PTRACE, CAP_SYSLOG, CAP_SYS_BOOT, ...).
DENIED = (
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module",
    "delete_module", "finit_module", "fsconfig", "fsmount", "fsopen", "fspick",
    "get_kernel_syms", "init_module", "io_uring_enter", "io_uring_register", "io_uring_setup",
    "ioperm", "iopl", "kcmp", "kexec_file_load", "kexec_load", "keyctl", "lookup_dcookie",
    "mount", "mount_setattr", "move_mount", "name_to_handle_at", "nfsservctl",
    "open_by_handle_at", "open_tree", "perf_event_open", "pivot_root", "process_vm_readv",
    "process_vm_writev", "ptrace", "query_module", "quotactl", "quotactl_fd", "reboot",
    "request_key", "setns", "settimeofday", "stime", "swapoff", "swapon", "syslog", "sysfs",
    "_sysctl", "umount", "umount2", "unshare", "uselib", "userfaultfd", "ustat", "vm86",
    "vm86old",
)  # fmt: skip

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_FLTATR_ACT_BADARCH = 2
NR_SCMP_ERROR = -1
# Audit architecture tokens (linux/audit.h), as libseccomp names them.
ARCHES = {
    "x86_64": (0xC000003E, ("x86", 0x40000003)),
    "aarch64": (0xC00000B7, ("arm", 0x40000028)),
}
INSTALL_HINT = "install libseccomp: apt-get install libseccomp2 (dnf install libseccomp, apk add libseccomp)"


def act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)  # SCMP_ACT_ERRNO


class SeccompUnavailable(Exception):
    """libseccomp is missing, or this machine's architecture is not one the filter is made for."""


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]


def _lib() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as e:
        raise SeccompUnavailable(f"libseccomp could not be loaded ({e})") from e
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_arch_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p,
    ]  # fmt: skip
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_version.restype = ctypes.POINTER(_Version)
    return lib


def _check(rc: int, what: str) -> None:
    if rc < 0:
        raise SeccompUnavailable(f"libseccomp: {what} failed: {os.strerror(-rc)}")


def _compile() -> tuple[bytes, JsonObject]:
    machine = platform.machine()
    if machine not in ARCHES:
        raise SeccompUnavailable(f"no seccomp filter for this architecture ({machine})")
    _native, (compat_name, compat) = ARCHES[machine]  # libseccomp adds the native one itself
    lib = _lib()
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompUnavailable("libseccomp: seccomp_init failed")
    try:
        _check(lib.seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, act_errno(errno.ENOSYS)), "bad-arch action")
        _check(lib.seccomp_arch_add(ctx, compat), f"adding {compat_name}")
        denied: list[JsonValue] = []
        for name in DENIED:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr == NR_SCMP_ERROR:
                continue  # unknown to this libseccomp: not in the kernel's tables it knows either
            _check(lib.seccomp_rule_add_array(ctx, act_errno(errno.EPERM), nr, 0, None), f"denying {name}")
            denied.append(name)
        fd = os.memfd_create("imagegate-seccomp", os.MFD_CLOEXEC)
        try:
            _check(lib.seccomp_export_bpf(ctx, fd), "exporting the filter")
            os.lseek(fd, 0, os.SEEK_SET)
            program = b"".join(iter(lambda: os.read(fd, 65536), b""))
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)
    v = lib.seccomp_version().contents
    return program, {
        "seccomp": True,
        "action": "EPERM",
        "denied": denied,
        "arches": [machine, compat_name],
        "x32": "ENOSYS" if machine == "x86_64" else None,
        "libseccomp": f"{v.major}.{v.minor}.{v.micro}",
        "bpf_sha256": hashlib.sha256(program).hexdigest(),
    }


_made: dict[str, tuple[bytes, JsonObject] | SeccompUnavailable] = {}
_lock = threading.Lock()


def program() -> tuple[bytes, JsonObject]:
    """The compiled filter (BPF, as bwrap --seccomp reads it) and its facts, made once."""
    with _lock:
        if "filter" not in _made:
            try:
                _made["filter"] = _compile()
            except SeccompUnavailable as e:
                _made["filter"] = e
        made = _made["filter"]
    if isinstance(made, SeccompUnavailable):
        raise made
    return made


def facts() -> JsonObject:
    """What the evidence records: the filter, or why there is none."""
    try:
        return dict(program()[1])
    except SeccompUnavailable as e:
        return {"seccomp": False, "reason": str(e)}


@contextmanager
def program_fd() -> Iterator[int]:
    """A descriptor holding the filter, for one bwrap (`--seccomp FD`; it reads it to the end,
    so each run gets its own), inheritable only where passed (pass_fds)."""
    data = program()[0]
    fd = os.memfd_create("imagegate-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)
