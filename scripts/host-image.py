"""Build an OCI image from this host's own Python: for a GPU machine with no network and no
container engine, whose one CUDA stack is the torch installed there.

    python3 scripts/host-image.py OUT_DIR [--tag TAG] [--dist torch ...]

The root holds, at the paths they have here: the interpreter (and the virtual environment it
belongs to), its standard library, the distributions named and everything they require (from their
metadata, as installed here: the files each one's RECORD lists), and the shared libraries all of
these load (`ldd`), except the NVIDIA driver's own (libcuda, libnvidia-*: those come from the GPU
node at run time, as CDI injects them). One uncompressed layer, written as an OCI image layout
(`oci:OUT_DIR:TAG`). Standard library only; prints one JSON line of what it wrote.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import io
import json
import os
import re
import stat
import subprocess
import sys
import sysconfig
import tarfile
import time

DRIVER_LIB = re.compile(r"^(libcuda|libnvidia-[\w-]+|libcudadebugger)\.so")
PASSWD = b"root:x:0:0:root:/root:/bin/sh\n"
GROUP = b"root:x:0:\n"


def _name(req: str) -> str | None:
    """A requirement's distribution name, None for one only an extra asks for."""
    if re.search(r"""extra\s*==""", req):
        return None
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    return m.group(1) if m else None


def closure(names: list[str]) -> list[md.Distribution]:
    """The distributions named and all they require that are installed here (markers aside: a
    requirement not installed is one this platform does not need)."""
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen[key] = dist
        todo += [n for n in map(_name, dist.requires or []) if n]
    return list(seen.values())


class Tree:
    """Paths of this host to copy, every symlink on the way kept as a symlink."""

    def __init__(self) -> None:
        self.dirs: set[str] = set()
        self.files: set[str] = set()
        self.links: dict[str, str] = {}

    def add(self, path: str, whole_dir: bool = False) -> None:
        parts = [p for p in os.path.abspath(path).split("/") if p]
        at, hops = "/", 0
        while parts:
            part = parts.pop(0)
            if part in (".", ".."):  # a relative link's way up: walked, never written as a name
                at = os.path.dirname(at) if part == ".." else at
                continue
            here = os.path.join(at, part)
            try:
                st = os.lstat(here)
            except OSError:
                return
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(here)
                self.links[here] = target
                hops += 1
                if hops > 40:
                    return
                parts = [p for p in os.path.join(at, target).split("/") if p] + parts
                at = "/"
                continue
            if stat.S_ISDIR(st.st_mode):
                self.dirs.add(here)
            elif stat.S_ISREG(st.st_mode):
                self.files.add(here)
            at = here
        if whole_dir and os.path.isdir(at):
            for top, dirs, files in os.walk(at):
                # Another environment's packages (a python built into /usr/local keeps them there).
                dirs[:] = [d for d in dirs if d not in ("site-packages", "dist-packages")]
                self.dirs.add(top)
                for n in dirs + files:
                    p = os.path.join(top, n)
                    if os.path.islink(p):
                        self.add(p)
                    elif os.path.isfile(p):
                        self.files.add(p)
                    elif os.path.isdir(p):
                        self.dirs.add(p)


def shared_libraries(paths: list[str]) -> set[str]:
    """What `ldd` says these ELF files load (the loader included), the driver's libraries left out."""
    found: set[str] = set()
    for i in range(0, len(paths), 200):
        out = subprocess.run(["ldd", *paths[i : i + 200]], capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = re.search(r"(?:=>\s*)?(/\S+) \(0x", line)
            lib = m.group(1) if m else ""
            if (
                lib
                and not DRIVER_LIB.match(os.path.basename(lib))
                and not lib.startswith("/usr/local/nvidia/")
            ):
                found.add(lib)
    return found


def is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def gather(dists: list[md.Distribution]) -> Tree:
    tree = Tree()
    exe = sys.executable
    tree.add(exe)
    if sys.prefix != sys.base_prefix:
        tree.add(os.path.join(sys.prefix, "pyvenv.cfg"))
        for name in ("python", "python3", "python%d.%d" % sys.version_info[:2]):
            tree.add(os.path.join(sys.prefix, "bin", name))
    for key in ("stdlib", "platstdlib"):
        tree.add(sysconfig.get_paths()[key], whole_dir=True)
    for d in dists:
        for f in d.files or []:
            p = str(d.locate_file(f))
            if os.path.lexists(p):
                tree.add(p)
    elves = [
        p
        for p in sorted(tree.files)
        if (".so" in os.path.basename(p) or p == os.path.realpath(exe)) and is_elf(p)
    ]
    for lib in shared_libraries(elves):
        tree.add(lib)
    for d in ("/tmp", "/proc", "/dev", "/root", "/etc"):
        tree.dirs.add(d)
    return tree


class HashingWriter(io.RawIOBase):
    def __init__(self, f: io.BufferedWriter) -> None:
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[no-untyped-def]
        self.h.update(b)
        self.n += len(b)
        return self.f.write(b)


def _info(path: str, kind: bytes, size: int = 0, mode: int = 0o755) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(path.lstrip("/"))
    ti.type, ti.size, ti.mode, ti.mtime = kind, size, mode, 0
    return ti


def write_layer(tree: Tree, path: str) -> tuple[str, int]:
    """The root as one uncompressed tar: (sha256 hex, size); folders first, parents first."""
    with open(path, "wb") as raw:
        w = HashingWriter(raw)
        with tarfile.open(fileobj=w, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for d in sorted(tree.dirs - set(tree.links)):
                tar.addfile(_info(d, tarfile.DIRTYPE, mode=stat.S_IMODE(os.stat(d).st_mode) | 0o700))
            for name, data in (("/etc/passwd", PASSWD), ("/etc/group", GROUP)):
                tar.addfile(_info(name, tarfile.REGTYPE, len(data), 0o644), io.BytesIO(data))
            for p in sorted(tree.files - set(tree.links)):
                st = os.stat(p)
                with open(p, "rb") as f:
                    tar.addfile(_info(p, tarfile.REGTYPE, st.st_size, stat.S_IMODE(st.st_mode)), f)
            for p, target in sorted(tree.links.items()):
                ti = _info(p, tarfile.SYMTYPE, mode=0o777)
                ti.linkname = target
                tar.addfile(ti)
    return w.h.hexdigest(), w.n


def blob(out: str, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(out, "blobs", "sha256", digest), "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + digest, "size": len(data)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--tag", default="host")
    ap.add_argument(
        "--dist", action="append", default=[], help="a distribution to include, with what it requires"
    )
    args = ap.parse_args()
    t0 = time.monotonic()
    os.makedirs(os.path.join(args.out, "blobs", "sha256"), exist_ok=True)
    dists = closure(args.dist)
    tree = gather(dists)
    tmp = os.path.join(args.out, "blobs", "sha256", "layer.partial")
    digest, size = write_layer(tree, tmp)
    os.replace(tmp, os.path.join(args.out, "blobs", "sha256", digest))
    venv_bin = [os.path.join(sys.prefix, "bin")] if sys.prefix != sys.base_prefix else []
    path = ":".join(
        [*venv_bin, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
    )
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    config = {
        "architecture": arch,
        "os": "linux",
        "config": {"Env": ["PATH=" + path], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + digest]},
        "history": [{"created_by": "scripts/host-image.py " + " ".join(sys.argv[1:])}],
    }
    cfg = blob(args.out, json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **cfg},
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": "sha256:" + digest,
                "size": size,
            }
        ],
    }
    man = blob(args.out, json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **man,
                "annotations": {"org.opencontainers.image.ref.name": args.tag},
            }
        ],
    }
    with open(os.path.join(args.out, "index.json"), "w") as f:
        json.dump(index, f)
    with open(os.path.join(args.out, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    said = {
        "reference": "oci:%s:%s" % (os.path.abspath(args.out), args.tag),
        "manifest_digest": man["digest"],
        "config_digest": cfg["digest"],
        "layer_bytes": size,
        "files": len(tree.files),
        "links": len(tree.links),
        "distributions": sorted("%s==%s" % (d.metadata["Name"], d.version) for d in dists),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "seconds": round(time.monotonic() - t0, 1),
    }
    print(json.dumps(said))
    return 0


if __name__ == "__main__":
    sys.exit(main())
