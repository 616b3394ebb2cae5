"""GPU acceptance on real hardware through an OCI image's own torch, with no container engine and
no network, as a GPU node with nothing installed would do it:

  (0) an OCI image built here from this machine's own Python and torch (scripts/host-image.py);
  (a) imagegate run oci:IMAGE -p gpu --driver rootfs --gpus all      the node check, the image's torch
  (b) imagegate run oci:IMAGE -p torch-gpu --driver rootfs           GPUs hidden: ..._DEFERRED
      imagegate complete ATTEMPT --driver rootfs --gpus all          -> PASS, linked to (b)
      imagegate verify COMPLETION                                    the chain
  (c) a plain-torch baseline of the same figures, on this machine's python, in the same run;
  (d) --driver docker --gpus all where an engine with a GPU runtime answers (else said so);
  (e) the GPU taken by another process (plain torch on this machine: computing, then holding most
      of the memory idle): the node check must end ERROR naming GPU 0 in use, before any figure.
  (f) those attempts as a fleet's nodes: each node's statement signed as `fleet run --key` signs it,
      then `fleet report --key`: the idle GPU alone fit (exit 0), each busy one alone unfit (exit 1),
      every statement verified; the three together refused, each for the GPU UUID the others name
      too (one machine's attempts given as three nodes).

Writes DATE-HHMM-gpu-rootfs-KIND.json (the summary: every figure beside its baseline and the
physical limit, the goals) and .log into RECORDS (default benchmarks/records), and the evidence
(every attempt folder) into OUT. Exits 1 when a goal is missed (a figure off its baseline by more
than 10 %, the chain not PASS), 3 when it could not run.

Environment: KIND (the machine kind, for the record), NOT_LENT (kinds asked for and not lent, for
the record), COMMIT (else `git rev-parse`), RECORDS, OUT_DIR,
CDI_SPEC (a path under /etc/cdi: a spec of this host written there first, as nvidia-ctk would),
GPUS (default all), MEMORY (the sandbox's data limit per process, default 64g), SITE (where the
carried .whl/ wheels are installed, default /tmp/site), BWRAP_DEB / SECCOMP_DEB (Debian packages
unpacked when bwrap or libseccomp is missing).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOLERANCE = 0.10
# The other tenant's share of GPU 0's memory when it holds it: most of any card, as a job would
# (a fixed size would not fit every card: 100 GiB is more than an 80 GB one has).
HOLD_FRACTION = 0.8
TORCH_GPU = """\
apiVersion: imagegate/v1
name: torch-gpu
description: The image's torch imports, and runs a CUDA kernel where there is a GPU.
stages:
  - id: find_spec
    probe: find_spec
    with:
      modules: [torch, torch.distributed]
  - id: gpu_torch
    probe: cli
    requires: [gpu]
    timeout: 4m
    with:
      command: [python3, -c, "import torch; assert torch.cuda.is_available(), 'CUDA not available'; x = torch.ones(1 << 20, device='cuda', dtype=torch.bfloat16); print('sum', float((x @ x).item()), torch.cuda.get_device_name(0))"]
      stdout_regex: "sum 1048576\\\\.0"
"""


class Log:
    def __init__(self, path: str) -> None:
        self.f = open(path, "w")  # noqa: SIM115 (open for the whole run)

    def say(self, text: str) -> None:
        line = "== %s" % text
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()

    def run(self, argv: list, timeout: float = 600, env: dict | None = None) -> tuple:
        """argv's exit code and seconds; its output into the log."""
        t0 = time.monotonic()
        self.f.write("$ %s\n" % " ".join(argv).replace(ROOT + "/", ""))  # paths in the checkout, relative
        self.f.flush()
        try:
            done = subprocess.run(argv, stdout=self.f, stderr=subprocess.STDOUT, timeout=timeout, env=env)
            rc = done.returncode
        except subprocess.TimeoutExpired:
            rc = 124
        except OSError as e:
            self.f.write("cannot run: %s\n" % e)
            rc = 127
        seconds = round(time.monotonic() - t0, 1)
        self.say("exit %s in %.1fs: %s" % (rc, seconds, " ".join(argv[:6]).replace(ROOT + "/", "")))
        return rc, seconds


def setup(log: Log, site: str) -> dict:
    """The carried wheels, bubblewrap and libseccomp where missing; what was done."""
    done: dict = {}
    wheels = sorted(glob.glob(os.path.join(ROOT, ".whl", "*.whl")))
    if wheels:
        rc, _ = log.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                         "--no-cache-dir", "--upgrade", "--target", site, *wheels])  # fmt: skip
        done["wheels"] = [os.path.basename(w) for w in wheels]
        if rc:
            raise SystemExit(3)
    for tool, var, package in (
        ("bwrap", "BWRAP_DEB", "bubblewrap"),
        ("seccomp", "SECCOMP_DEB", "libseccomp2"),
    ):
        have = shutil.which("bwrap") if tool == "bwrap" else _has_seccomp()
        debs = glob.glob(os.path.join(ROOT, ".debs", package + "_*.deb"))
        deb = os.environ.get(var) or (debs[0] if debs else None)
        if have or not deb:
            done[tool] = "on this machine" if have else "missing"
            continue
        unpack = tempfile.mkdtemp(prefix="deb-")
        log.run(["dpkg-deb", "-x", deb, unpack])
        if tool == "bwrap":
            os.environ["PATH"] = os.path.join(unpack, "usr", "bin") + ":" + os.environ["PATH"]
        else:  # the loader must find it by name (ctypes.util.find_library reads the loader cache)
            for lib in glob.glob(os.path.join(unpack, "usr", "lib", "*", "libseccomp.so*")):
                shutil.copy2(lib, "/usr/local/lib/", follow_symlinks=False)
            log.run(["ldconfig"])
        done[tool] = "unpacked from " + os.path.basename(deb)
    return done


def _has_seccomp() -> bool:
    import ctypes.util

    return ctypes.util.find_library("seccomp") is not None


def write_cdi_spec(path: str) -> None:
    """A spec of this host's GPUs in the form `nvidia-ctk cdi generate` writes (the driver's files
    at their own paths under their versioned names, the sonames made by a create-symlinks hook,
    an update-ldcache hook), for a run that reads a spec file rather than deriving the set."""
    from imagegate.drivers import cdi

    spec = cdi.generate()
    mounts, links, folders = [], [], []
    for host, where in spec.common.mounts:
        real = os.path.realpath(host)
        if where.startswith(cdi.LIB_DIR + "/"):
            link = os.path.join(os.path.dirname(real), os.path.basename(where))
            if link != real:
                links += ["--link", "%s::%s" % (os.path.basename(real), link)]
            folders.append(os.path.dirname(real))
        else:
            real = host
        mounts.append({"hostPath": real, "containerPath": real, "options": ["ro", "nosuid", "nodev", "bind"]})

    def nodes(edits: cdi.Edits) -> list:
        return [{"path": p, "hostPath": h} for h, p in edits.device_nodes]

    ctk = {"hookName": "createContainer", "path": "/usr/bin/nvidia-ctk"}
    hooks = [{**ctk, "args": ["nvidia-ctk", "hook", "create-symlinks", *links]}]
    for folder in sorted(set(folders)):
        hooks.append({**ctk, "args": ["nvidia-ctk", "hook", "update-ldcache", "--folder", folder]})
    doc = {
        "cdiVersion": "0.5.0",
        "kind": cdi.KIND,
        "devices": [{"name": n, "containerEdits": {"deviceNodes": nodes(e)}} for n, e in spec.devices],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": nodes(spec.common),
            "mounts": mounts,
            "hooks": hooks,
        },
    }
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def latest(runs: str) -> str | None:
    found = sorted(glob.glob(os.path.join(runs, "*", "*", "statement.json")), key=os.path.getmtime)
    return os.path.dirname(found[-1]) if found else None


def predicate(attempt: str | None) -> dict:
    try:
        with open(os.path.join(attempt or "", "statement.json")) as f:
            return json.load(f)["predicate"]
    except (OSError, ValueError, KeyError):
        return {}


def node_data(pred: dict) -> dict:
    for s in pred.get("stages", []):
        if s.get("id") == "node_check":
            return {"status": s.get("status"), "detail": s.get("detail"), **(s.get("facts") or {})}
    return {}


BASELINE = r"""
import json, os, sys, tempfile, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

GIB, SUSTAIN = 1 << 30, float(sys.argv[1])


def events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def timed(fn, iters):
    fn()
    torch.cuda.synchronize()
    s, e = events()
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / 1000.0


def per_gpu(i):
    torch.cuda.set_device(i)
    n = 8192
    a = torch.randn(n, n, device=i, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=i, dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    flop = 2 * n * n * n
    out = {"index": i, "name": torch.cuda.get_device_name(i), "tflops": flop * 20 / timed(lambda: a @ b, 20) / 1e12}
    rates, t0 = [], time.monotonic()
    while time.monotonic() - t0 < SUSTAIN:
        rates.append((time.monotonic() - t0, flop * 36 / timed(lambda: a @ b, 36) / 1e12))
    end = rates[-1][0]
    last = [r for t, r in rates if t >= end - 1.0]
    out["sustained_last_second_tflops"] = sum(last) / len(last)
    x = torch.empty(GIB, dtype=torch.uint8, device=i)
    y = torch.empty(GIB, dtype=torch.uint8, device=i)
    h = torch.empty(GIB, dtype=torch.uint8, pin_memory=True)
    out["hbm_copy_gbps"] = 2 * GIB * 10 / timed(lambda: y.copy_(x), 10) / 1e9
    out["h2d_gbps"] = GIB * 10 / timed(lambda: x.copy_(h, non_blocking=True), 10) / 1e9
    out["d2h_gbps"] = GIB * 10 / timed(lambda: h.copy_(x, non_blocking=True), 10) / 1e9
    return out


def p2p(n):
    pairs = []
    for i in range(n):
        for j in range(n):
            if i != j:
                torch.cuda.set_device(i)
                src = torch.empty(GIB, dtype=torch.uint8, device=i)
                dst = torch.empty(GIB, dtype=torch.uint8, device=j)
                pairs.append({"src": i, "dst": j, "gbps": GIB * 10 / timed(lambda: dst.copy_(src, non_blocking=True), 10) / 1e9})
    return pairs


def ranker(rank, world, rdv, q):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="file://" + rdv, rank=rank, world_size=world)
    x = torch.ones(GIB // 4, device="cuda")
    for _ in range(5):
        dist.all_reduce(x)
    dist.barrier()
    sec = timed(lambda: dist.all_reduce(x), 20) / 20
    q.put({"rank": rank, "busbw_gbps": GIB / sec / 1e9 * 2 * (world - 1) / world})
    dist.destroy_process_group()


if __name__ == "__main__":
    n = torch.cuda.device_count()
    out = {"torch": torch.__version__, "gpus": [per_gpu(i) for i in range(n)]}
    if n >= 2:
        out["p2p"] = p2p(n)
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        rdv = os.path.join(tempfile.mkdtemp(), "rdv")
        procs = [ctx.Process(target=ranker, args=(r, n, rdv, q)) for r in range(n)]
        for p in procs:
            p.start()
        out["allreduce"] = sorted((q.get(timeout=300) for _ in range(n)), key=lambda r: r["rank"])
        for p in procs:
            p.join(60)
    print(json.dumps(out))
"""


def compare(node: dict, base: dict) -> dict:
    """Each node-check figure beside its baseline and the limit of the GPU's own model (the node
    check's table, by the name torch reported here; none for a model it lacks); the ratio and the
    goal."""
    from probes.gpu_preflight import limits_for

    rows: dict = {}

    def put(name: str, got, want, limit) -> None:
        if got is None or not want:
            rows[name] = {"node_check": got, "baseline": want, "goal": "NOT RUN"}
            return
        ratio = got / want
        rows[name] = {
            "node_check": round(got, 2),
            "baseline": round(want, 2),
            "ratio": round(ratio, 4),
            "fraction_of_limit": round(got / limit, 4) if limit else None,
            "goal": "PASS" if abs(ratio - 1) <= TOLERANCE else "FAIL",
        }

    mm = {g["index"]: g for g in (node.get("matmul") or {}).get("gpus") or []}
    bw = {g["index"]: g for g in (node.get("bandwidth") or {}).get("gpus") or []}
    gpus = base.get("gpus") or []
    for b in gpus:
        i, m, w, lim = b["index"], mm.get(b["index"], {}), bw.get(b["index"], {}), limits_for(b["name"])
        put("gpu%d_bf16_tflops" % i, m.get("tflops"), b["tflops"], lim.get("bf16_tflops"))
        held = (m.get("sustained") or {}).get("last_second_tflops")
        put(
            "gpu%d_bf16_sustained_tflops" % i, held, b["sustained_last_second_tflops"], lim.get("bf16_tflops")
        )
        put("gpu%d_hbm_copy_gbps" % i, w.get("hbm_copy_gbps"), b["hbm_copy_gbps"], lim.get("hbm_gbps"))
        put("gpu%d_h2d_gbps" % i, w.get("h2d_gbps"), b["h2d_gbps"], lim.get("pcie_gbps"))
        put("gpu%d_d2h_gbps" % i, w.get("d2h_gbps"), b["d2h_gbps"], lim.get("pcie_gbps"))
    nvlink = limits_for(gpus[0]["name"]).get("nvlink_gbps") if gpus else None
    if base.get("p2p"):
        got = [p["gbps"] for p in (node.get("bandwidth") or {}).get("p2p") or [] if p.get("gbps")]
        put(
            "p2p_slowest_gbps",
            min(got) if got else None,
            min(p["gbps"] for p in base["p2p"]),
            nvlink,
        )
    if base.get("allreduce"):
        ranks = (node.get("allreduce") or {}).get("ranks") or []
        got = min((r.get("busbw_gbps") or 0 for r in ranks), default=None)
        put(
            "allreduce_busbw_slowest_gbps",
            got,
            min(r["busbw_gbps"] for r in base["allreduce"]),
            nvlink,
        )
    return rows


# Another tenant of the GPU: "compute" runs bf16 matmuls without end, "hold" takes HOLD_FRACTION
# of the card's memory and sleeps. It prints "ready" (and what it holds) once it is on the GPU.
OTHER_TENANT = r"""
import sys, time
import torch
what = sys.argv[1]
if what == "compute":
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    print("ready", flush=True)
    while True:
        for _ in range(50):
            a @ a
        torch.cuda.synchronize()
else:
    size = int(float(sys.argv[2]) * torch.cuda.get_device_properties(0).total_memory)
    held = torch.empty(size, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print("ready, holding %d of %d bytes" % (size, torch.cuda.get_device_properties(0).total_memory), flush=True)
    time.sleep(3600)
"""


def busy_gpu(log: Log, ig: list, ref: str, rootfs: list, work: str) -> dict:
    """(e) The node check on GPU 0 while another process uses it: ERROR naming the cause, with no
    figure measured (no matmul, no bandwidth in the evidence)."""
    script = os.path.join(work, "other_tenant.py")
    with open(script, "w") as f:
        f.write(OTHER_TENANT)
    out: dict = {}
    for what in ("compute", "hold"):
        own = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        own["CUDA_VISIBLE_DEVICES"] = "0"
        argv = [sys.executable, script, what, str(HOLD_FRACTION)]
        other = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=own)
        try:
            ready = other.stdout.readline().strip() if other.stdout else ""
            time.sleep(2)  # its load shows in nvidia-smi's utilization
            runs = os.path.join(work, "busy-" + what)
            rc, sec = log.run([*ig, "run", ref, "-p", "gpu", *rootfs, "--gpus", "device=0", "-o", runs])
        finally:
            other.kill()
            other.wait()
        node = node_data(predicate(latest(runs)))
        out[what] = {"attempt": latest(runs), "other_process": ready, "exit": rc, "seconds": sec, "verdict": predicate(latest(runs)).get("verdict"),
                     "detail": node.get("detail"), "figures_measured": [k for k in ("matmul", "bandwidth", "allreduce") if node.get(k)],
                     "load_before": (node.get("host") or {}).get("load_before")}  # fmt: skip
        log.say("busy (%s): %s %s" % (what, out[what]["verdict"], out[what]["detail"]))
    return out


def fleet_of(log: Log, ig: list, work: str, idle: str | None, busy: dict) -> dict:
    """(f) These attempts as a fleet's nodes: each node's statement signed as `fleet run --key` signs
    it (nodecheck.sign_attempt), then `fleet report --key`: the idle GPU alone fit (exit 0), each
    busy one alone unfit (exit 1), every statement verified; the three together, one GPU named by
    three nodes, each refused for it (exit 1)."""
    from imagegate.attest import keys
    from imagegate.fleet import node_statement as nodecheck
    from imagegate.report.load import read_attempt

    key = keys.load_signing_key(Path(work) / "key.key")
    nodes = {"node-idle": idle, **{"node-busy-" + w: b.get("attempt") for w, b in busy.items()}}
    out: dict = {"statements": {}}
    for node, attempt in nodes.items():
        signed = nodecheck.sign_attempt(node, read_attempt(Path(attempt)).record, key) if attempt else None
        if signed:
            st = nodecheck.verify_node(signed.read_bytes(), key.public)
            out["statements"][node] = {"subject": [x["name"] for x in st["subject"]],
                                       "verdict": st["predicate"]["verdict"], "figures": st["predicate"]["figures"]}  # fmt: skip
    alone = [(n.replace("node-", "") + "_alone", [n]) for n in nodes]
    for name, chosen in (*alone, ("together", list(nodes))):
        argv = [*ig, "fleet", "report", *("%s=%s" % (n, nodes[n]) for n in chosen),
                "--key", os.path.join(work, "key.pub"), "--format", "json"]  # fmt: skip
        p = subprocess.run(argv, capture_output=True, text=True)
        log.f.write("$ %s\n%s%s== exit %d\n" % (" ".join(argv), p.stdout, p.stderr, p.returncode))
        doc = json.loads(p.stdout) if p.stdout.strip().startswith("{") else {}
        out[name] = {"exit": p.returncode, "nodes": {n["name"]: n["verdict"] for n in doc.get("nodes", [])},
                     "why": {n["name"]: n["why"] for n in doc.get("nodes", [])},
                     "not_verified": doc.get("unverified"), "commands": doc.get("commands")}  # fmt: skip
        log.say("fleet report (%s): exit %d %s" % (name, p.returncode, out[name]["nodes"]))
    return out


def fleet_bound(fleet: dict) -> bool:
    """(f)'s goal: the idle node alone fit (exit 0), each busy one alone unfit (exit 1), every
    statement verified; the three together (one GPU) each refused for the GPU the others name."""
    alone = {"idle_alone": ("fit", 0), "busy-compute_alone": ("unfit", 1), "busy-hold_alone": ("unfit", 1)}
    return all(
        fleet[k]["exit"] == rc
        and list(fleet[k]["nodes"].values()) == [verdict]
        and not fleet[k]["not_verified"]
        for k, (verdict, rc) in alone.items()
    ) and (
        fleet["together"]["exit"] == 1
        and set(fleet["together"]["nodes"].values()) == {"unfit"}
        and all(any("is also on node" in w for w in why) for why in fleet["together"]["why"].values())
    )


def stage_seconds(pred: dict, stage: str) -> float | None:
    return next((s.get("durationSeconds") for s in pred.get("stages", []) if s.get("id") == stage), None)


def docker_gpus(log: Log, ig: list, ref: str, runs: str) -> dict:
    """--driver docker --gpus all, where an engine answers; else why not."""
    if shutil.which("docker") is None:
        return {"run": False, "why": "no container engine on this machine (no docker command)"}
    if subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode:
        return {"run": False, "why": "docker info fails: no engine answers"}
    rc, sec = log.run([*ig, "run", ref, "-p", "gpu", "--gpus", "all", "--no-sign", "-o", runs])
    return {"run": True, "exit": rc, "seconds": sec, "verdict": predicate(latest(runs)).get("verdict")}


def commit() -> str:
    if os.environ.get("COMMIT"):
        return os.environ["COMMIT"]
    try:
        return (
            subprocess.run(
                ["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            or "unknown"
        )
    except OSError:
        return "unknown"


def main() -> int:
    stamp = time.strftime("%Y-%m-%d-%H%M", time.gmtime())
    kind = os.environ.get("KIND", "unknown")
    records = os.environ.get("RECORDS") or os.path.join(ROOT, "benchmarks", "records")
    out = os.environ.get("OUT_DIR") or os.path.join(ROOT, "gpu-acceptance-out")
    os.makedirs(records, exist_ok=True)
    os.makedirs(out, exist_ok=True)
    name = "%s-gpu-rootfs-%s%s" % (stamp, kind, "-cdi-spec" if os.environ.get("CDI_SPEC") else "")
    log = Log(os.path.join(records, name + ".log"))
    site = os.environ.get("SITE", "/tmp/site")
    for k, v in (
        ("NCCL_NVLS_ENABLE", "0"),
        ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
        ("NVSHMEM_DISABLE_NVLS", "1"),
    ):
        os.environ[k] = v  # never NVLink multicast: it can take a shared host's GPUs out of service
    summary: dict = {"date": stamp, "kind": kind, "commit": commit(), "host_python": sys.version.split()[0]}
    # The machine kinds that were asked for and not lent, said in the record (NOT_LENT=a,b).
    summary["kinds_not_lent"] = [k for k in os.environ.get("NOT_LENT", "").split(",") if k]
    summary["setup"] = setup(log, site)
    os.environ["PYTHONPATH"] = os.path.join(ROOT, "src") + ":" + site
    sys.path[:0] = [os.path.join(ROOT, "src"), site, ROOT]  # ROOT: probes/, the node check's limits
    if os.environ.get("CDI_SPEC"):  # a spec file written first, and read by the runs below
        write_cdi_spec(os.environ["CDI_SPEC"])
        summary["cdi_spec_written"] = os.environ["CDI_SPEC"]
    log.run(
        [
            "nvidia-smi",
            "--query-gpu=index,name,memory.total,driver_version,compute_cap",
            "--format=csv,noheader",
        ]
    )
    log.run(["nvidia-smi", "topo", "-m"])
    work = tempfile.mkdtemp(prefix="gpu-acceptance-")
    runs, ig = os.path.join(work, "runs"), [sys.executable, "-m", "imagegate"]
    memory, gpus = os.environ.get("MEMORY", "64g"), os.environ.get("GPUS", "all")
    # (0) the image, from this machine's own python and torch
    t0 = time.monotonic()
    # The machine's own Python as it is: not the carried wheels on PYTHONPATH.
    own = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    built = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "host-image.py"), os.path.join(work, "image"),
                            "--tag", "torch", "--dist", "torch"], capture_output=True, text=True, env=own)  # fmt: skip
    log.f.write(built.stderr)
    if built.returncode:
        log.say("image build failed")
        return 3
    image = json.loads(built.stdout.strip().splitlines()[-1])
    image["build_s"] = round(time.monotonic() - t0, 1)
    image.pop("distributions", None)
    summary["image"] = image
    log.say(
        "image %s: %d bytes, %d files, %.0fs"
        % (image["reference"], image["layer_bytes"], image["files"], image["build_s"])
    )
    ref = image["reference"]
    log.run([*ig, "keygen", "--out", os.path.join(work, "key")])
    os.environ["IMAGEGATE_SIGNING_KEY"] = os.path.join(work, "key.key")
    rootfs = ["--driver", "rootfs", "--memory", memory]
    # (a) the node check through the image's torch
    rc, sec = log.run([*ig, "run", ref, "-p", "gpu", *rootfs, "--gpus", gpus, "-o", runs])
    first_run = latest(runs)
    pa = predicate(first_run)
    node = node_data(pa)
    env = pa.get("environment") or {}
    summary["node_check"] = {"exit": rc, "seconds": sec, "stage_s": stage_seconds(pa, "node_check"),
                             "verdict": pa.get("verdict"), "detail": node.get("detail"),
                             "gpu_injection": env.get("gpu_injection"), "image_source": env.get("image_source")}  # fmt: skip
    # (c) the plain-torch baseline, right after
    with open(os.path.join(work, "baseline.py"), "w") as f:
        f.write(BASELINE)
    t0 = time.monotonic()
    b = subprocess.run(
        [sys.executable, os.path.join(work, "baseline.py"), "3"], capture_output=True, text=True, timeout=600
    )
    log.f.write(b.stderr[-20000:])
    base = json.loads(b.stdout.strip().splitlines()[-1]) if b.returncode == 0 and b.stdout.strip() else {}
    summary["baseline"] = {"exit": b.returncode, "seconds": round(time.monotonic() - t0, 1), **base}
    summary["figures"] = compare(node, base)
    from probes.gpu_preflight import limits_for, model_of

    # Which row of the node check's table each GPU got, by the name torch reported: the record's
    # fractions are of these.
    summary["limits"] = {
        g["name"]: {"model": model_of(g["name"]), **limits_for(g["name"])} for g in base.get("gpus") or []
    }
    # (b) deferred -> complete --driver rootfs -> verify
    with open(os.path.join(work, "torch-gpu.yaml"), "w") as f:
        f.write(TORCH_GPU)
    rc1, s1 = log.run([*ig, "run", ref, "-p", os.path.join(work, "torch-gpu.yaml"), *rootfs, "-o", runs])
    deferred = latest(runs)
    rc2, s2 = log.run([*ig, "complete", deferred or "none", *rootfs, "--gpus", gpus])
    completion = latest(runs)
    rc3, _ = log.run(
        [
            *ig,
            "verify",
            os.path.join(completion or "none", "attestation.dsse.json"),
            "--key",
            os.path.join(work, "key.pub"),
        ]
    )
    pc = predicate(completion)
    summary["chain"] = {
        "deferred": {"exit": rc1, "seconds": s1, "verdict": predicate(deferred).get("verdict")},
        "complete": {
            "exit": rc2,
            "seconds": s2,
            "verdict": pc.get("verdict"),
            "completes": (pc.get("completes") or {}).get("attempt"),
        },
        "verify_exit": rc3,
    }
    summary["docker_gpus"] = docker_gpus(log, ig, ref, os.path.join(work, "docker-runs"))
    summary["busy"] = busy_gpu(log, ig, ref, rootfs, work)
    summary["fleet"] = fleet_of(log, ig, work, first_run, summary["busy"])
    in_use = "node not fit: GPU 0 in use before the check"
    goals = {
        "node_check_pass": pa.get("verdict") == "PASS",
        "figures_within_10_percent": bool(summary["figures"])
        and all(r["goal"] == "PASS" for r in summary["figures"].values()),
        "chain_pass": pc.get("verdict") == "PASS"
        and rc3 == 0
        and predicate(deferred).get("verdict", "").endswith("_DEFERRED"),
        "node_check_within_30_s": (summary["node_check"]["stage_s"] or 1e9) <= 30,
        "fleet_binds_each_attempt_to_its_node": fleet_bound(summary["fleet"]),
        "busy_error_named_before_any_figure": all(
            b["verdict"] == "ERROR" and (b["detail"] or "").startswith(in_use) and not b["figures_measured"]
            for b in summary["busy"].values()
        ),
    }
    summary["goals"] = goals
    with open(os.path.join(records, name + ".json"), "w") as f:
        json.dump(summary, f, indent=1)
    subprocess.run(
        [
            "tar",
            "czf",
            os.path.join(out, "evidence.tar.gz"),
            "-C",
            work,
            "runs",
            "torch-gpu.yaml",
            "baseline.py",
            "key.pub",
        ]
    )
    log.say("goals: %s" % json.dumps(goals))
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
