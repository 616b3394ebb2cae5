"""GPUs for the rootfs sandbox, as the Container Device Interface (CDI) describes them.

A CDI spec (`/etc/cdi`, `/var/run/cdi`; kind `nvidia.com/gpu`, as `nvidia-ctk cdi generate`
writes it) names, per device and in common, the device nodes, mounts, environment and hooks a
container gets. Where none exists, `generate` builds the same set from this host as nvidia-ctk
does: the /dev/nvidia* nodes of the chosen GPUs and the control nodes, the driver's user-space
libraries found through the loader cache, and the driver's programs (nvidia-smi).

The sandbox's root is the image's, read-only, and bwrap cannot make a mount point inside it, so
nothing is added to the image's own folders: the libraries are bound read-only into one folder of
their own (LIB_DIR, first on LD_LIBRARY_PATH) under the names the loader asks for (the loader
cache's sonames; a spec's create-symlinks links), the programs into BIN_DIR (on PATH). A spec's
hooks are host programs run into a container's writable root: they are not run; their effect
(links, the loader's path) is made as above, and the evidence lists them.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from imagegate._support.files import FileRefused, read_regular
from imagegate._support.jsontypes import JsonObject
from imagegate.domain.gpus import GpuRequest
from imagegate.errors import UsageError

SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
KIND = "nvidia.com/gpu"
DRIVER_DIR = "/nvidia-driver"  # a top-level folder of the sandbox's own, never the image's
LIB_DIR = DRIVER_DIR + "/lib"
BIN_DIR = DRIVER_DIR + "/bin"
MAX_SPEC = 4 << 20  # nvidia-ctk's specs are a few KiB
MAX_GPU_INFORMATION = 64 << 10  # the driver's /proc information file: a dozen short lines
MAX_SPEC_EVENTS = 200_000  # scalars, mappings and sequences: nvidia-ctk's specs have a few thousand
REGENERATE = "regenerate it (nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml) or remove it"

# The driver's user-space libraries a CUDA program can load (libnvidia-container's compute and
# utility sets), by soname stem.
DRIVER_LIBS = (
    "libcuda",
    "libcudadebugger",
    "libnvidia-ml",
    "libnvidia-ptxjitcompiler",
    "libnvidia-nvvm",
    "libnvidia-gpucomp",
    "libnvidia-allocator",
    "libnvidia-cfg",
    "libnvidia-opencl",
    "libnvidia-pkcs11",
    "libnvidia-pkcs11-openssl3",
    "libnvidia-nscq",
)
DRIVER_PROGRAMS = ("nvidia-smi", "nvidia-debugdump", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


class CdiError(UsageError):
    """A CDI spec that cannot be read or applied, or GPUs it does not have."""


@dataclass(frozen=True)
class Edits:
    """One device's (or the spec's common) container edits."""

    env: tuple[str, ...] = ()
    device_nodes: tuple[tuple[str, str], ...] = ()  # (host path, path in the sandbox)
    mounts: tuple[tuple[str, str], ...] = ()  # (host path, the spec's container path)
    links: tuple[tuple[str, str], ...] = ()  # (target, link): a create-symlinks hook's --link
    hooks: tuple[str, ...] = ()  # every hook, as "hookName: path args"

    @staticmethod
    def join(parts: Sequence[Edits]) -> Edits:
        """The edits of `parts` in order, in one pass (adding them pairwise would copy every
        tuple again for each device: quadratic in a spec of many)."""
        return Edits(
            tuple(x for p in parts for x in p.env),
            tuple(x for p in parts for x in p.device_nodes),
            tuple(x for p in parts for x in p.mounts),
            tuple(x for p in parts for x in p.links),
            tuple(x for p in parts for x in p.hooks),
        )


@dataclass(frozen=True)
class Spec:
    source: str  # the spec file, or how it was generated
    devices: tuple[tuple[str, Edits], ...]
    common: Edits = field(default_factory=Edits)

    def names(self) -> list[str]:
        return [n for n, _ in self.devices]


# -- reading specs -------------------------------------------------------------------------------


def _strings(obj: object, where: str) -> tuple[str, ...]:
    if obj is None:
        return ()
    if not isinstance(obj, list) or not all(isinstance(x, str) for x in obj):
        raise CdiError(f"{where}: not a list of strings", hint=REGENERATE)
    return tuple(obj)


def _edits(obj: object, where: str) -> Edits:
    if obj is None:
        return Edits()
    if not isinstance(obj, dict):
        raise CdiError(f"{where}: containerEdits is not a mapping", hint=REGENERATE)
    nodes, mounts, links, hooks = [], [], [], []
    for n in obj.get("deviceNodes") or []:
        path = n.get("path") if isinstance(n, dict) else None
        if not isinstance(path, str):
            raise CdiError(f"{where}: a device node without a path", hint=REGENERATE)
        nodes.append((str(n.get("hostPath") or path), path))
    for m in obj.get("mounts") or []:
        if not (
            isinstance(m, dict)
            and isinstance(m.get("hostPath"), str)
            and isinstance(m.get("containerPath"), str)
        ):
            raise CdiError(f"{where}: a mount without hostPath and containerPath", hint=REGENERATE)
        mounts.append((m["hostPath"], m["containerPath"]))
    for h in obj.get("hooks") or []:
        if not isinstance(h, dict):
            raise CdiError(f"{where}: a hook that is not a mapping", hint=REGENERATE)
        args = _strings(h.get("args"), f"{where}: a hook's args")
        hooks.append(f"{h.get('hookName')}: {' '.join(args) or h.get('path')}")
        if "create-symlinks" in args:
            for i, a in enumerate(args[:-1]):
                if a == "--link" and "::" in args[i + 1]:
                    target, _, link = args[i + 1].partition("::")
                    links.append((target, link))
    env = _strings(obj.get("env"), f"{where}: env")
    return Edits(env, tuple(nodes), tuple(mounts), tuple(links), tuple(hooks))


def parse_spec(data: bytes, where: str) -> Spec | None:
    """A CDI spec file's devices (JSON or YAML); None when its kind is not nvidia.com/gpu."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        text = data.decode("utf-8")
        # Aliases first: each one is another walk of what it names, so a few KiB of them cost
        # as much to read as a spec of gigabytes; a CDI spec (JSON Schema, nvidia-ctk's output)
        # never has one. Then a bound on the nodes, so the reading below is linear and small.
        for n, event in enumerate(yaml.parse(text, Loader=loader)):
            if isinstance(event, yaml.AliasEvent):
                raise CdiError(
                    f"CDI spec {where}: a YAML alias (*{event.anchor}); a CDI spec is plain data",
                    hint=REGENERATE,
                )
            if n > MAX_SPEC_EVENTS:
                raise CdiError(f"CDI spec {where}: more than {MAX_SPEC_EVENTS} YAML nodes", hint=REGENERATE)
        doc: object = yaml.load(text, Loader=loader)  # a safe loader, either way
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise CdiError(
            f"CDI spec {where}: not YAML or JSON ({str(e).splitlines()[0]})", hint=REGENERATE
        ) from e
    if not isinstance(doc, dict):
        raise CdiError(f"CDI spec {where}: not a mapping", hint=REGENERATE)
    if doc.get("kind") != KIND:
        return None
    devices = []
    for d in doc.get("devices") or []:
        name = d.get("name") if isinstance(d, dict) else None
        if not isinstance(name, str) or not name:
            raise CdiError(f"CDI spec {where}: a device without a name", hint=REGENERATE)
        devices.append((name, _edits(d.get("containerEdits"), f"CDI spec {where}, device {name}")))
    return Spec(where, tuple(devices), _edits(doc.get("containerEdits"), f"CDI spec {where}"))


def find_specs(dirs: Sequence[str] = SPEC_DIRS) -> list[Spec]:
    """Every nvidia.com/gpu spec in `dirs`, in CDI's order (the folders in order, files by name)."""
    specs = []
    for folder in dirs:
        for path in sorted(
            glob.glob(os.path.join(folder, "*.yaml")) + glob.glob(os.path.join(folder, "*.json"))
        ):
            try:
                data = read_regular(path, max_bytes=MAX_SPEC)
            except (OSError, FileRefused) as e:
                raise CdiError(f"CDI spec {path}: cannot read it ({e})", hint=REGENERATE) from e
            spec = parse_spec(data, path)
            if spec is not None:
                specs.append(spec)
    return specs


def choose(spec: Spec, request: GpuRequest) -> list[str]:
    """The spec's device names `request` asks for: `all` (the spec's own device "all" where it
    has one), the first N GPUs by index, or the ids named (indexes or UUIDs) -- each exactly."""
    names = spec.names()
    # By number without int(): a name of thousands of digits is refused by int(), not sorted.
    indexed = sorted((n for n in names if n.isdigit()), key=lambda n: (len(n.lstrip("0")), n.lstrip("0"), n))
    if request.ids:
        missing = [i for i in request.ids if i not in names]
        if missing:
            raise CdiError(
                f"--gpus {request.spec}: {', '.join(missing)} not among the GPUs of {spec.source} "
                f"({', '.join(names) or 'none'})",
                hint="name GPUs by index or UUID as the spec lists them, or --gpus all",
            )
        return list(dict.fromkeys(request.ids))
    if request.count > 0:
        if len(indexed) < request.count:
            raise CdiError(
                f"--gpus {request.spec}: {spec.source} lists {len(indexed)} GPU(s)",
                hint=f"ask for {len(indexed) or 'no'} GPUs at most",
            )
        return indexed[: request.count]
    if "all" in names:
        return ["all"]
    if not indexed and not names:
        raise CdiError(f"--gpus all: {spec.source} lists no GPU", hint=REGENERATE)
    return indexed or names


# -- generating a spec from this host, as nvidia-ctk does -----------------------------------------


@dataclass(frozen=True)
class Host:
    """Where this host's GPUs are read from (tests build a fake one)."""

    dev: str = "/dev"
    proc_gpus: str = "/proc/driver/nvidia/gpus"
    ld_cache: str | None = None  # None: the system's loader cache
    path: str | None = None  # where programs are looked for (None: PATH)


def _gpus(host: Host) -> list[dict[str, str]]:
    """index, minor and UUID of each GPU, in nvidia-smi's order (PCI bus); from the driver's
    /proc folder, else the /dev/nvidiaN nodes by minor."""
    found = []
    for info in glob.glob(os.path.join(host.proc_gpus, "*", "information")):
        try:
            text = read_regular(info, max_bytes=MAX_GPU_INFORMATION).decode("utf-8", "replace")
        except (OSError, FileRefused) as e:
            # Left out, every later GPU would take its index: `--gpus 1` another GPU than asked.
            raise CdiError(
                f"{info}: cannot read this GPU's information ({e})",
                hint="check the NVIDIA driver (nvidia-smi), or write a CDI spec: "
                "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml",
            ) from e
        fields = dict(
            (k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in text.splitlines()) if v
        )
        minor = fields.get("Device Minor", "")
        if minor.isdigit():
            bus = fields.get("Bus Location") or os.path.basename(os.path.dirname(info))
            found.append({"bus": bus.lower(), "minor": minor, "uuid": fields.get("GPU UUID", "")})
    if not found:
        minors = [m.group(1) for p in os.listdir(host.dev) if (m := re.fullmatch(r"nvidia(\d+)", p))]
        found = [{"bus": m.zfill(8), "minor": m, "uuid": ""} for m in minors]
    found.sort(key=lambda g: g["bus"])
    return [{"index": str(i), **g} for i, g in enumerate(found)]


def loader_cache(ld_cache: str | None = None) -> list[tuple[str, str]]:
    """(soname, path) of the loader cache's x86-64/aarch64 64-bit entries (`ldconfig -p`)."""
    exe = shutil.which("ldconfig") or "/sbin/ldconfig"
    argv = [exe, "-p"] + (["-C", ld_cache] if ld_cache else [])
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    entries = []
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)$", line)
        if m and ("64" in m.group(2)):
            entries.append((m.group(1), m.group(3)))
    return entries


def driver_libraries(entries: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The driver's libraries among loader-cache entries: (path, soname), one per soname."""
    out: dict[str, str] = {}
    for soname, path in entries:
        stem = soname.split(".so", 1)[0]
        if stem in DRIVER_LIBS and ".so." in soname and soname not in out:
            out[soname] = path
    return [(p, s) for s, p in out.items()]


def generate(host: Host = Host()) -> Spec:
    """A spec of this host's GPUs as `nvidia-ctk cdi generate` makes it: a device per GPU (by
    index, and by UUID), the control nodes, libraries and programs in common."""
    devices: list[tuple[str, Edits]] = []
    for g in _gpus(host):
        node = os.path.join(host.dev, "nvidia" + g["minor"])
        edits = Edits(device_nodes=((node, "/dev/nvidia" + g["minor"]),))
        devices.append((g["index"], edits))
        if g["uuid"]:
            devices.append((g["uuid"], edits))
    nodes = [(os.path.join(host.dev, n), "/dev/" + n) for n in CONTROL_NODES]
    nodes += [
        (p, "/dev/nvidia-caps/" + os.path.basename(p))
        for p in glob.glob(os.path.join(host.dev, "nvidia-caps", "*"))
    ]
    nodes = [(h, c) for h, c in nodes if os.path.exists(h)]
    mounts = [(p, os.path.join(LIB_DIR, s)) for p, s in driver_libraries(loader_cache(host.ld_cache))]
    for name in DRIVER_PROGRAMS:
        if exe := shutil.which(name, path=host.path):
            mounts.append((exe, os.path.join(BIN_DIR, name)))
    common = Edits(env=("NVIDIA_VISIBLE_DEVICES=void",), device_nodes=tuple(nodes), mounts=tuple(mounts))
    return Spec(
        "generated from this host (no CDI spec in " + ", ".join(SPEC_DIRS) + ")", tuple(devices), common
    )


# -- what the sandbox gets -----------------------------------------------------------------------


@dataclass(frozen=True)
class Injection:
    """The GPUs one sandbox gets: device nodes bound at their paths under /dev, the driver's
    files bound read-only under DRIVER_DIR, links beside them, the spec's environment."""

    source: str
    request: str
    devices: tuple[str, ...]
    device_nodes: tuple[tuple[str, str], ...]  # (host, sandbox)
    binds: tuple[tuple[str, str], ...]  # (host, sandbox), read-only
    links: tuple[tuple[str, str], ...]  # (target, sandbox link)
    env: tuple[tuple[str, str], ...]
    not_applied: tuple[str, ...] = ()

    def bwrap_args(self) -> list[str]:
        """After `--dev /dev`, in a sandbox whose root can take DRIVER_DIR."""
        args: list[str] = []
        for host, path in self.device_nodes:
            args += ["--dev-bind", host, path]
        for host, path in self.binds:
            args += ["--ro-bind", host, path]
        for target, link in self.links:
            args += ["--symlink", target, link]
        return args

    def sandbox_env(self, image_env: dict[str, str]) -> dict[str, str]:
        """The spec's environment over the image's; LIB_DIR first on the loader's path, BIN_DIR
        last on PATH (the image's own programs first)."""
        env = dict(self.env)
        ld = image_env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = LIB_DIR + (":" + ld if ld else "")
        env["PATH"] = (image_env.get("PATH") or "/usr/bin:/bin") + ":" + BIN_DIR
        return env

    def facts(self) -> JsonObject:
        return {
            "cdi_spec": self.source,
            "gpus_requested": self.request,
            "devices": list(self.devices),
            "device_nodes": [{"host": h, "path": p} for h, p in self.device_nodes],
            "read_only": [{"host": h, "path": p} for h, p in self.binds],
            "links": [{"link": link, "target": t} for t, link in self.links],
            "env": [f"{k}={v}" for k, v in self.env],
            "not_applied": list(self.not_applied),
        }


def _sandbox_path(container: str) -> str | None:
    """Where a spec's mount goes in the sandbox: a library into LIB_DIR, a program into BIN_DIR;
    None for anything else (firmware, ICD files: nothing a CUDA program loads)."""
    name = os.path.basename(container.rstrip("/"))
    if not name or name in (".", ".."):
        return None
    if ".so" in name:
        return os.path.join(LIB_DIR, name)
    if os.path.basename(os.path.dirname(container)) in ("bin", "sbin"):
        return os.path.join(BIN_DIR, name)
    return None


def _nodes(edits: Edits, source: str) -> list[tuple[str, str]]:
    out: dict[str, str] = {}
    for host, path in edits.device_nodes:
        norm = os.path.normpath(path)
        if not norm.startswith("/dev/") or norm != path:
            raise CdiError(f"CDI spec {source}: device node {path!r} is not under /dev", hint=REGENERATE)
        try:
            is_char = stat.S_ISCHR(os.stat(host).st_mode)
        except OSError:
            is_char = False
        if not is_char:
            raise CdiError(
                f"CDI spec {source}: {host} is not a character device on this host", hint=REGENERATE
            )
        out.setdefault(path, host)
    return [(h, p) for p, h in out.items()]


def _binds(edits: Edits, source: str, skipped: list[str]) -> list[tuple[str, str]]:
    out: dict[str, str] = {}
    for host, container in edits.mounts:
        where = _sandbox_path(container)
        if where is None:
            skipped.append(f"mount {host} -> {container}: not a library or program")
            continue
        if not os.path.isfile(host):
            raise CdiError(f"CDI spec {source}: {host} is not a file on this host", hint=REGENERATE)
        if where in out:
            skipped.append(f"mount {host} -> {container}: {where} is bound already")
            continue
        out[where] = host
    return [(h, p) for p, h in out.items()]


def _links(edits: Edits, bound: set[str], skipped: list[str]) -> list[tuple[str, str]]:
    out: dict[str, str] = {}
    for target, link in edits.links:
        name, dest = os.path.basename(target), _sandbox_path(link)
        if dest is None or os.path.join(os.path.dirname(dest), name) not in bound or dest in bound:
            skipped.append(f"link {link} -> {target}: its target is not bound here")
            continue
        out.setdefault(dest, name)
    return [(t, link) for link, t in out.items()]


def inject(spec: Spec, request: GpuRequest) -> Injection:
    """What a sandbox gets for `request` from `spec`; CdiError when the host lacks a node or file
    the spec names, or the spec lacks a GPU asked for."""
    chosen = choose(spec, request)
    by_name = dict(spec.devices)
    edits = Edits.join([spec.common, *(by_name[name] for name in chosen)])
    skipped: list[str] = []
    binds = _binds(edits, spec.source, skipped)
    links = _links(edits, {p for _, p in binds}, skipped)
    skipped += [
        f"hook {h}: not run (the links and the loader's path are made above)"
        for h in dict.fromkeys(edits.hooks)
    ]
    env: dict[str, str] = {}
    for item in edits.env:
        k, sep, v = item.partition("=")
        if k == "NVIDIA_VISIBLE_DEVICES" and v in ("void", "none"):
            # nvidia-ctk sets it so that the NVIDIA runtime's own hook adds nothing; no hook runs
            # here, and the probes read it as GPUs hidden.
            skipped.append(f"env {item}: for the NVIDIA container runtime's hook, which does not run here")
        elif sep and k:
            env[k] = v
    return Injection(
        source=spec.source,
        request=request.spec,
        devices=tuple(chosen),
        device_nodes=tuple(_nodes(edits, spec.source)),
        binds=tuple(binds),
        links=tuple(links),
        env=tuple(env.items()),
        not_applied=tuple(skipped),
    )


def for_request(request: GpuRequest, dirs: Sequence[str] = SPEC_DIRS, host: Host = Host()) -> Injection:
    """The first nvidia.com/gpu spec in `dirs` (CDI's order), else one generated from `host`."""
    specs = find_specs(dirs)
    spec = specs[0] if specs else generate(host)
    if not spec.devices:
        raise CdiError(
            f"--gpus {request.spec}: no NVIDIA GPU on this host ({spec.source})",
            hint="run on a GPU node, or leave --gpus out",
        )
    return inject(spec, request)
