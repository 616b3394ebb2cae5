"""The seccomp filter's rules as the kernel applies them: every call of the deny list fails with
EPERM on the native architecture and on its 32-bit companion, x32 calls get ENOSYS, and what is
not on the list passes the filter.

No sandbox and no engine: a child process on the host loads the filter exactly as bwrap does (the
BPF program `seccomp.program()` gives, through prctl) and then, on top of it, a second filter
that sends every call this test makes to SECCOMP_RET_TRACE. With no tracer attached that answers
ENOSYS without running the call, and the kernel takes the strictest answer of the filters
stacked: EPERM where ours denies the call, ENOSYS where it lets it through. So each call of the
list is asked of the kernel for real, and none of them runs (mount, reboot, ptrace ... never take
effect, whatever the filter says)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from imagegate.drivers import seccomp

# Calls the deny list leaves alone, on both architectures: they must pass our filter (and reach
# the tracing one).
ALLOWED = ("getppid", "uname", "sched_yield", "chroot", "sethostname")

CHILD = textwrap.dedent(
    """
    import ctypes, errno, json, mmap, sys
    from imagegate.drivers import seccomp

    names, native, compat = json.loads(sys.argv[1])
    lib = seccomp._lib()
    lib.seccomp_syscall_resolve_name_arch.argtypes = [ctypes.c_uint32, ctypes.c_char_p]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]

    # Our filter, loaded as bwrap loads it (no new privileges, then the program).
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    data = seccomp.program()[0]
    buf = ctypes.create_string_buffer(data, len(data))
    prog = Prog(len(data) // 8, ctypes.cast(buf, ctypes.c_void_p))
    assert libc.prctl(38, 1, None, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    if libc.prctl(22, 2, ctypes.cast(ctypes.byref(prog), ctypes.c_void_p), 0, 0) != 0:  # SECCOMP_MODE_FILTER
        sys.exit("the filter was refused: " + errno.errorcode[ctypes.get_errno()])

    # The tracing filter above it: each name asked about, on both architectures; anything else
    # (this process's own work, x32 calls) allowed.
    ctx = lib.seccomp_init(0x7FFF0000)
    assert lib.seccomp_attr_set(ctx, 2, 0x7FFF0000) == 0  # bad architecture: allow
    assert lib.seccomp_arch_add(ctx, compat) == 0
    for name in names:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        assert lib.seccomp_rule_add_array(ctx, 0x7FF00000, nr, 0, None) == 0, name  # SCMP_ACT_TRACE
    assert lib.seccomp_load(ctx) == 0

    def answer(rc):
        return "ok" if rc >= 0 else errno.errorcode[-rc]

    def native_call(nr):
        ctypes.set_errno(0)
        rc = libc.syscall(ctypes.c_long(nr), 0, 0, 0, 0, 0, 0)
        return answer(rc if rc >= 0 else -ctypes.get_errno())

    # The 32-bit ABI from this 64-bit process: `int 0x80` (the kernel sees the i386 architecture).
    code = bytes.fromhex("53" "89f8" "31db" "31c9" "31d2" "31f6" "31ff" "cd80" "5b" "c3")
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    int80 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))

    seen = {"native": {}, "compat": {}}
    for name in names:
        for arch, token, call in (("native", native, native_call), ("compat", compat, lambda nr: answer(int80(nr)))):
            nr = lib.seccomp_syscall_resolve_name_arch(token, name.encode())
            if nr >= 0:  # a negative number: the call does not exist on that architecture
                seen[arch][name] = call(nr)
    seen["x32_getpid"] = native_call(0x40000000 | 39)
    print(json.dumps(seen))
    """
)


@pytest.fixture(scope="module")
def kernel_answers() -> dict:  # type: ignore[type-arg]
    if platform.machine() != "x86_64":
        pytest.skip("the 32-bit calls are made with `int 0x80`, x86_64 only")
    native, (_, compat) = seccomp.ARCHES["x86_64"]
    arg = json.dumps([[*seccomp.DENIED, *ALLOWED], native, compat])
    done = subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_every_call_of_the_list_is_denied_with_eperm_on_both_architectures(kernel_answers: dict) -> None:  # type: ignore[type-arg]
    for arch in ("native", "compat"):
        seen = kernel_answers[arch]
        denied = {name: seen[name] for name in seccomp.DENIED if name in seen}
        assert denied and set(denied.values()) == {"EPERM"}, (arch, denied)
    # The 32-bit-only calls (vm86, stime, umount ...) are on the compat list, not missing from it.
    assert {"vm86", "vm86old", "stime", "umount"} <= set(kernel_answers["compat"])
    assert len(kernel_answers["compat"]) > 45 and len(kernel_answers["native"]) > 45


def test_calls_not_on_the_list_pass_the_filter_and_x32_calls_get_enosys(kernel_answers: dict) -> None:  # type: ignore[type-arg]
    for arch in ("native", "compat"):
        # ENOSYS from the tracing filter above ours: ours let the call through.
        assert {kernel_answers[arch][name] for name in ALLOWED} == {"ENOSYS"}, kernel_answers[arch]
    # x32 is not a companion: the bad-architecture action answers, and the process lives on.
    assert kernel_answers["x32_getpid"] == "ENOSYS"


def test_the_recorded_facts_name_what_the_filter_does() -> None:
    facts = seccomp.facts()
    assert facts["seccomp"] is True and facts["action"] == "EPERM"
    assert facts["denied"] == list(seccomp.DENIED)
    if platform.machine() == "x86_64":
        assert facts["arches"] == ["x86_64", "x86"] and facts["x32"] == "ENOSYS"
    data, same = seccomp.program()
    assert same == facts and len(data) % 8 == 0
    assert facts["bpf_sha256"] == hashlib.sha256(data).hexdigest()
    with seccomp.program_fd() as fd:
        assert os.read(fd, len(data) + 1) == data


def test_a_call_this_libseccomp_does_not_know_is_left_out_and_the_rest_still_denied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An older libseccomp knows fewer names (2.4 has no mount_setattr): the list goes on past it.
    monkeypatch.setattr(seccomp, "DENIED", ("acct", "no_such_call_anywhere", "ptrace", "mount"))
    assert seccomp._compile()[1]["denied"] == ["acct", "ptrace", "mount"]


# The architecture is the one thing here that cannot be another machine's: platform.machine is
# made to answer as an aarch64 or a riscv64 host would (a stand-in for those machines; libseccomp
# compiles a filter for any architecture it knows, wherever it runs).
def test_on_aarch64_the_companion_is_arm_and_there_is_no_x32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    facts = seccomp._compile()[1]
    assert facts["arches"] == ["aarch64", "arm"] and facts["x32"] is None


def test_an_architecture_without_a_filter_is_named_and_recorded_as_no_seccomp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    monkeypatch.setattr(seccomp, "_made", {})
    for _ in range(2):  # the second time from what the first one found
        with pytest.raises(
            seccomp.SeccompUnavailable, match=r"no seccomp filter for this architecture \(riscv64\)"
        ):
            seccomp.program()
    assert seccomp.facts() == {
        "seccomp": False,
        "reason": "no seccomp filter for this architecture (riscv64)",
    }
