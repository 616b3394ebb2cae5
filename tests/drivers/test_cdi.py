"""GPUs for the rootfs sandbox, as CDI describes them: specs read, a spec generated from a host,
exactly the GPUs asked for, and the sandbox's mounts as seen from inside it.

CI has no GPU, so the host here is a fake one, built by the test and named as such: a /dev whose
nvidia nodes are character devices (links to /dev/null), the driver's /proc folder, and a real
loader cache made by the system's ldconfig from minimal ELF libraries carrying the driver's
sonames. Everything else is real: bubblewrap, the image root, ldconfig, the YAML."""

from __future__ import annotations

import json
import os
import platform
import struct
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from imagegate.domain.gpus import parse
from imagegate.drivers import bwrap, cdi, seccomp
from imagegate.drivers.rootfs import PreparedRoot, RootfsDriver

# Two GPUs whose PCI order is not their minor order: index 0 (nvidia-smi's order) is /dev/nvidia1.
GPUS = (("0000:1b:00.0", 1, "GPU-aaaa1111"), ("0000:2c:00.0", 0, "GPU-bbbb2222"))
DRIVER = "580.1.2"


def fake_elf(path: Path, soname: str) -> None:
    """The least ELF shared object ldconfig takes: one PT_LOAD, a PT_DYNAMIC with DT_SONAME."""
    machine = {"x86_64": 62, "aarch64": 183}[platform.machine()]
    strtab = b"\0" + soname.encode() + b"\0"
    dyn_off, str_off = 64 + 2 * 56, 64 + 2 * 56 + 4 * 16
    total = str_off + len(strtab)
    head = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    head += struct.pack("<HHIQQQIHHHHHH", 3, machine, 1, 0, 64, 0, 0, 64, 56, 2, 64, 0, 0)
    load = struct.pack("<IIQQQQQQ", 1, 4, 0, 0, 0, total, total, 0x1000)
    dynamic = struct.pack("<IIQQQQQQ", 2, 6, dyn_off, dyn_off, dyn_off, 64, 64, 8)
    entries = b"".join(
        struct.pack("<qQ", t, v) for t, v in ((5, str_off), (10, len(strtab)), (14, 1), (0, 0))
    )
    path.write_bytes(head + load + dynamic + entries + strtab)


@pytest.fixture
def host(tmp_path: Path) -> cdi.Host:
    dev = tmp_path / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-caps/nvidia-cap1"):
        (dev / name).symlink_to("/dev/null")  # a character device, as the real nodes are
    for bus, minor, uuid in GPUS:
        info = tmp_path / "proc" / bus / "information"
        info.parent.mkdir(parents=True)
        info.write_text(
            f"Model: \t NVIDIA H200\nGPU UUID: \t {uuid}\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n"
        )
    lib = tmp_path / "driver-lib"
    lib.mkdir()
    for stem in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libfoo"):
        fake_elf(lib / f"{stem}.so.{DRIVER}", f"{stem}.so.1")
    (tmp_path / "ld.so.conf").write_text(f"{lib}\n")
    cache = tmp_path / "ld.so.cache"
    subprocess.run(["ldconfig", "-C", str(cache), "-f", str(tmp_path / "ld.so.conf")], check=True)
    bin_dir = tmp_path / "driver-bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho fake nvidia-smi\n")
    smi.chmod(0o755)
    return cdi.Host(dev=str(dev), proc_gpus=str(tmp_path / "proc"), ld_cache=str(cache), path=str(bin_dir))


def nodes(inj: cdi.Injection) -> list[str]:
    return sorted(p for _, p in inj.device_nodes)


def test_generated_from_the_host_gives_exactly_the_gpus_asked_for(host: cdi.Host) -> None:
    spec = cdi.generate(host)
    assert spec.names() == ["0", "GPU-aaaa1111", "1", "GPU-bbbb2222"]
    control = ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-uvm", "/dev/nvidiactl"]
    assert nodes(cdi.inject(spec, parse("all"))) == sorted([*control, "/dev/nvidia0", "/dev/nvidia1"])
    # Index 0 is the first GPU on the PCI bus: minor 1.
    assert nodes(cdi.inject(spec, parse("device=0"))) == sorted([*control, "/dev/nvidia1"])
    assert nodes(cdi.inject(spec, parse("1,0"))) == sorted([*control, "/dev/nvidia0", "/dev/nvidia1"])
    assert nodes(cdi.inject(spec, parse("GPU-bbbb2222"))) == sorted([*control, "/dev/nvidia0"])
    every = cdi.inject(spec, parse("all"))
    assert every.devices == ("0", "1")  # each GPU once, not again by its UUID
    first = cdi.inject(spec, parse("1"))
    assert first.devices == ("0",) and nodes(first) == sorted([*control, "/dev/nvidia1"])
    one = cdi.inject(spec, parse("device=1"))
    assert nodes(one) == sorted([*control, "/dev/nvidia0"]) and one.devices == ("1",)
    inj = cdi.inject(spec, parse("2"))
    assert inj.devices == ("0", "1")
    # The driver's libraries by soname (libfoo is not the driver's), the programs, and nothing else.
    assert sorted(p for _, p in inj.binds) == [
        "/nvidia-driver/bin/nvidia-smi",
        "/nvidia-driver/lib/libcuda.so.1",
        "/nvidia-driver/lib/libnvidia-ml.so.1",
        "/nvidia-driver/lib/libnvidia-ptxjitcompiler.so.1",
    ]
    assert dict(inj.env) == {}  # the spec's NVIDIA_VISIBLE_DEVICES=void is for a hook that does not run
    assert "env NVIDIA_VISIBLE_DEVICES=void: for the NVIDIA container runtime's hook" in "\n".join(
        inj.not_applied
    )
    assert inj.facts()["cdi_spec"].startswith("generated from this host")


GENERATED = "generated from this host (no CDI spec in /etc/cdi, /var/run/cdi)"


@pytest.mark.parametrize(
    ("gpus", "message", "hint"),
    [
        ("3", f"--gpus 3: {GENERATED} lists 2 GPU(s)", "ask for 2 GPUs at most"),
        (
            "0,7",
            f"--gpus 0,7: 7 not among the GPUs of {GENERATED} (0, GPU-aaaa1111, 1, GPU-bbbb2222)",
            "name GPUs by index or UUID as the spec lists them, or --gpus all",
        ),
        (
            "GPU-cccc3333",
            "--gpus GPU-cccc3333: GPU-cccc3333 not among the GPUs",
            "name GPUs by index or UUID",
        ),
    ],
)
def test_a_gpu_the_host_lacks_is_refused_naming_it(
    host: cdi.Host, gpus: str, message: str, hint: str
) -> None:
    with pytest.raises(cdi.CdiError) as e:
        cdi.inject(cdi.generate(host), parse(gpus))
    assert message in str(e.value) and hint in (e.value.hint or "")


def node_spec(source: str, *names: str) -> cdi.Spec:
    """A spec whose devices are `names`, each with its own node (character devices here: /dev/null)."""
    return cdi.Spec(
        source,
        tuple((n, cdi.Edits(device_nodes=(("/dev/null", f"/dev/nvidia{i}"),))) for i, n in enumerate(names)),
    )


def test_a_spec_that_names_gpus_by_uuid_only_gives_them_all_and_counts_none_by_index() -> None:
    spec = node_spec("uuids.yaml", "GPU-aaaa1111", "GPU-bbbb2222")
    every = cdi.inject(spec, parse("all"))
    assert every.devices == ("GPU-aaaa1111", "GPU-bbbb2222") and nodes(every) == [
        "/dev/nvidia0",
        "/dev/nvidia1",
    ]
    with pytest.raises(cdi.CdiError) as e:
        cdi.inject(spec, parse("1"))
    assert "--gpus 1: uuids.yaml lists 0 GPU(s)" in str(e.value) and e.value.hint == "ask for no GPUs at most"


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ("all", "--gpus all: empty.yaml lists no GPU"),
        ("device=0", "--gpus device=0: 0 not among the GPUs of empty.yaml (none)"),
    ],
)
def test_a_spec_without_devices_gives_no_gpu_and_says_so(gpus: str, message: str) -> None:
    with pytest.raises(cdi.CdiError) as e:
        cdi.inject(cdi.Spec("empty.yaml", ()), parse(gpus))
    assert message in str(e.value)


def test_the_gpus_are_numbered_in_bus_order_from_the_driver_else_by_their_nodes(host: cdi.Host) -> None:
    proc = Path(host.proc_gpus)
    # No bus line: the folder's name (the driver names it by the bus) orders it.
    info = proc / "0000:1b:00.0" / "information"
    info.write_text("\n".join(line for line in info.read_text().splitlines() if "Bus Location" not in line))
    assert [(n, e.device_nodes[0][1]) for n, e in cdi.generate(host).devices if n.isdigit()] == [
        ("0", "/dev/nvidia1"),
        ("1", "/dev/nvidia0"),
    ]
    # No driver folder: the /dev/nvidiaN nodes by minor (UUIDs unknown).
    bare = cdi.Host(dev=host.dev, proc_gpus=str(proc / "none"), ld_cache=host.ld_cache, path=host.path)
    assert [(n, e.device_nodes) for n, e in cdi.generate(bare).devices] == [
        ("0", ((f"{host.dev}/nvidia0", "/dev/nvidia0"),)),
        ("1", ((f"{host.dev}/nvidia1", "/dev/nvidia1"),)),
    ]


def test_a_gpu_whose_information_cannot_be_read_is_refused_not_left_out(host: cdi.Host) -> None:
    info = Path(host.proc_gpus) / "0000:1b:00.0" / "information"
    text = info.read_text()
    info.write_text(text + "x" * (cdi.MAX_GPU_INFORMATION - len(text)))  # 64 KiB: read
    assert cdi.generate(host).names()[:2] == ["0", "GPU-aaaa1111"]
    assert cdi.MAX_GPU_INFORMATION == 64 << 10
    info.write_text(text + "x" * (cdi.MAX_GPU_INFORMATION + 1 - len(text)))
    with pytest.raises(cdi.CdiError) as e:
        cdi.for_request(parse("1"), dirs=(), host=host)
    assert f"{info}: cannot read this GPU's information" in str(e.value)
    assert "nvidia-ctk cdi generate" in (e.value.hint or "")


def test_the_spec_environment_is_applied_but_the_runtime_hooks_own_variable(tmp_path: Path) -> None:
    env = ["MY_MODE=none", "ZZ_MODE=void", "NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_DRIVER_CAPABILITIES=all"]
    spec = cdi.Spec("env.yaml", (("0", cdi.Edits()),), cdi.Edits(env=(*env, "JUST_A_NAME", "=x")))
    inj = cdi.inject(spec, parse("all"))
    assert dict(inj.env) == {"MY_MODE": "none", "ZZ_MODE": "void", "NVIDIA_DRIVER_CAPABILITIES": "all"}
    assert [n for n in inj.not_applied if n.startswith("env ")] == [
        "env NVIDIA_VISIBLE_DEVICES=void: for the NVIDIA container runtime's hook, which does not run here"
    ]


def nvidia_ctk_spec(host: cdi.Host, lib: Path) -> str:
    """A spec as `nvidia-ctk cdi generate` writes it: versioned files, links made by a hook."""
    return textwrap.dedent(
        f"""\
        cdiVersion: 0.5.0
        kind: nvidia.com/gpu
        devices:
        - name: "0"
          containerEdits:
            deviceNodes:
            - path: /dev/nvidia1
              hostPath: {host.dev}/nvidia1
        - name: "1"
          containerEdits:
            deviceNodes:
            - path: /dev/nvidia0
              hostPath: {host.dev}/nvidia0
        - name: all
          containerEdits:
            deviceNodes:
            - {{path: /dev/nvidia0, hostPath: {host.dev}/nvidia0}}
            - {{path: /dev/nvidia1, hostPath: {host.dev}/nvidia1}}
        containerEdits:
          env: [NVIDIA_VISIBLE_DEVICES=void]
          deviceNodes:
          - {{path: /dev/nvidiactl, hostPath: {host.dev}/nvidiactl}}
          hooks:
          - hookName: createContainer
            path: /usr/bin/nvidia-ctk
            args: [nvidia-ctk, hook, create-symlinks, --link, libcuda.so.{DRIVER}::/usr/lib/x86_64-linux-gnu/libcuda.so.1,
                   --link, libgone.so.{DRIVER}::/usr/lib/x86_64-linux-gnu/libgone.so.1]
          - hookName: createContainer
            path: /usr/bin/nvidia-ctk
            args: [nvidia-ctk, hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]
          mounts:
          - {{hostPath: {lib}/libcuda.so.{DRIVER}, containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{DRIVER}, options: [ro, nosuid, nodev, bind]}}
          - {{hostPath: {lib}/libcuda.so.{DRIVER}, containerPath: /lib/firmware/nvidia/{DRIVER}/gsp.bin, options: [ro]}}
        """
    )


def test_a_spec_file_is_read_and_applied_in_cdi_order(host: cdi.Host, tmp_path: Path) -> None:
    etc, run = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    etc.mkdir()
    run.mkdir()
    (etc / "a-other.yaml").write_text("cdiVersion: 0.5.0\nkind: vendor.com/fpga\ndevices: []\n")
    (etc / "nvidia.yaml").write_text(nvidia_ctk_spec(host, tmp_path / "driver-lib"))
    (run / "nvidia.json").write_text(json.dumps({"kind": "nvidia.com/gpu", "devices": [{"name": "9"}]}))
    inj = cdi.for_request(parse("device=0"), dirs=(str(etc), str(run)), host=host)
    assert inj.source == str(etc / "nvidia.yaml")
    assert inj.devices == ("0",) and nodes(inj) == ["/dev/nvidia1", "/dev/nvidiactl"]
    assert inj.binds == (
        (str(tmp_path / "driver-lib" / f"libcuda.so.{DRIVER}"), f"/nvidia-driver/lib/libcuda.so.{DRIVER}"),
    )
    assert inj.links == ((f"libcuda.so.{DRIVER}", "/nvidia-driver/lib/libcuda.so.1"),)
    said = "\n".join(inj.not_applied)
    assert "gsp.bin: not a library or program" in said and "libgone.so.1" in said
    assert (
        "hook createContainer: nvidia-ctk hook update-ldcache --folder /usr/lib/x86_64-linux-gnu: not run"
        in said
    )
    assert nodes(cdi.for_request(parse("all"), dirs=(str(etc),), host=host)) == [
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidiactl",
    ]
    # No spec at all: generated from the host.
    assert cdi.for_request(parse("all"), dirs=(str(tmp_path / "none"),), host=host).source.startswith(
        "generated"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: nvidia.com/gpu\ndevices: [{name: '0', containerEdits: {deviceNodes: [{path: /etc/shadow}]}}]\n", "device node '/etc/shadow' is not under /dev"),
        ("kind: nvidia.com/gpu\ndevices: [{name: '0', containerEdits: {deviceNodes: [{path: /dev/../etc/x}]}}]\n", "is not under /dev"),
        ("kind: nvidia.com/gpu\ndevices: [{name: '0', containerEdits: {deviceNodes: [{path: /dev/./nvidia0}]}}]\n", "device node '/dev/./nvidia0' is not under /dev"),
        ("kind: nvidia.com/gpu\ndevices: [{name: '0', containerEdits: {deviceNodes: [{path: /dev/nvidia0/}]}}]\n", "device node '/dev/nvidia0/' is not under /dev"),
        ("kind: nvidia.com/gpu\ndevices: [{name: '0', containerEdits: {deviceNodes: [{path: /dev/nvidia9}]}}]\n", "/dev/nvidia9 is not a character device on this host"),
        ("kind: nvidia.com/gpu\ndevices: [{name: '0'}]\ncontainerEdits: {mounts: [{hostPath: /nonexistent/libcuda.so.1, containerPath: /usr/lib/libcuda.so.1}]}\n", "/nonexistent/libcuda.so.1 is not a file on this host"),
        ("kind: nvidia.com/gpu\ndevices: [{containerEdits: {}}]\n", "a device without a name"),
        ("kind: nvidia.com/gpu\ndevices: [{name: '0'}\n", "not YAML or JSON"),
        # A few KiB of aliases would be millions of mounts to walk.
        ("kind: nvidia.com/gpu\nx: &m [{hostPath: /a.so, containerPath: /a.so}]\ny: &l [*m, *m, *m, *m]\ndevices: [{name: '0', containerEdits: {mounts: *l}}]\n", "a YAML alias (*m); a CDI spec is plain data"),
        ("kind: nvidia.com/gpu\nenv: [" + "a, " * 200_000 + "]\n", "more than 200000 YAML nodes"),
    ],
)  # fmt: skip
def test_a_bad_spec_is_refused_naming_the_file(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "nvidia.yaml").write_text(text)
    with pytest.raises(cdi.CdiError) as e:
        cdi.for_request(parse("all"), dirs=(str(tmp_path),))
    assert str(tmp_path / "nvidia.yaml") in str(e.value) and message in str(e.value)
    assert "nvidia-ctk cdi generate" in (e.value.hint or "")


INSIDE = textwrap.dedent(
    """
    import errno, json, os, subprocess
    def writable(path):
        try:
            open(path, "ab").close()
            return True
        except OSError as e:
            return errno.errorcode[e.errno]
    mounts = [line.split()[4] for line in open("/proc/self/mountinfo")]
    lib = "/nvidia-driver/lib"
    print(json.dumps({
        "dev": sorted(n for n in os.listdir("/dev") if n.startswith("nvidia")),
        "caps": sorted(os.listdir("/dev/nvidia-caps")) if os.path.isdir("/dev/nvidia-caps") else None,
        "chr": all(os.path.exists(p) for p in ["/dev/nvidiactl"]),
        "lib": {n: os.readlink(os.path.join(lib, n)) if os.path.islink(os.path.join(lib, n))
                else open(os.path.join(lib, n), "rb").read(4).hex() for n in sorted(os.listdir(lib))},
        "bin": sorted(os.listdir("/nvidia-driver/bin")),
        "smi": subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout.strip(),
        "write_lib": writable(lib + "/libcuda.so.1"),
        "write_root": writable("/new-file"),
        "write_driver_dir": writable("/nvidia-driver/new-file"),
        "write_tmp": writable("/tmp/x"),
        "mounts": mounts,
        "env": {k: os.environ.get(k) for k in ("LD_LIBRARY_PATH", "PATH", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")},
    }))
    """
)


def test_the_sandbox_gets_exactly_the_injection_read_only(
    exported: Callable[[str], PreparedRoot], host: cdi.Host
) -> None:
    root = exported("python")
    inj = cdi.inject(cdi.generate(host), parse("device=1"))  # index 1: /dev/nvidia0
    config = bwrap.ImageConfig.from_config(root.config)
    with seccomp.program_fd() as fd:
        sandbox = bwrap.Sandbox(root.path, config, extra_env={"TMPDIR": "/tmp"}, gpus=inj)
        argv, _ = sandbox.argv(bwrap.check_host(), ["python3", "-c", INSIDE], fd)
        done = bwrap.run(argv, stdin=b"", deadline_s=60, pass_fds=(fd,))
    assert done.exit_code == 0, done.stderr.decode()
    seen = json.loads(done.stdout)
    assert seen["dev"] == ["nvidia-caps", "nvidia-uvm", "nvidia0", "nvidiactl"]  # not nvidia1
    assert seen["caps"] == ["nvidia-cap1"]
    assert seen["lib"] == {
        n: "7f454c46" for n in ("libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1")
    }
    assert seen["bin"] == ["nvidia-smi"] and seen["smi"] == "fake nvidia-smi"
    assert seen["write_lib"] == seen["write_root"] == seen["write_driver_dir"] == "EROFS"
    assert seen["write_tmp"] is True
    image_path = dict(e.split("=", 1) for e in config.env)["PATH"]
    assert seen["env"] == {
        "LD_LIBRARY_PATH": "/nvidia-driver/lib",
        "PATH": image_path + ":/nvidia-driver/bin",
        "NVIDIA_VISIBLE_DEVICES": None,  # the probes read void as GPUs hidden
        "CUDA_VISIBLE_DEVICES": None,
    }
    # Every mount is the image's (its top-level entries), the sandbox's own (/proc, /dev and its
    # basic nodes, /tmp), or one the injection names: no other host path.
    top = {"/" + n for n in os.listdir(root.path)}
    own = {"/", "/proc", "/dev", "/tmp", "/dev/pts", "/dev/shm"}
    basic = {f"/dev/{n}" for n in ("null", "zero", "full", "random", "urandom", "tty", "ptmx", "console")}
    injected = {p for _, p in inj.device_nodes} | {p for _, p in inj.binds}
    extra = [
        m for m in seen["mounts"] if m not in top | own | basic | injected and not m.startswith("/proc/")
    ]
    assert extra == []
    assert injected <= set(seen["mounts"])


def test_without_gpus_the_sandbox_has_no_driver_folder(exported: Callable[[str], PreparedRoot]) -> None:
    root = exported("python")
    code = "import os; print(sorted(n for n in os.listdir('/dev') if 'nvidia' in n), os.path.exists('/nvidia-driver'))"
    with seccomp.program_fd() as fd:
        argv, _ = bwrap.Sandbox(root.path, bwrap.ImageConfig.from_config(root.config)).argv(
            bwrap.check_host(), ["python3", "-c", code], fd
        )
        done = bwrap.run(argv, stdin=b"", deadline_s=60, pass_fds=(fd,))
    assert done.stdout.decode().strip() == "[] False"


def test_a_spec_of_many_devices_is_applied_whole_and_every_host_path_is_listed(tmp_path: Path) -> None:
    # 5 000 GPUs, one named by 5 000 digits (more than int() takes), each with its own library
    # and variable: `--gpus all` takes every one; the injection's facts (the run's evidence) name
    # every host file bound and every variable set.
    libs = tmp_path / "libs"
    libs.mkdir()
    names = [str(n) for n in range(4_999)] + ["9" * 5000]
    for n in range(3):
        (libs / f"lib{n}.so").write_bytes(b"\x7fELF")
    devices = [
        {
            "name": name,
            "containerEdits": {
                "mounts": [
                    {"hostPath": str(libs / f"lib{i % 3}.so"), "containerPath": f"/usr/lib/lib{i % 3}.so"}
                ],
                "env": [f"GPU_{i}=x", "LD_PRELOAD=/usr/lib/lib2.so"] if i < 2 else [],
            },
        }
        for i, name in enumerate(names)
    ]
    (tmp_path / "nvidia.json").write_text(json.dumps({"kind": "nvidia.com/gpu", "devices": devices}))
    inj = cdi.for_request(parse("all"), dirs=(str(tmp_path),))
    assert inj.devices == tuple(names)
    facts = inj.facts()
    assert sorted(b["host"] for b in facts["read_only"]) == [str(libs / f"lib{n}.so") for n in range(3)]
    assert {"GPU_0=x", "GPU_1=x", "LD_PRELOAD=/usr/lib/lib2.so"} <= set(facts["env"])


# A CPU stage and a GPU stage that checks something trivial: on the fake host's GPU it can pass.
LEVELS_PIPELINE = """\
apiVersion: imagegate/v1
name: gpu-level
stages:
  - id: find_spec
    probe: find_spec
    with:
      modules: [json]
  - id: on_gpu
    probe: find_spec
    requires: [gpu]
    with:
      modules: [os]
"""


def _accepted(driver: RootfsDriver, tmp_path: Path) -> dict[str, Any]:
    """A whole run of LEVELS_PIPELINE on `driver`, concluded as `run` concludes it: the statement."""
    from imagegate.usecases import accept, runner

    tmp_path.mkdir()
    pipe = tmp_path / "levels.yaml"
    pipe.write_text(LEVELS_PIPELINE)
    opts = runner.RunOptions(pipeline=str(pipe), out=tmp_path / "out")
    prep = runner.prepare(opts)
    with accept.within(prep, None):
        observer = runner.DriverObserver(driver, "imagegate-test/python", opts)
        done = accept.accept(accept.Request(prep, observer, opts.out))
    assert done.exit_code == 0, done.record.stages
    return done.statement.to_json()


def test_a_gpu_stage_on_gpus_the_runner_injected_and_saw_earns_the_gpu_level(
    exported: Callable[[str], PreparedRoot], host: cdi.Host, tmp_path: Path
) -> None:
    """The rootfs driver's own fact: the fake host's GPU node (a character device, named so)
    bound into the real sandbox, seen by the runner as bound; the stage counts as run on a GPU
    and the GPU level is reached. The same image without the injection: no GPU, no GPU level."""
    from imagegate.attest.vsa import levels

    root = exported("python")
    inj = cdi.inject(cdi.generate(host), parse("device=1"))  # index 1: /dev/nvidia0
    statement = _accepted(RootfsDriver(lambda _ref: root, gpus=inj), tmp_path / "gpu")
    pred = statement["predicate"]
    assert pred["environment"]["gpus_granted"] == {"via": "cdi", "seen": ["/dev/nvidia0"], "granted": True}
    assert pred["environment"]["gpuGranted"] is True and pred["environment"]["gpuPresent"] is True
    assert [(s["id"], s["status"], s.get("gpuGranted")) for s in pred["stages"]] == [
        ("find_spec", "PASS", True),
        ("on_gpu", "PASS", True),
    ]
    assert levels(statement) == ["IMAGEGATE_CPU", "IMAGEGATE_GPU"]
    plain = _accepted(RootfsDriver(lambda _ref: root), tmp_path / "plain")["predicate"]
    assert plain["environment"]["gpuGranted"] is False
    assert [(s["id"], s["status"], s.get("gpuGranted")) for s in plain["stages"]] == [
        ("find_spec", "PASS", None),
        ("on_gpu", "DEFERRED", None),
    ]
    assert levels({"predicate": plain}) == ["IMAGEGATE_CPU"]


def test_only_a_gpus_node_that_is_a_character_device_now_is_seen(tmp_path: Path) -> None:
    from imagegate.domain.gpus import nodes_grant

    (tmp_path / "nvidia0").symlink_to("/dev/null")
    (tmp_path / "nvidia1").write_text("")  # a planted file is no device
    grant = nodes_grant(
        "cdi",
        [
            (str(tmp_path / "nvidia0"), "/dev/nvidia0"),
            (str(tmp_path / "nvidia1"), "/dev/nvidia1"),
            (str(tmp_path / "gone"), "/dev/nvidia2"),
            ("/dev/null", "/dev/nvidiactl"),  # a control node: no GPU by itself
        ],
    )
    assert (grant.seen, grant.granted) == (("/dev/nvidia0",), True)
    assert grant.to_json() == {"via": "cdi", "seen": ["/dev/nvidia0"], "granted": True}
    two = nodes_grant(
        "cdi", [(str(tmp_path / "nvidia0"), "/dev/nvidia9"), (str(tmp_path / "nvidia0"), "/dev/nvidia0")]
    )
    assert two.seen == ("/dev/nvidia0", "/dev/nvidia9")  # sorted: the same fact however listed
    assert not nodes_grant("host_devices", [("/dev/null", "/dev/nvidia-uvm")]).granted
