"""Real parts for the unpack tests: a multi-layer image built by the engine from a real
Dockerfile (on a busybox base made with `docker import`), crafted layer tarballs written into
an OCI layout and pushed to a registry on 127.0.0.1 by skopeo, and trees compared file by file."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from tests.oci.infra import Registry, sh, skopeo

BUSYBOX = Path("/bin/busybox")

# Every case of the OCI layer rules that a builder produces, one RUN (one layer) at a time.
DOCKERFILE = """\
FROM {base}
RUN mkdir -p /t/del /t/opq/sub /t/f2d /t/d2f/sub /t/ro \\
 && echo a > /t/del/x && echo keep > /t/keep && echo o1 > /t/opq/old && echo o2 > /t/opq/sub/old2 \\
 && echo file > /t/f2d2 && echo hl > /t/hl-src && ln -s target1 /t/swap && echo in > /t/d2f/sub/in \\
 && echo s > /t/suid && chmod 4755 /t/suid && echo 600 > /t/m600 && chmod 600 /t/m600 \\
 && echo ro > /t/ro/f && chmod 0555 /t/ro && mkfifo /t/fifo && ln /t/keep /t/keep-link
RUN rm -rf /t/del/x /t/opq && mkdir -p /t/opq && echo new > /t/opq/new \\
 && rm /t/f2d2 && mkdir /t/f2d2 && echo inside > /t/f2d2/inside \\
 && ln /t/hl-src /t/hl-dst && rm /t/swap && ln -s target2 /t/swap \\
 && rm -rf /t/d2f && echo nowfile > /t/d2f && chmod 0700 /t/keep
RUN ln /t/hl-src /t/hl-third && rm /t/keep-link && echo more >> /t/opq/new \\
 && mkdir /t/later && ln -s ../keep /t/later/rel && ln -s /t/opq /t/abs
"""


def busybox_base(workdir: Path) -> str:
    """A tiny base image: busybox and its applets, imported by the engine (cached by content)."""
    digest = hashlib.sha256(BUSYBOX.read_bytes()).hexdigest()[:16]
    ref = f"imagegate-rootfs-test/busybox:{digest}"
    if subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0:
        return ref
    root = workdir / "bb"
    (root / "bin").mkdir(parents=True)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    for applet in ("sh", "mkdir", "rm", "ln", "chmod", "echo", "mkfifo", "cat", "true"):
        (root / "bin" / applet).symlink_to("busybox")
    for d in ("etc", "tmp", "root"):
        (root / d).mkdir()
    tar = workdir / "bb.tar"
    sh("tar", "-cf", str(tar), "-C", str(root), ".")
    sh("docker", "import", str(tar), ref)
    return ref


def build_layered_image(workdir: Path) -> str:
    base = busybox_base(workdir)
    dockerfile = DOCKERFILE.format(base=base)
    ref = f"imagegate-rootfs-test/layered:{hashlib.sha256(dockerfile.encode()).hexdigest()[:16]}"
    if subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0:
        return ref
    ctx = workdir / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(dockerfile)
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}  # one layer per RUN, overlay2's own diffs
    sh("docker", "build", "-q", "--network", "none", "-t", ref, str(ctx), env=env)
    return ref


# -- trees -------------------------------------------------------------------------------------

# Files and mount points the engine adds to every container (not image content).
ENGINE_ADDED = {".dockerenv", "etc/hostname", "etc/hosts", "etc/resolv.conf", "etc/mtab"}
ENGINE_MOUNTS = ("proc", "sys", "dev")


def _ignored(path: str) -> bool:
    return path in ENGINE_ADDED or path.split("/")[0] in ENGINE_MOUNTS


@dataclass(frozen=True)
class Node:
    kind: str  # file, dir, symlink, fifo, char, block
    mode: int
    content: str | None  # sha256 of a file's bytes
    target: str | None  # of a symlink
    uid: int
    gid: int


def _plain(name: str) -> str:
    while name.startswith(("./", "/")):
        name = name[2:] if name.startswith("./") else name[1:]
    return name.rstrip("/") if name != "." else ""


def tree_of_export(container_tar: bytes) -> tuple[dict[str, Node], set[frozenset[str]]]:
    """Nodes and hard-link groups of a `docker export` stream."""
    nodes: dict[str, Node] = {}
    links: dict[str, set[str]] = {}
    with tarfile.open(fileobj=io.BytesIO(container_tar)) as tf:
        for ti in tf:
            path = _plain(ti.name)
            if not path or _ignored(path):
                continue
            mode = stat.S_IMODE(ti.mode)
            if ti.islnk():
                target = _plain(ti.linkname)
                nodes[path] = nodes[target]
                links.setdefault(target, {target}).add(path)
                continue
            kind = {
                tarfile.REGTYPE: "file",
                tarfile.AREGTYPE: "file",
                tarfile.DIRTYPE: "dir",
                tarfile.SYMTYPE: "symlink",
                tarfile.FIFOTYPE: "fifo",
                tarfile.CHRTYPE: "char",
                tarfile.BLKTYPE: "block",
            }[ti.type]
            content = None
            if kind == "file":
                f = tf.extractfile(ti)
                assert f is not None
                content = hashlib.sha256(f.read()).hexdigest()
            target = ti.linkname if kind == "symlink" else None
            nodes[path] = Node(kind, mode, content, target, ti.uid, ti.gid)
    return nodes, {frozenset(g) for g in links.values()}


def tree_of_folder(root: Path) -> tuple[dict[str, Node], set[frozenset[str]]]:
    nodes: dict[str, Node] = {}
    inodes: dict[int, set[str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            path = str(p.relative_to(root))
            if _ignored(path):
                continue
            st = os.lstat(p)
            m = st.st_mode
            kind = (
                "dir"
                if stat.S_ISDIR(m)
                else "symlink"
                if stat.S_ISLNK(m)
                else "file"
                if stat.S_ISREG(m)
                else "fifo"
                if stat.S_ISFIFO(m)
                else "char"
                if stat.S_ISCHR(m)
                else "block"
            )
            content = hashlib.sha256(p.read_bytes()).hexdigest() if kind == "file" else None
            target = os.readlink(p) if kind == "symlink" else None
            nodes[path] = Node(kind, stat.S_IMODE(m), content, target, st.st_uid, st.st_gid)
            if kind != "dir" and st.st_nlink > 1:
                inodes.setdefault(st.st_ino, set()).add(path)
    return nodes, {frozenset(g) for g in inodes.values() if len(g) > 1}


def docker_export(ref: str) -> bytes:
    cid = sh("docker", "create", ref, "/bin/true").strip()
    try:
        return subprocess.run(["docker", "export", cid], capture_output=True, check=True, timeout=300).stdout
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)


# -- crafted layers ----------------------------------------------------------------------------


@dataclass
class Entry:
    """One tar entry, written exactly as given (hostile names included)."""

    name: str
    kind: str = "file"  # file, dir, symlink, hardlink
    data: bytes = b""
    link: str = ""
    mode: int = 0o644
    size: int | None = None  # a file of this many zero bytes (a bomb), instead of data


def layer_tar(entries: list[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            ti = tarfile.TarInfo(e.name)
            ti.mode, ti.mtime = e.mode, 1_700_000_000
            if e.kind == "dir":
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            elif e.kind == "symlink":
                ti.type, ti.linkname = tarfile.SYMTYPE, e.link
                tf.addfile(ti)
            elif e.kind == "hardlink":
                ti.type, ti.linkname = tarfile.LNKTYPE, e.link
                tf.addfile(ti)
            elif e.size is not None:
                ti.size = e.size
                tf.addfile(ti, _Zeros(e.size))
            else:
                ti.size = len(e.data)
                tf.addfile(ti, io.BytesIO(e.data))
    raw = buf.getvalue()
    # tarfile writes names as given: make sure the hostile ones really are in the layer.
    for e in entries:
        assert e.name.encode() in raw, e.name
    return raw


class _Zeros:
    def __init__(self, n: int):
        self.left = n

    def read(self, n: int) -> bytes:
        n = min(n, self.left)
        self.left -= n
        return bytes(n)


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_layout(folder: Path, layers: list[bytes], *, diff_ids: list[str] | None = None) -> Path:
    """An OCI image layout of gzip layers (as a builder would push them)."""
    blobs = folder / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> dict[str, object]:
        d = _sha(data)
        (blobs / d.split(":")[1]).write_bytes(data)
        return {"digest": d, "size": len(data)}

    descs = []
    for raw in layers:
        gz = gzip.compress(raw, compresslevel=1, mtime=0)
        descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **put(gz)})
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/bin", "CRAFTED=1"], "WorkingDir": "/t", "User": "1000:1000", "Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids or [_sha(raw) for raw in layers]},
    }
    cdesc = {"mediaType": "application/vnd.oci.image.config.v1+json", **put(json.dumps(config).encode())}
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": cdesc,
        "layers": descs,
    }
    mdesc = {"mediaType": "application/vnd.oci.image.manifest.v1+json", **put(json.dumps(manifest).encode())}
    (folder / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [mdesc]}))
    (folder / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return folder


def push_layers(registry: Registry, workdir: Path, name: str, layers: list[bytes], **kw: object) -> str:
    """Crafted layers as an image in the registry; the docker:// source string."""
    layout = write_layout(workdir / f"layout-{name}", layers, **kw)  # type: ignore[arg-type]
    ref = f"{registry.host}/crafted/{name}:1"
    skopeo("copy", "-q", "--dest-tls-verify=false", f"oci:{layout}", f"docker://{ref}")
    return f"docker://{ref}"
