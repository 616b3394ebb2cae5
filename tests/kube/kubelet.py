"""A real node for the cluster tests: a kubelet (tests/consumers/kubelet/go.mod: the control plane's
release, built by scripts/consumers.py `build --tool kubelet`) with a containerd of its own (the
machine's containerd 1.6 and runc, its own root, state folder and socket, the CRI plugin on), the
CNI plugins (tests/consumers/cni/go.mod) and a pause image built here from Kubernetes' own
build/pause/linux/pause.c, registered with a control plane of tests/kube/apiserver.py. Pods the
scheduler places on it really run: containerd pulls their images from the test registries named
(plain HTTP on 127.0.0.1, one hosts.toml each) and runc starts them.

The machine is shared, so the node keeps to itself: containerd and the kubelet run in a mount
namespace of their own (the overlay, netns, volume and rshared mounts they make are gone with it),
where /var/log (the kubelet's /var/log/containers links) and /var/lib/cni (the CNI result cache)
are tmpfs, and the kernel settings the kubelet would change for the whole machine
(setupKernelTunables in pkg/kubelet/cm/container_manager_linux.go: kernel.panic, vm.overcommit_memory
and the like) are files holding the values it wants; its Pods' cgroups sit under a cgroup root
named for the test; the Pods' bridge is named for the test too. Everything started is stopped and
everything made is removed at the end, whatever happens (SIGINT included): the Pods deleted
through the API so the kubelet stops them (and their network) the ordinary way, whatever is left
then killed through containerd, then by cgroup, the bridge deleted, the folder removed. (The shims'
sockets are the one thing outside it: containerd 1.6 puts them under /run/containerd/s,
runtime/v2/shim/util_unix.go, and each goes with its shim.)

Followed: the kubelet's configuration as k8s.io/kubelet v0.33.13 documents it
(config/v1beta1/types.go: failCgroupV1, cgroupDriver, cgroupRoot, podLogsDir), containerd v1.6.20's
docs/cri/config.md and docs/hosts.md, and Kubernetes' node e2e set-up
(test/e2e_node/remote/utils.go: its CNI release and bridge network)."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import itertools
import json
import os
import secrets
import shutil
import signal
import subprocess
import tarfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers import go_tools
from tests.kube.apiserver import ApiServer, stop
from tests.oci.infra import free_port

READY_S = 120.0  # containerd answers within a second and the kubelet is Ready within ~20 s here
STOP_S = 90.0  # the kubelet stops a Pod within seconds; a probe ignoring SIGTERM takes its grace
PAUSE = "imagegate.test/pause:3.10.1"  # the tag Kubernetes 1.33 builds pause.c as (build/pause/Makefile)
NODE = "localhost"  # the node's name is the Hostname address the API server dials its kubelet at
# The values setupKernelTunables sets (k8s.io/component-helpers/node/util/sysctl: its constants).
KERNEL_TUNABLES = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}
CGROUPS = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Node:
    api: ApiServer
    name: str
    folder: Path
    address: str  # containerd's socket

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """The machine's ctr against this node's containerd, in the CRI's namespace (k8s.io)."""
        return subprocess.run(
            ["ctr", "--address", self.address, "--namespace", "k8s.io", *args],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def log(self, name: str) -> str:
        """The tail of containerd's or the kubelet's log."""
        path = self.folder / "logs" / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"


def binaries() -> tuple[Path, Path, Path]:
    """The kubelet and the CNI plugins' folder, built if missing (or the test skipped:
    tests/helpers.go_tools), and Kubernetes' source."""
    script = go_tools("kubelet", "cni")
    return (
        Path(script.exe(script.KUBELET)),
        Path(script.exe(script.CNI)).parent,
        script.source(script.KUBELET),
    )


def pause_image(source: Path, folder: Path) -> Path:
    """An OCI image archive of Kubernetes' pause, compiled as its build/pause/Makefile does (a
    static binary; gcc rather than the cross compilers it names) into the image its Dockerfile
    makes: /pause as the entrypoint, user 65535."""
    exe = folder / "pause"
    subprocess.run(
        ["gcc", "-Os", "-Wall", "-Werror", "-static", "-DVERSION=v3.10.1-imagegate",
         "-o", str(exe), str(source / "build" / "pause" / "linux" / "pause.c")],
        check=True, capture_output=True,
    )  # fmt: skip

    def digest(data: bytes) -> str:
        return "sha256:" + hashlib.sha256(data).hexdigest()

    def tar(files: dict[str, tuple[bytes, int]]) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
            for name, (data, mode) in files.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), mode
                t.addfile(info, io.BytesIO(data))
        return out.getvalue()

    layer_tar = tar({"pause": (exe.read_bytes(), 0o755)})
    layer = gzip.compress(layer_tar, mtime=0)
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [digest(layer_tar)]},
    }).encode()  # fmt: skip
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest(layer), "size": len(layer)}],
    }).encode()  # fmt: skip
    # ctr names the imported image by this annotation (containerd's images/archive importer).
    index = json.dumps({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest(manifest),
            "size": len(manifest), "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": PAUSE},
        }],
    }).encode()  # fmt: skip
    archive = folder / "pause.tar"
    blobs = {f"blobs/sha256/{digest(b)[7:]}": (b, 0o644) for b in (config, manifest, layer)}
    archive.write_bytes(
        tar(
            {"oci-layout": (b'{"imageLayoutVersion": "1.0.0"}', 0o644), "index.json": (index, 0o644), **blobs}
        )
    )
    return archive


def _containerd_config(folder: Path, cni_bin: Path) -> str:
    # Version 2, the CRI plugin's own section (containerd 1.6 docs/cri/config.md). The CRI's
    # netns mounts go under the state folder, and a Pod's oom_score_adj is never set below
    # containerd's own: this machine grants no CAP_SYS_RESOURCE, which lowering it needs.
    return f"""version = 2
root = "{folder / "root"}"
state = "{folder / "state"}"
# Plugins this node does not use; the opt plugin would make /opt/containerd.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{folder / "containerd.sock"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE}"
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{folder / "runc"}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{folder / "cni"}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{folder / "certs.d"}"
"""


def _hosts_toml(host: str) -> str:
    # containerd's docs/hosts.md: the registry itself, over plain HTTP.
    return f'server = "http://{host}"\n\n[host."http://{host}"]\n  capabilities = ["pull", "resolve"]\n'


def _cni_config(bridge: str, subnet: str, folder: Path) -> str:
    # The node e2e tests' bridge network (test/e2e_node/remote/utils.go, cniConfig), less what
    # a Pod that talks to nothing needs: no gateway, no masquerade (so no iptables rules), and
    # host-local's leases in the test's folder.
    return json.dumps({
        "cniVersion": "1.0.0", "name": "imagegate-node",
        "plugins": [{
            "type": "bridge", "bridge": bridge, "isGateway": False, "ipMasq": False,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]], "dataDir": str(folder / "ipam")},
        }],
    })  # fmt: skip


def _kubelet_config(folder: Path, cgroup_root: str, port: int, healthz: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # The kubelet API on loopback only; the API server reads logs there (the node's name,
        # localhost, is the address it dials), anonymously: this kubelet trusts its one caller.
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        # cgroup v1 without systemd: kubelet 1.33 still runs there when told to.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "oomScoreAdj": 0,  # not -999: lowering it needs CAP_SYS_RESOURCE
        "containerRuntimeEndpoint": f"unix://{folder / 'containerd.sock'}",
        "podLogsDir": str(folder / "pod-logs"),
        # A shared disk that others fill: evict nothing, collect no images.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "maxPods": 20,
        "resolvConf": "/etc/resolv.conf",
    }  # fmt: skip


def _wait(
    what: str, ok: Any, daemons: dict[str, subprocess.Popen[bytes]], node: Node, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        said = f"containerd: {node.log('containerd')} | kubelet: {node.log('kubelet')}"
        for name, p in daemons.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited {p.returncode} before {what}: {said}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}? not within {timeout:g} s: {said}")
        time.sleep(0.3)


def _node_ready(api: ApiServer) -> bool:
    got = api.kubectl_run("get", "node", NODE, "-o", "json")
    if got.returncode != 0:
        return False
    node = json.loads(got.stdout)
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )
    # The node-lifecycle controller lifts the not-ready taint once the node says Ready.
    tainted = any(
        t.get("key") == "node.kubernetes.io/not-ready" for t in node.get("spec", {}).get("taints", [])
    )
    return ready and not tainted


def _in_namespace(holder: int, *argv: str) -> list[str]:
    return ["nsenter", f"--mount=/proc/{holder}/ns/mnt", "--", *argv]


def _private_mounts(folder: Path) -> tuple[subprocess.Popen[bytes], list[Path]]:
    """A process holding a mount namespace of its own, in which /var/log and /var/lib/cni are
    tmpfs and the kernel settings the kubelet sets are files; the folders it had to make on the
    machine for those mounts (removed at the end)."""
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sleep", "infinity"], start_new_session=True
    )
    ours = os.readlink("/proc/self/ns/mnt")
    deadline = time.monotonic() + 10
    while os.readlink(f"/proc/{holder.pid}/ns/mnt") == ours:
        if holder.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"unshare --mount did not start (exit {holder.poll()})")
        time.sleep(0.01)
    made = []
    for d in (Path("/var/log"), Path("/var/lib/cni")):
        if not d.exists():
            d.mkdir(parents=True)
            made.append(d)
        subprocess.run(_in_namespace(holder.pid, "mount", "-t", "tmpfs", "tmpfs", str(d)), check=True)
    (folder / "sysctl").mkdir()
    for name, want in KERNEL_TUNABLES.items():
        proc = Path("/proc/sys") / name
        if int(proc.read_text()) == want:
            continue
        stand_in = folder / "sysctl" / name.replace("/", ".")
        stand_in.write_text(f"{want}\n")
        subprocess.run(_in_namespace(holder.pid, "mount", "--bind", str(stand_in), str(proc)), check=True)
    return holder, made


def _cgroup_hierarchies() -> list[Path]:
    """Every cgroup hierarchy mounted at or under /sys/fs/cgroup (v1 controllers, name=systemd,
    the hybrid unified one; a v2-only host's one)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] in ("cgroup", "cgroup2") and CGROUPS in (Path(fields[4]), Path(fields[4]).parent):
            out.append(Path(fields[4]))
    return out


def _make_cgroup_root(name: str) -> None:
    for h in _cgroup_hierarchies():
        (h / name).mkdir(exist_ok=True)
        # A new cpuset starts with no CPUs and no memory nodes: its parent's, as a runtime does.
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (h / knob).exists():
                (h / name / knob).write_text((h / knob).read_text())


def _cgroup_procs(name: str) -> list[int]:
    pids: set[int] = set()
    for h in _cgroup_hierarchies():
        for procs in (h / name).rglob("cgroup.procs") if (h / name).is_dir() else []:
            with contextlib.suppress(OSError):
                pids |= {int(p) for p in procs.read_text().split()}
    return sorted(pids)


def _remove_cgroup_root(name: str) -> list[str]:
    """rmdir of the cgroup root, deepest first, in every hierarchy; what could not be removed."""
    left = []
    for h in _cgroup_hierarchies():
        if not (h / name).is_dir():
            continue
        for d in sorted((p for p in (h / name).rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                d.rmdir()
        try:
            (h / name).rmdir()
        except OSError as e:
            left.append(f"{h / name}: {e}")
    return left


def _shims(address: Path) -> list[int]:
    """The containerd shims serving this node's containerd (their -address is its socket)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if (b"-address", str(address).encode()) in itertools.pairwise(argv):
                found.append(int(proc.name))
    return found


def _drain(node: Node) -> None:
    """Delete every Pod bound to the node, so the kubelet stops each the ordinary way (its
    containers, then its sandbox and network); wait until containerd runs no task."""
    node.api.kubectl_run(
        "delete", "pods", "--all-namespaces", "--field-selector", f"spec.nodeName={node.name}", "--wait=false"
    )
    deadline = time.monotonic() + STOP_S
    while time.monotonic() < deadline:
        tasks = node.ctr("tasks", "ls", "-q")
        if tasks.returncode == 0 and not tasks.stdout.split():
            return
        time.sleep(0.5)


def _force(node: Node) -> None:
    """Whatever the kubelet left: every task killed and deleted, every container removed."""
    for tid in node.ctr("tasks", "ls", "-q").stdout.split():
        node.ctr("tasks", "kill", "--signal", "SIGKILL", tid)
    time.sleep(0.5)
    for tid in node.ctr("tasks", "ls", "-q").stdout.split():
        node.ctr("tasks", "delete", "--force", tid)
    for cid in node.ctr("containers", "ls", "-q").stdout.split():
        node.ctr("containers", "delete", cid)


@contextlib.contextmanager
def started(api: ApiServer, folder: Path, registries: Sequence[str] = ()) -> Iterator[Node]:
    """A Ready node named localhost, registered with `api` (whose controllers must run: the
    node-lifecycle controller lifts the new node's taint), pulling from `registries` (host:port on
    loopback) over plain HTTP; everything stopped and removed at the end."""
    kubelet, cni_bin, source = binaries()
    if shutil.which("gcc") is None:
        raise RuntimeError("the pause image is compiled here: install gcc (Debian package gcc)")
    folder.mkdir(parents=True, exist_ok=True)
    logs = folder / "logs"
    logs.mkdir()
    token = secrets.token_hex(3)
    cgroup_root, bridge = f"imagegate-{token}", f"igk-{token}"
    # A /24 of 10.88.0.0/16 (containerd's script/setup/install-cni network) per node: two
    # tests' nodes on one machine rarely meet, and the bridge has no address on the host.
    subnet = f"10.88.{secrets.randbelow(256)}.0/24"
    node = Node(api, NODE, folder, str(folder / "containerd.sock"))
    daemons: dict[str, subprocess.Popen[bytes]] = {}
    holder, made = None, list[Path]()

    def run(name: str, *argv: str) -> None:
        assert holder is not None
        daemons[name] = subprocess.Popen(
            _in_namespace(holder.pid, *argv),
            stdout=subprocess.DEVNULL,
            stderr=(logs / f"{name}.log").open("wb"),
            start_new_session=True,
        )

    try:
        holder, made = _private_mounts(folder)
        (folder / "cni").mkdir()
        (folder / "cni" / "10-imagegate.conflist").write_text(_cni_config(bridge, subnet, folder))
        for host in registries:
            (folder / "certs.d" / host).mkdir(parents=True)
            (folder / "certs.d" / host / "hosts.toml").write_text(_hosts_toml(host))
        (folder / "config.toml").write_text(_containerd_config(folder, cni_bin))
        run("containerd", "containerd", "--config", str(folder / "config.toml"))
        _wait("containerd answers", lambda: node.ctr("version").returncode == 0, daemons, node, READY_S)
        pause = pause_image(source, folder)
        imported = node.ctr("images", "import", "--snapshotter", "overlayfs", str(pause))
        assert imported.returncode == 0, imported.stderr
        _make_cgroup_root(cgroup_root)
        config = _kubelet_config(folder, f"/{cgroup_root}", free_port(), free_port())
        (folder / "kubelet.json").write_text(json.dumps(config))
        run(
            "kubelet", str(kubelet), f"--config={folder / 'kubelet.json'}", f"--kubeconfig={api.kubeconfig}",
            f"--root-dir={folder / 'kubelet'}", f"--cert-dir={folder / 'kubelet' / 'pki'}",
            f"--hostname-override={NODE}", "--v=2",
        )  # fmt: skip
        _wait("the node is Ready", lambda: _node_ready(api), daemons, node, READY_S)
        yield node
    finally:
        if "kubelet" in daemons and daemons["kubelet"].poll() is None:
            _drain(node)
        stop([daemons[n] for n in ("kubelet",) if n in daemons])
        if "containerd" in daemons and daemons["containerd"].poll() is None:
            _force(node)
        stop(list(daemons.values()))
        for pid in _shims(folder / "containerd.sock") + _cgroup_procs(cgroup_root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if holder is not None:
            stop([holder])  # the last process of the namespace: its mounts go with it
        deadline = time.monotonic() + 10
        while _cgroup_procs(cgroup_root) and time.monotonic() < deadline:
            time.sleep(0.1)  # the killed leave their cgroups as they are reaped
        left = _remove_cgroup_root(cgroup_root)
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True)
        for d in made:
            with contextlib.suppress(OSError):
                d.rmdir()
        shutil.rmtree(folder, ignore_errors=True)
        if left:  # said, not raised: an error here would hide the test's own
            warnings.warn(f"the node's cgroups could not all be removed: {left}", stacklevel=1)
