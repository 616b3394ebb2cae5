"""The bubblewrap sandbox of the rootfs driver, on a real image's root: what a command inside can
and cannot do, whose identity it has, and that nothing it starts outlives the run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from imagegate.drivers import bwrap, seccomp
from imagegate.drivers.rootfs import PreparedRoot
from imagegate.errors import UsageError
from tests.helpers import default_signals

REPO = Path(__file__).resolve().parents[2]

FACTS = textwrap.dedent(
    """
    import json, os, socket, sys
    status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
    def tries(fn):
        try:
            fn()
            return "ok"
        except OSError as e:
            return e.__class__.__name__ + ":" + str(e.errno)
    def connect():
        s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3)
        s.close()
    print(json.dumps({
        "uid": os.getuid(), "gid": os.getgid(), "cwd": os.getcwd(),
        "interfaces": [n for _, n in socket.if_nameindex()],
        "no_new_privs": status["NoNewPrivs"].strip(),
        "cap_eff": status["CapEff"].strip(), "cap_bnd": status["CapBnd"].strip(),
        "write_root": tries(lambda: open("/etc/imagegate-was-here", "w")),
        "write_tmp": tries(lambda: open("/tmp/ok", "w").close()),
        "connect_host": tries(connect),
        "dev": sorted(os.listdir("/dev")),
        "env": dict(os.environ), "hostname": socket.gethostname(), "pid": os.getpid(),
        "nofile": __import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE),
    }))
    """
)

# Leaves a daemon (double fork, new session) that sleeps with MARK in its command line, then exits.
DAEMON = textwrap.dedent(
    """
    import os, sys, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", sys.argv[1]])
        os._exit(0)
    os.wait()
    print("daemon started", flush=True)
    time.sleep(float(sys.argv[2]))
    """
)


def alive_with(mark: str) -> list[int]:
    """Host processes whose command line holds `mark`."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if mark.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                pass
    return found


@pytest.fixture(scope="module")
def python_root(exported: Callable[[str], PreparedRoot]) -> PreparedRoot:
    return exported("python")


def run_in(
    root: Path, config: bwrap.ImageConfig, code: str, *args: str, deadline: float = 60, **kw: object
) -> bwrap.Completed:
    """`code` in the sandbox as the rootfs driver runs it: its seccomp filter applied."""
    with seccomp.program_fd() as fd:
        argv, _ = bwrap.Sandbox(root, config).argv(bwrap.check_host(), ["python3", "-c", code, *args], fd)
        return bwrap.run(argv, stdin=b"", deadline_s=deadline, pass_fds=(fd,), **kw)  # type: ignore[arg-type]


# Each call succeeds in a plain user namespace without the filter (unshare(0), the session
# keyring's id, a user key, PTRACE_TRACEME); mount fails there too, without capabilities.
DENIED_CALLS = textwrap.dedent(
    """
    import ctypes, errno, json, os, platform, subprocess, threading
    NR = {
        "x86_64": {"keyctl": 250, "add_key": 248, "ptrace": 101, "unshare": 272, "mount": 165},
        "aarch64": {"keyctl": 219, "add_key": 217, "ptrace": 117, "unshare": 97, "mount": 40},
    }[platform.machine()]
    libc = ctypes.CDLL(None, use_errno=True)
    def call(name, *args):
        ctypes.set_errno(0)
        rc = libc.syscall(NR[name], *args)
        return "ok" if rc >= 0 else errno.errorcode[ctypes.get_errno()]
    out = {
        "keyctl": call("keyctl", 0, -3, 1),
        "add_key": call("add_key", b"user", b"imagegate", b"x", 1, -2),
        "ptrace": call("ptrace", 0, 0, 0, 0),
        "unshare": call("unshare", 0),
        "mount": call("mount", b"none", b"/tmp", b"tmpfs", 0, 0),
    }
    # Ordinary work still runs: a thread, a subprocess, imports.
    t = threading.Thread(target=lambda: out.setdefault("thread", "ok")); t.start(); t.join()
    out["subprocess"] = subprocess.run(["python3", "-c", "import json, ssl, sqlite3"]).returncode
    print(json.dumps(out))
    """
)


def test_the_seccomp_filter_denies_with_eperm(python_root: PreparedRoot) -> None:
    done = run_in(python_root.path, bwrap.ImageConfig(("PATH=/usr/local/bin:/usr/bin:/bin",)), DENIED_CALLS)
    assert done.exit_code == 0, done.stderr
    seen = json.loads(done.stdout)
    for name in ("keyctl", "add_key", "ptrace", "unshare", "mount"):
        assert seen[name] == "EPERM", seen
    assert seen["thread"] == "ok" and seen["subprocess"] == 0, seen
    facts = seccomp.facts()
    assert facts["seccomp"] is True and {"keyctl", "ptrace", "mount", "unshare", "bpf"} <= set(
        facts["denied"]
    )
    assert len(facts["bpf_sha256"]) == 64


def facts(root: Path, config: bwrap.ImageConfig, port: int = 9) -> dict:  # type: ignore[type-arg]
    done = run_in(root, config, FACTS, str(port))
    assert done.exit_code == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_no_network_no_privileges_read_only_root(python_root: PreparedRoot) -> None:
    # A server on the host's loopback: the sandbox's own loopback is another one.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        os.environ["IMAGEGATE_HOST_SECRET"] = "from-the-host"
        try:
            seen = facts(
                python_root.path, bwrap.ImageConfig(("PATH=/usr/bin:/bin",)), server.getsockname()[1]
            )
        finally:
            del os.environ["IMAGEGATE_HOST_SECRET"]
    assert seen["interfaces"] == ["lo"]
    assert seen["connect_host"].startswith("ConnectionRefusedError")
    assert seen["no_new_privs"] == "1"
    assert seen["cap_eff"] == seen["cap_bnd"] == "0000000000000000"
    assert seen["write_root"] == "OSError:30"  # EROFS
    assert seen["write_tmp"] == "ok"
    assert "IMAGEGATE_HOST_SECRET" not in seen["env"]  # the host's environment never goes in
    assert seen["hostname"] == "imagegate"
    assert seen["pid"] < 10  # its own pid namespace
    assert seen["nofile"] == [4096, 4096]
    # a minimal /dev: no GPU, no disk, nothing of the host's
    assert not [d for d in seen["dev"] if d.startswith(("nvidia", "dri", "sd", "vd", "kvm"))]
    assert set(seen["dev"]) <= {"null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm",
                                "fd", "stdin", "stdout", "stderr", "core"}  # fmt: skip


@pytest.fixture
def own_root(python_root: PreparedRoot) -> Iterator[Path]:
    """A copy of the root (hard links: instant) whose /etc this test may change; readable by
    every user, for the unprivileged runs."""
    d = Path(tempfile.mkdtemp(prefix="imagegate-root-"))
    os.chmod(d, 0o755)
    subprocess.run(["cp", "-al", f"{python_root.path}/.", str(d / "root")], check=True)
    yield d / "root"
    shutil.rmtree(d, ignore_errors=True)


def replace(path: Path, text: str) -> None:
    path.unlink()  # a hard link shared with the session's root: never written through
    path.write_text(text)


def test_user_env_and_workdir_come_from_the_image(own_root: Path) -> None:
    # A user and a group this host does not have: found in the root's own /etc only.
    name = "ig" + uuid.uuid4().hex[:8]
    replace(
        own_root / "etc/passwd", (own_root / "etc/passwd").read_text() + f"{name}:x:4242:4343::/srv:/bin/sh\n"
    )
    replace(own_root / "etc/group", (own_root / "etc/group").read_text() + f"{name}grp:x:4444:\n")
    config = bwrap.ImageConfig(("PATH=/usr/bin:/bin", "FOO=bar=baz"), "/usr/lib", name)
    seen = facts(own_root, config)
    assert (seen["uid"], seen["gid"]) == (4242, 4343)
    assert seen["env"]["HOME"] == "/srv" and seen["env"]["FOO"] == "bar=baz"
    assert seen["cwd"] == "/usr/lib"
    seen = facts(own_root, bwrap.ImageConfig(("PATH=/usr/bin:/bin",), "", f"{name}:{name}grp"))
    assert (seen["uid"], seen["gid"]) == (4242, 4444)
    seen = facts(own_root, bwrap.ImageConfig(("PATH=/usr/bin:/bin",), "", "1000:1001"))
    assert (seen["uid"], seen["gid"]) == (1000, 1001)
    with pytest.raises(UsageError, match=r"no user 'nosuchuser' in the image's /etc/passwd"):
        bwrap.resolve_user(own_root, "nosuchuser")


def test_a_planted_etc_symlink_is_read_inside_the_root(tmp_path: Path) -> None:
    # etc -> /etc in the image: the root's own /etc is meant (as a chroot sees it), never the host's.
    (tmp_path / "real/etc").mkdir(parents=True)
    (tmp_path / "real/etc/passwd").write_text("root:x:0:0::/root:/bin/sh\nhostile:x:7:8::/h:/bin/sh\n")
    (tmp_path / "etc").symlink_to("/real/etc")
    assert bwrap.resolve_user(tmp_path, "hostile") == bwrap.Identity(7, 8, "/h")
    (tmp_path / "real/etc/passwd").unlink()
    (tmp_path / "real/etc/passwd").symlink_to("../../../../../../../etc/passwd")  # .. stops at the root
    with pytest.raises(UsageError, match=r"no user 'root' in the image's /etc/passwd"):
        bwrap.resolve_user(tmp_path, "root")


def test_a_daemon_left_by_the_command_is_gone_after_the_run(python_root: PreparedRoot) -> None:
    mark = f"imagegate-mark-{uuid.uuid4().hex}"
    done = run_in(python_root.path, bwrap.ImageConfig(("PATH=/usr/bin:/bin",)), DAEMON, mark, "0")
    assert done.exit_code == 0 and b"daemon started" in done.stdout, done.stderr
    assert alive_with(mark) == []


def test_the_deadline_kills_every_process(python_root: PreparedRoot) -> None:
    mark = f"imagegate-mark-{uuid.uuid4().hex}"
    t0 = time.monotonic()
    done = run_in(
        python_root.path, bwrap.ImageConfig(("PATH=/usr/bin:/bin",)), DAEMON, mark, "600", deadline=3
    )
    assert done.timed_out and done.exit_code is None
    assert b"daemon started" in done.stdout
    assert time.monotonic() - t0 < 20
    assert alive_with(mark) == []


def test_cancel_kills_every_process(python_root: PreparedRoot) -> None:
    mark = f"imagegate-mark-{uuid.uuid4().hex}"
    cancel = threading.Event()
    threading.Timer(2, cancel.set).start()
    done = run_in(
        python_root.path, bwrap.ImageConfig(("PATH=/usr/bin:/bin",)), DAEMON, mark, "600", cancel=cancel
    )
    assert done.timed_out and b"daemon started" in done.stdout
    assert alive_with(mark) == []


RUNNER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from imagegate.drivers import bwrap, seccomp
    argv, _ = bwrap.Sandbox(Path(sys.argv[1]), bwrap.ImageConfig(("PATH=/usr/bin:/bin",))).argv(
        bwrap.check_host(), ["python3", "-c", sys.argv[2], sys.argv[3], "600"])
    print("running", flush=True)
    bwrap.run(argv, stdin=b"", deadline_s=600, on_stdout=lambda b: print(b.decode(), end="", flush=True))
    """
)


@pytest.mark.signals
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "runner-killed"])
def test_an_interrupted_or_killed_runner_leaves_nothing(own_root: Path, how: signal.Signals) -> None:
    mark = f"imagegate-mark-{uuid.uuid4().hex}"
    p = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(own_root), DAEMON, mark],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_signals,
    )
    assert p.stdout is not None
    for line in p.stdout:
        if "daemon started" in line:
            break
    assert alive_with(mark), "the daemon should be running now"
    p.send_signal(how)
    p.wait(timeout=60)
    deadline = time.monotonic() + 10  # SIGKILL of the runner: the kernel takes the rest, at once
    while alive_with(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive_with(mark) == []


def test_unprivileged_user_gets_the_same_sandbox(own_root: Path) -> None:
    # As nobody, where this kernel allows user namespaces (it does here; see the next test).
    code = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(REPO / "src")!r})
        from pathlib import Path
        from imagegate.drivers import bwrap, seccomp
        argv, _ = bwrap.Sandbox(Path(sys.argv[1]), bwrap.ImageConfig(("PATH=/usr/bin:/bin",), "/", "nobody")).argv(
            bwrap.check_host(), ["python3", "-c", sys.argv[2], "9"])
        done = bwrap.run(argv, stdin=b"", deadline_s=60)
        sys.stdout.buffer.write(done.stdout); sys.stderr.buffer.write(done.stderr)
        """
    )
    p = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-I", "-c", code,
         str(own_root), FACTS],
        capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    seen = json.loads(p.stdout)
    assert seen["uid"] == 65534 and seen["interfaces"] == ["lo"]
    assert seen["no_new_privs"] == "1" and seen["cap_eff"] == "0000000000000000"
    assert seen["write_root"].startswith("OSError:")


def test_no_user_namespaces_names_the_sysctl(tmp_path: Path) -> None:
    # user.max_user_namespaces is per user namespace: set to 0 in a throwaway one, it refuses the
    # sandbox's namespaces there exactly as a host with the sysctl at 0 does.
    code = (
        f"import sys; sys.path.insert(0, {str(REPO / 'src')!r})\n"
        "from imagegate.drivers import bwrap\n"
        "try:\n bwrap.check_host()\nexcept bwrap.SandboxUnavailable as e:\n print(e); print(e.hint)\n"
    )
    script = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$0" -I -c "$1"'
    p = subprocess.run(
        ["unshare", "--user", "--map-root-user", "sh", "-c", script, sys.executable, code],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "user namespaces are switched off (user.max_user_namespaces = 0" in p.stdout
    assert "sysctl -w user.max_user_namespaces=15000" in p.stdout
    assert "--driver docker" in p.stdout


SCRATCH_CHECK = (
    "grep NoNewPrivs /proc/self/status && ls /dev/null && echo x > /tmp/x && cat /tmp/x"
    " && ls -d /sys && ! touch /made-here 2>/dev/null && echo ok"
)


def assert_engine_mount_points(root: Path) -> None:
    """A command in the sandbox on `root` (busybox at /bin) finds /proc, /dev, a writable /tmp and
    /sys, cannot write to /, and nothing is written into `root`."""
    before = sorted(p.name for p in root.iterdir())
    with seccomp.program_fd() as fd:
        argv, _ = bwrap.Sandbox(root, bwrap.ImageConfig.from_config({})).argv(
            bwrap.check_host(), ["/bin/busybox", "sh", "-c", SCRATCH_CHECK], fd
        )
        done = bwrap.run(argv, stdin=b"", deadline_s=60, pass_fds=(fd,))
    assert done.exit_code == 0, done.stderr
    assert done.stdout.decode().splitlines()[-2:] == ["/sys", "ok"], done.stdout
    assert b"NoNewPrivs:\t1" in done.stdout
    assert sorted(p.name for p in root.iterdir()) == before


def test_an_image_built_from_scratch_gets_the_mount_points_an_engine_gives(tmp_path: Path) -> None:
    # FROM scratch + busybox: no /proc, /dev, /sys or /tmp; bwrap alone cannot make them in a
    # read-only root ("Can't mkdir /proc").
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    shutil.copy2("/bin/busybox", root / "bin" / "busybox")
    (root / "bin" / "sh").symlink_to("busybox")
    assert_engine_mount_points(root)
    # A /proc that is a link (a hostile image's) gets the sandbox's own too.
    (root / "proc").symlink_to("/etc")
    assert_engine_mount_points(root)


def test_a_root_with_more_top_level_entries_than_an_image_has_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    for n in range(bwrap.MAX_TOP_ENTRIES + 1):
        (root / f"e{n}").touch()
    with pytest.raises(UsageError, match="more than 4096 top-level entries"):
        bwrap.Sandbox(root, bwrap.ImageConfig.from_config({})).argv(bwrap.check_host(), ["true"])
