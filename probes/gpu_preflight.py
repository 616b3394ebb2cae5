"""gpu_preflight: is this GPU node fit, and can the image's torch run kernels on it?

Facts per GPU (name, memory, driver, compute capability) and the image's torch (version, CUDA
runtime, arch list); a BF16 matmul on every GPU (finite, a block equal to a float32 reference,
TFLOP/s timed with CUDA events); with 2 or more GPUs an NCCL all-reduce, one process per GPU,
rendezvous over a file (no network), on values whose sum is known exactly; bus bandwidth as
nccl-tests defines it. Every step runs in a child process bounded by a timeout and killed
whole (gpu_worker.py). The image's torch is imported only in those children.

Before any load, each GPU's memory used and utilization over about a second: a GPU another
process uses is ERROR before any figure (gpu_causes.busy_before). While the pinned copies run, the
PCIe link is read (an idle GPU lowers its generation); NVLink state and errors, Xid events of the
kernel log: each judged with its cause (gpu_causes), and a figure missed is said with the
likeliest cause the facts support.

Statuses: FAIL when the image cannot run kernels here (its arch list does not cover the GPU,
or the driver is older than its CUDA runtime needs) -- the image's fault; ERROR "node not fit:
..." when the node is (a wrong or non-finite result, a threshold missed, a step that hung or
crashed, a GPU in use, a link down) -- never a FAIL of the image. The judgement is in pure
functions below.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from . import capture, gpu_causes, gpu_worker

# CUDA runtime major version -> the oldest Linux driver that runs it (CUDA minor-version
# compatibility; NVIDIA CUDA Toolkit release notes, "CUDA Toolkit and Minimum Required Driver
# Version for CUDA Minor Version Compatibility"; CUDA 11.0 itself shipped with 450.36.06).
MIN_DRIVER_BY_CUDA_MAJOR = {
    11: "450.80.02",
    12: "525.60.13",
    13: "580.65.06",
}
NODE_UNFIT = "node not fit: "
BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from importlib import import_module as m; "
    "sys.exit(m(sys.argv[2] + '.gpu_worker').main(sys.argv[3:]))"
)
NVIDIA_SMI_QUERY = "index,name,memory.total,memory.free,driver_version,compute_cap,uuid"
STEP = re.compile(r"^imagegate-step: (.*)$", re.M)


# ---------------------------------------------------------------- pure judgement (tested in CI)


def version_tuple(v) -> tuple:
    """'580.95.05' -> (580, 95, 5); '12.8' -> (12, 8); None or junk -> ()."""
    parts = []
    for p in str(v or "").strip().split("."):
        m = re.match(r"\d+", p)
        if not m:
            break
        parts.append(int(m.group(0)))
    return tuple(parts)


def arch_coverage(arch_list, capability: str) -> dict:
    """Does torch's arch list run kernels on a device of `capability` ('9.0')? Covered by a
    cubin for exactly this architecture (sm_90; sm_90a runs on 9.0 only, so it counts for 9.0),
    or by PTX (compute_XY) for an architecture not newer than it, which the driver JIT-compiles."""
    cap = version_tuple(capability)
    if len(cap) < 2:
        return {"covered": False, "by": None, "why": "unknown compute capability %r" % (capability,)}
    want = cap[0] * 10 + cap[1]
    sass, ptx = [], []
    for a in arch_list or []:
        m = re.fullmatch(r"(sm|compute)_(\d+)([af]?)", str(a))
        if not m:
            continue
        num = int(m.group(2))
        (sass if m.group(1) == "sm" else ptx).append((num, a))
    exact = [a for num, a in sass if num == want]
    if exact:
        return {"covered": True, "by": exact[0], "why": "cubin for sm_%d" % want}
    lower_ptx = sorted((num, a) for num, a in ptx if num <= want)
    if lower_ptx:
        return {"covered": True, "by": lower_ptx[-1][1], "why": "PTX JIT-compiled by the driver"}
    return {
        "covered": False,
        "by": None,
        "why": "no sm_%d and no compute_XY <= %d in torch's arch list (%s): CUDA kernels fail with "
        "'no kernel image is available for execution on the device'"
        % (want, want, " ".join(arch_list or []) or "empty"),
    }


def min_driver(cuda_runtime) -> str | None:
    v = version_tuple(cuda_runtime)
    return MIN_DRIVER_BY_CUDA_MAJOR.get(v[0]) if v else None


def driver_check(driver, cuda_runtime) -> dict:
    """Is the NVIDIA driver new enough for the image's CUDA runtime (torch.version.cuda)?"""
    need = min_driver(cuda_runtime)
    if not driver or not cuda_runtime:
        return {"ok": None, "why": "driver %s, CUDA runtime %s: not both known" % (driver, cuda_runtime)}
    if need is None:
        return {"ok": None, "why": "CUDA %s: no minimum driver on record" % cuda_runtime}
    ok = version_tuple(driver) >= version_tuple(need)
    why = "driver %s %s CUDA %s runtime's minimum %s" % (
        driver,
        "meets" if ok else "is older than the",
        cuda_runtime,
        need,
    )
    return {"ok": ok, "driver": driver, "cuda_runtime": cuda_runtime, "min_driver": need, "why": why}


def parse_nvidia_smi(text: str) -> list:
    """Rows of `nvidia-smi --query-gpu=NVIDIA_SMI_QUERY --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 6 or not cells[0].isdigit():
            continue
        gpu = {"index": int(cells[0]), "name": cells[1], "driver": cells[4], "capability": cells[5]}
        for key, cell in (("total_memory_bytes", cells[2]), ("free_memory_bytes", cells[3])):
            if cell.isdigit():
                gpu[key] = int(cell) * 1024 * 1024  # nounits: MiB
        if len(cells) > 6:
            gpu["uuid"] = cells[6]
        gpus.append(gpu)
    return gpus


def parse_proc_driver(text: str) -> str | None:
    """The driver version from /proc/driver/nvidia/version ('NVRM version: ... Kernel Module ...
    580.95.05 ...')."""
    m = re.search(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s", text or "")
    return m.group(1) if m else None


# Physical limits a direction, by GPU model, from NVIDIA's datasheets: dense BF16 Tensor Core
# TFLOP/s (half the "with sparsity" figure they print), memory bandwidth, the host link (PCIe x16:
# Gen5 64 GB/s, Gen4 32 GB/s a direction; the datasheets print both directions together) and NVLink.
# NVLink only where every pair of a board's GPUs has it (SXM parts on NVSwitch boards): a PCIe
# card's bridge joins two or four cards and the other pairs copy over PCIe, so a node of them gets
# no peer-copy floor from here (min_p2p_gbps sets one).
# NVLink's limit is every pair's only on 8-GPU boards, where NVSwitch joins them all.
NVSWITCH_GPUS = 8
LIMITS = {
    # H100 datasheet, SXM: BF16 1,979 with sparsity, HBM3 3.35 TB/s, NVLink 900 GB/s, PCIe Gen5
    "H100 SXM": {"bf16_tflops": 989.0, "hbm_gbps": 3350.0, "pcie_gbps": 64.0, "nvlink_gbps": 450.0},
    # H100 datasheet, PCIe: BF16 1,513 with sparsity, HBM2e 2 TB/s, PCIe Gen5 (bridge 600 GB/s)
    "H100 PCIe": {"bf16_tflops": 756.0, "hbm_gbps": 2000.0, "pcie_gbps": 64.0},
    # H100 datasheet, NVL: BF16 1,671 with sparsity, HBM3 3.9 TB/s, PCIe Gen5 (bridge 600 GB/s)
    "H100 NVL": {"bf16_tflops": 835.5, "hbm_gbps": 3900.0, "pcie_gbps": 64.0},
    # H200 datasheet, SXM: BF16 1,979 with sparsity, HBM3e 4.8 TB/s, NVLink 900 GB/s, PCIe Gen5
    "H200": {"bf16_tflops": 989.0, "hbm_gbps": 4800.0, "pcie_gbps": 64.0, "nvlink_gbps": 450.0},
    # H200 datasheet, NVL: BF16 1,671 with sparsity, HBM3e 4.8 TB/s, PCIe Gen5 (bridge 900 GB/s)
    "H200 NVL": {"bf16_tflops": 835.5, "hbm_gbps": 4800.0, "pcie_gbps": 64.0},
    # A100 datasheet (its first edition for the 40GB parts): BF16 624 with sparsity; HBM2e
    # 2,039 GB/s (80GB SXM), 1,935 GB/s (80GB PCIe), HBM2 1,555 GB/s (40GB); NVLink 600 GB/s (SXM;
    # a PCIe card's bridge joins two); PCIe Gen4
    "A100 SXM4 80GB": {"bf16_tflops": 312.0, "hbm_gbps": 2039.0, "pcie_gbps": 32.0, "nvlink_gbps": 300.0},
    "A100 SXM4 40GB": {"bf16_tflops": 312.0, "hbm_gbps": 1555.0, "pcie_gbps": 32.0, "nvlink_gbps": 300.0},
    "A100 PCIe 80GB": {"bf16_tflops": 312.0, "hbm_gbps": 1935.0, "pcie_gbps": 32.0},
    "A100 PCIe 40GB": {"bf16_tflops": 312.0, "hbm_gbps": 1555.0, "pcie_gbps": 32.0},
    # L40S datasheet: BF16 362.05 (733 with sparsity), GDDR6 864 GB/s, PCIe Gen4 x16, no NVLink
    "L40S": {"bf16_tflops": 362.05, "hbm_gbps": 864.0, "pcie_gbps": 32.0},
    # HGX B200 and DGX B200 datasheets, a GPU of eight: FP16/BF16 36 PFLOP/s with sparsity, HBM3e
    # 64 TB/s, NVLink 1.8 TB/s a GPU; the hosts of those boards link each GPU by PCIe Gen5 x16
    "B200": {"bf16_tflops": 2250.0, "hbm_gbps": 8000.0, "pcie_gbps": 64.0, "nvlink_gbps": 900.0},
}
# The model by the words of the name torch.cuda.get_device_name and nvidia-smi report ("NVIDIA H100
# 80GB HBM3" is the SXM part, "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe"): the first entry
# whose words the name all has, a variant before its family ("H200 NVL" before "H200"). Whole
# words, so a GH200 or GB200 (a host link of NVLink-C2C) is neither an H200 nor a B200; a name
# matched by none has no limits.
MODELS = [
    ({"h100", "pcie"}, "H100 PCIe"),
    ({"h100", "nvl"}, "H100 NVL"),
    ({"h100", "80gb", "hbm3"}, "H100 SXM"),
    ({"h100", "sxm5", "80gb"}, "H100 SXM"),
    ({"h200", "nvl"}, "H200 NVL"),
    ({"h200"}, "H200"),
    ({"a100", "pcie", "80gb"}, "A100 PCIe 80GB"),
    ({"a100", "pcie", "40gb"}, "A100 PCIe 40GB"),
    ({"a100", "sxm4", "80gb"}, "A100 SXM4 80GB"),
    ({"a100", "sxm", "80gb"}, "A100 SXM4 80GB"),
    ({"a100", "sxm4", "40gb"}, "A100 SXM4 40GB"),
    ({"l40s"}, "L40S"),
    ({"b200"}, "B200"),
]
# Clock event reasons that are the node's fault; a software power cap under full load is not.
FAULT_REASONS = gpu_causes.FAULT_REASONS
LOAD_SAMPLES = 5  # the load before the check: read this many times, SAMPLE_EVERY_S apart (~1 s)
SAMPLE_EVERY_S = 0.2
DEFAULT_MIN_FRACTION = 0.5  # of the physical limit, for a measured figure without its own threshold


def floor_for(params: dict, name: str, limit) -> float | None:
    """A figure's threshold: its own parameter, else min_fraction_of_limit of the limit (if known)."""
    if params.get(name) is not None:
        return params[name]
    frac = params.get("min_fraction_of_limit")
    return (frac if frac is not None else DEFAULT_MIN_FRACTION) * limit if limit else None


def model_of(name: str) -> str | None:
    """The LIMITS row of a GPU by its reported name, or None for a model not in the table."""
    words = set(re.split(r"[\s_-]+", (name or "").lower()))
    return next((model for need, model in MODELS if need <= words), None)


def limits_for(name: str) -> dict:
    model = model_of(name)
    return LIMITS[model] if model else {}


def floor_of(params: dict, param: str, name: str, limit_key: str) -> tuple:
    """(threshold or None, why) of a figure on the GPU called `name`: `param` when set, else
    min_fraction_of_limit of that model's own limit, `why` then naming the fraction and the model."""
    model = model_of(name)
    limit = limits_for(name).get(limit_key)
    floor = floor_for(params, param, limit)
    if floor is None or params.get(param) is not None:
        return floor, ""
    return floor, " (%g of the %s's %g)" % (floor / limit, model, limit)


def smi_sections(text: str) -> list:
    """`nvidia-smi -q` as one nested dict per GPU: keys by indentation, "Key : Value" leaves."""
    gpus, stack = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, value = (
            (x.strip() for x in line.partition(" : ")) if " : " in line else (line.strip(), "", "")
        )
        if key.startswith("GPU ") and indent == 0:
            stack = [(0, {"bus_id": key[4:]})]
            gpus.append(stack[0][1])
            continue
        if not stack:
            continue
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        if sep:
            stack[-1][1][key] = value
        else:
            node: dict = {}
            stack[-1][1][key] = node
            stack.append((indent, node))
    return gpus


def _get(d: dict, *path: str):
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def _int(v) -> int | None:
    return int(v) if isinstance(v, str) and v.strip().isdigit() else None


def node_facts(text: str) -> list:
    """What fleets gate on, per GPU, from `nvidia-smi -q`: PCIe link, persistence, ECC and its
    uncorrected counts, remapped rows, clock event reasons, power, temperature, processes."""
    out = []
    for g in smi_sections(text):
        ecc = _get(g, "ECC Errors") or {}
        unc = {
            when: sum(_int(v) or 0 for k, v in (_get(ecc, when) or {}).items() if "Uncorrectable" in k)
            for when in ("Volatile", "Aggregate")
        }
        link = _get(g, "PCI", "GPU Link Info") or {}
        reasons = _get(g, "Clocks Event Reasons") or _get(g, "Clocks Throttle Reasons") or {}
        procs = g.get("Processes")
        out.append(
            {
                "bus_id": g.get("bus_id"),
                "name": g.get("Product Name"),
                "persistence_mode": g.get("Persistence Mode"),
                "pcie_generation": {k.lower(): _get(link, "PCIe Generation", k) for k in ("Current", "Max")},
                "pcie_width": {k.lower(): _get(link, "Link Width", k) for k in ("Current", "Max")},
                "ecc_mode": _get(g, "ECC Mode", "Current"),
                "ecc_uncorrected": unc,
                "remapped_rows": {
                    "pending": _get(g, "Remapped Rows", "Pending"),
                    "failure": _get(g, "Remapped Rows", "Remapping Failure Occurred"),
                },
                "event_reasons_active": [k for k, v in reasons.items() if v == "Active"],
                "power_draw": _get(g, "GPU Power Readings", "Instantaneous Power Draw")
                or _get(g, "GPU Power Readings", "Power Draw"),
                "temperature": _get(g, "Temperature", "GPU Current Temp"),
                "processes": procs if isinstance(procs, str) else "listed" if procs else None,
            }
        )
    return out


def node_faults(nodes: list, params: dict) -> list:
    """The node's faults among its facts: uncorrected ECC errors above max_ecc_uncorrected (0), a
    remapping failure or a pending remap (needs a reset), a fault reason slowing the clocks."""
    problems = []
    most = params.get("max_ecc_uncorrected") or 0
    for g in nodes:
        who = "GPU %s" % g.get("bus_id")
        vol = (g.get("ecc_uncorrected") or {}).get("Volatile", 0)
        if vol > most:
            problems.append(
                "%s: %d uncorrected ECC errors since the driver loaded (max_ecc_uncorrected %d)"
                % (who, vol, most)
            )
        rows = g.get("remapped_rows") or {}
        if rows.get("failure") == "Yes":
            problems.append("%s: a row remapping failed" % who)
        if rows.get("pending") == "Yes":
            problems.append("%s: a row remapping is pending (the GPU needs a reset)" % who)
        faults = [r for r in g.get("event_reasons_active") or [] if r in FAULT_REASONS]
        if faults:
            problems.append("%s: clocks slowed by %s" % (who, ", ".join(faults)))
    return problems


def judge_bandwidth(bw: dict, devices: list, params: dict, problems: list, said: list) -> None:
    """HBM, host<->GPU and peer figures against their thresholds (or a fraction of the limit)."""
    if bw.get("error"):
        problems.append(bw["error"])
        return
    names = {d["index"]: d.get("name", "") for d in devices}
    checks = (
        ("hbm_copy_gbps", "min_hbm_gbps", "hbm_gbps", "HBM copy"),
        ("h2d_gbps", "min_h2d_gbps", "pcie_gbps", "host->GPU"),
        ("d2h_gbps", "min_d2h_gbps", "pcie_gbps", "GPU->host"),
    )
    for key, param, limit_key, label in checks:
        rows = [g for g in bw.get("gpus") or [] if g.get(key)]
        if not rows:
            continue
        slow = min(rows, key=lambda g: g[key])
        said.append("%s %.0f GB/s (slowest: GPU %d)" % (label, slow[key], slow["index"]))
        for g in rows:  # each against its own model's floor: a node may mix models
            floor, why = floor_of(params, param, names.get(g["index"], ""), limit_key)
            if floor is not None and g[key] < floor:
                problems.append("GPU %d: %s %.1f GB/s < %g%s" % (g["index"], label, g[key], floor, why))
    pairs = [p for p in bw.get("p2p") or [] if p.get("gbps")]
    if pairs:
        slow = min(pairs, key=lambda p: p["gbps"])
        floor, why = floor_of(params, "min_p2p_gbps", names.get(slow["src"], ""), "nvlink_gbps")
        note = ""
        if why and len(devices) < NVSWITCH_GPUS:
            # A board of fewer GPUs links each pair directly (HGX 4-GPU: a third of the links a
            # pair), so the NVLink limit is no pair's: no default floor, min_p2p_gbps sets one.
            floor, note = None, " (no default floor with %d GPUs; min_p2p_gbps sets one)" % len(devices)
        said.append(
            "peer copies %d pairs, slowest GPU %d->%d %.0f GB/s%s"
            % (len(pairs), slow["src"], slow["dst"], slow["gbps"], note)
        )
        if floor is not None and slow["gbps"] < floor:
            problems.append(
                "GPU %d->%d: peer copy %.1f GB/s < %g%s"
                % (slow["src"], slow["dst"], slow["gbps"], floor, why)
            )


def fractions(data: dict) -> dict:
    """Each measured figure as a fraction of the GPU's physical limit (where the limit is known)."""
    devices = {
        d["index"]: limits_for(d.get("name", "")) for d in (data.get("facts") or {}).get("devices") or []
    }
    out: dict = {}
    for g in (data.get("matmul") or {}).get("gpus") or []:
        lim = devices.get(g["index"], {}).get("bf16_tflops")
        held = g.get("sustained") or {}
        if lim:
            out["gpu%d_bf16" % g["index"]] = {
                k: round(v / lim, 4)
                for k, v in (
                    ("tflops", g.get("tflops")),
                    ("sustained_last_second", held.get("last_second_tflops")),
                )
                if v
            }
    for g in (data.get("bandwidth") or {}).get("gpus") or []:
        lim = devices.get(g["index"], {})
        out["gpu%d_bandwidth" % g["index"]] = {
            k: round(g[k] / lim[lk], 4)
            for k, lk in (("hbm_copy_gbps", "hbm_gbps"), ("h2d_gbps", "pcie_gbps"), ("d2h_gbps", "pcie_gbps"))
            if g.get(k) and lim.get(lk)
        }
    return out


def busbw(nbytes: int, seconds: float, world: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce, GB/s: algbw * 2(n-1)/n (gpu_worker's formulas)."""
    return gpu_worker.busbw(gpu_worker.gbps(nbytes, seconds) or 0.0, world)


def judge(facts: dict, matmul, allreduce, params: dict, bandwidth=None, nodes=None, host=None) -> dict:
    """The stage's status and detail from what was measured. `matmul`/`allreduce`: the worker
    results, or {"error": ...}, or None when not run; `host`: host_facts with the PCIe link read
    under load (pcie_under_load). Image problems FAIL; node problems are ERROR 'node not fit:
    ...', a missed figure followed by its likeliest cause."""
    devices = facts.get("devices") or []
    image_problems = image_fit(facts, devices)
    if image_problems:
        return {"status": "FAIL", "detail": "the image cannot run on this GPU: " + "; ".join(image_problems)}
    if not devices:
        why = facts.get("error") or "no GPU visible to torch"
        return {"status": "ERROR", "detail": why}
    node_problems, said = [], []
    if matmul is not None:
        judge_matmul(matmul, devices, params, node_problems, said)
        judge_sustained(matmul, devices, params, node_problems, said)
    if allreduce is not None:
        judge_allreduce(allreduce, params, node_problems, said)
    if bandwidth is not None:
        judge_bandwidth(bandwidth, devices, params, node_problems, said)
    missed = len(node_problems)
    downgrades = judge_links(host or {}, node_problems, said)
    if nodes:
        node_problems += node_faults(nodes, params)
    cause = gpu_causes.likeliest_cause(nodes or [], downgrades) if missed else ""
    if cause:
        node_problems.insert(missed, cause)
    names = sorted({d["name"] for d in devices})
    head = "%d x %s, torch %s (CUDA %s), driver %s" % (
        len(devices),
        "/".join(names),
        facts.get("torch"),
        facts.get("cuda_runtime"),
        facts.get("driver"),
    )
    if node_problems:
        return {"status": "ERROR", "detail": NODE_UNFIT + "; ".join(node_problems) + " [" + head + "]"}
    return {"status": "PASS", "detail": head + ": " + "; ".join(said)}


def judge_links(host: dict, node_problems: list, said: list) -> list:
    """PCIe below its maximum under load, NVLink links down or recovering, Xid events whose action
    is a reset or a reboot: unfit; an application's Xid, or a log not readable, said. Returns the
    PCIe downgrades (a cause of a missed figure)."""
    downgrades = gpu_causes.link_downgrades((host.get("pcie_under_load") or {}).get("samples") or [])
    node_problems += downgrades
    node_problems += gpu_causes.nvlink_problems(host.get("nvlink") or {})
    if "xid" in host:
        problems, notes = gpu_causes.judge_xids(host["xid"])
        node_problems += problems
        said += notes
    return downgrades


def image_fit(facts: dict, devices: list) -> list:
    """What in the image cannot run on these GPUs (a CPU-only torch, a CUDA runtime newer than
    the driver, no kernels for a device's architecture); each device gets its arch_coverage."""
    problems = []
    if facts.get("torch") and not facts.get("cuda_runtime"):
        problems.append("torch %s is a CPU-only build (torch.version.cuda is None)" % facts["torch"])
    drv = driver_check(facts.get("driver"), facts.get("cuda_runtime"))
    if drv["ok"] is False:
        problems.append(drv["why"])
    for d in devices:
        cov = arch_coverage(facts.get("arch_list"), d.get("capability", ""))
        d["arch_coverage"] = cov
        if not cov["covered"]:
            problems.append(
                "GPU %s (%s, capability %s): %s" % (d["index"], d["name"], d["capability"], cov["why"])
            )
    return problems


def judge_matmul(matmul: dict, devices: list, params: dict, node_problems: list, said: list) -> None:
    """Each GPU's bf16 matmul: finite, equal to the float32 reference, and its TFLOP/s against
    min_tflops, else a fraction of its own model's limit."""
    if matmul.get("error"):
        node_problems.append(matmul["error"])
        return
    gpus = matmul.get("gpus") or []
    for g in gpus:
        if not g.get("finite"):
            node_problems.append("GPU %s: the bf16 matmul result is not finite" % g["index"])
        elif not (g.get("relative_error", 1) <= g.get("tolerance", 0)):
            node_problems.append(
                "GPU %s: bf16 matmul differs from the float32 reference by %.3g (relative; tolerance %g)"
                % (g["index"], g.get("relative_error"), g.get("tolerance"))
            )
    timed = [g for g in gpus if g.get("tflops")]
    if not timed:
        return
    slow = min(timed, key=lambda g: g["tflops"])
    said.append(
        "bf16 %d^3 matmul %s TFLOP/s (slowest: GPU %d, %.1f)"
        % (slow["size"], "/".join("%.1f" % g["tflops"] for g in timed), slow["index"], slow["tflops"])
    )
    names = {d["index"]: d.get("name", "") for d in devices}
    for g in timed:
        floor, why = floor_of(params, "min_tflops", names.get(g["index"], ""), "bf16_tflops")
        if floor is not None and g["tflops"] < floor:
            said_floor = "%g%s" % (floor, why) if why else "min_tflops %g" % floor
            node_problems.append("GPU %d: %.1f TFLOP/s < %s" % (g["index"], g["tflops"], said_floor))


def judge_sustained(matmul: dict, devices: list, params: dict, node_problems: list, said: list) -> None:
    """The matmul held for seconds: its last second against min_sustained_tflops (else a fraction
    of the limit), and the clocks' event reasons then: a hardware or thermal slowdown is the node's."""
    names = {d["index"]: d.get("name", "") for d in devices}
    for g in matmul.get("gpus") or []:
        held = g.get("sustained")
        if not held:
            continue
        smi = held.get("during_last_second") or {}
        said.append(
            "GPU %d held %.0fs: %.1f -> %.1f TFLOP/s (min %.1f)%s"
            % (
                g["index"],
                held["seconds"],
                held["first_second_tflops"],
                held["last_second_tflops"],
                held["min_tflops"],
                ", SM %.0f MHz, %s W, reasons: %s"
                % (
                    smi.get("sm_clock_mhz", 0),
                    smi.get("power_draw_w", "?"),
                    ", ".join(smi.get("event_reasons_active") or []) or "none",
                )
                if "event_reasons_active" in smi
                else "",
            )
        )
        floor, why = floor_of(params, "min_sustained_tflops", names.get(g["index"], ""), "bf16_tflops")
        if floor is not None and held["last_second_tflops"] < floor:
            node_problems.append(
                "GPU %d: %.1f TFLOP/s sustained < %g%s" % (g["index"], held["last_second_tflops"], floor, why)
            )
        faults = [r for r in smi.get("event_reasons_active") or [] if r in FAULT_REASONS]
        if faults:
            node_problems.append("GPU %d: clocks slowed under load by %s" % (g["index"], ", ".join(faults)))


def judge_allreduce(allreduce: dict, params: dict, node_problems: list, said: list) -> None:
    if allreduce.get("error"):
        node_problems.append(allreduce["error"])
        return
    if allreduce.get("skipped"):
        said.append(allreduce["skipped"])
        return
    ranks = allreduce.get("ranks") or []
    bad = [r["rank"] for r in ranks if not r.get("sum_ok")]
    if bad:
        node_problems.append("all-reduce sum wrong on rank(s) %s" % ", ".join(map(str, bad)))
    if not ranks:
        return
    slow = min(ranks, key=lambda r: r.get("busbw_gbps") or 0.0)
    said.append(
        "all-reduce of %d bytes on %d GPUs: sum %s on every rank, busbw %.1f GB/s (slowest: rank %d)"
        % (
            slow["bytes"],
            len(ranks),
            "exact" if not bad else "WRONG",
            slow["busbw_gbps"] or 0.0,
            slow["rank"],
        )
    )
    floor = params.get("min_busbw_gbps")
    if floor is not None and (slow.get("busbw_gbps") or 0.0) < floor:
        node_problems.append(
            "rank %d: busbw %.1f GB/s < min_busbw_gbps %g" % (slow["rank"], slow["busbw_gbps"] or 0.0, floor)
        )


# ---------------------------------------------------------------- the probe


def _bundle_root():
    """(folder or zip to put on sys.path, package name) for the workers: this module's parents."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.dirname(here), os.path.basename(here)


def _worker_env() -> dict:
    env = dict(os.environ)
    env["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast (SHARP): unsupported where we run
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _last_step(text: str) -> str:
    steps = STEP.findall(text or "")
    return steps[-1] if steps else "start"


def _worker(kind: str, args, timeout: float, tmp: str) -> dict:
    """One worker, bounded by `timeout`; its result or {"error": ..., naming the step}."""
    root, pkg = _bundle_root()
    out = os.path.join(tmp, "%s.json" % kind)
    argv = [sys.executable, "-c", BOOT, root, pkg, kind, out] + [str(a) for a in args]
    try:
        done = capture.run(argv, timeout=timeout, env=_worker_env(), cwd=tmp)
    except OSError as e:
        return {"error": "%s: could not start: %s" % (kind, e)}
    sys.stderr.write(done.err.text())
    if done.timed_out:
        return {
            "error": "%s: timed out after %gs in step %r (killed)"
            % (kind, timeout, _last_step(done.err.text()))
        }
    try:
        with open(out) as f:
            return json.load(f)
    except (OSError, ValueError):
        lines = [
            ln for ln in done.err.text().splitlines() if ln.strip() and not ln.startswith("imagegate-step")
        ]
        return {
            "error": "%s: exited %s in step %r: %s"
            % (kind, done.returncode, _last_step(done.err.text()), (lines[-1:] or ["no output"])[0][:300])
        }


def _allreduce(world: int, params: dict, tmp: str) -> dict:
    """One process per GPU, all at once; every one killed when the step's time is up."""
    root, pkg = _bundle_root()
    rdv = os.path.join(tmp, "rendezvous")
    timeout = float(params.get("allreduce_timeout", 300))
    procs = []
    for rank in range(world):
        out = os.path.join(tmp, "allreduce-%d.json" % rank)
        err = open(os.path.join(tmp, "allreduce-%d.stderr" % rank), "wb")  # noqa: SIM115 (closed below)
        argv = [sys.executable, "-c", BOOT, root, pkg, "allreduce", out, rank, world, rdv]
        argv += [params.get("allreduce_bytes", 1 << 30), params.get("warmup", 5), params.get("iters", 20)]
        procs.append(
            (
                subprocess.Popen(
                    [str(a) for a in argv],
                    stdin=subprocess.DEVNULL,
                    stdout=err,
                    stderr=err,
                    env=_worker_env(),
                    cwd=tmp,
                    start_new_session=True,
                ),
                out,
                err,
            )
        )
    timed_out = _wait_ranks(procs, timeout)
    ranks, errors = _rank_results(procs, tmp, timed_out, timeout)
    if errors:
        return {"error": "; ".join(errors)}
    return {"ranks": ranks, "world": world}


def _wait_ranks(procs: list, timeout: float) -> bool:
    """Until all are done (True: the time ran out); every one still alive is killed at the end."""
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        # A rank that failed leaves the others waiting in NCCL for it, so they are killed at
        # once rather than at the deadline.
        while any(p.poll() is None for p, _, _ in procs):
            if any(p.poll() not in (None, 0) for p, _, _ in procs):
                break
            if time.monotonic() >= deadline:
                timed_out = True
                break
            time.sleep(0.05)
    finally:
        for p, _, err in procs:
            if p.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            err.close()
    return timed_out


def _rank_results(procs: list, tmp: str, timed_out: bool, timeout: float) -> tuple:
    """Each rank's result, or why it has none."""
    ranks, errors = [], []
    for rank, (p, out, _) in enumerate(procs):
        with open(os.path.join(tmp, "allreduce-%d.stderr" % rank), errors="replace") as f:
            text = f.read()
        sys.stderr.write(text[-20000:])
        try:
            with open(out) as f:
                ranks.append(json.load(f))
        except (OSError, ValueError):
            lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("imagegate-step")]
            killed = timed_out or p.returncode == -signal.SIGKILL
            if timed_out:
                how = "timed out after %gs" % timeout
            elif killed:
                how = "was stopped after another rank failed"
            else:
                how = "exited %s" % p.returncode
            said = " (killed)" if killed else (": " + lines[-1][:200]) if lines else ""
            errors.append("all-reduce rank %d %s in step %r%s" % (rank, how, _last_step(text), said))
    return ranks, errors


def host_facts() -> dict:
    """What can be read without torch: nvidia-smi, else /proc/driver/nvidia/version."""
    out: dict = {}
    try:
        with open("/proc/driver/nvidia/version") as f:
            out["driver"] = parse_proc_driver(f.read())
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            done = capture.run(
                [smi, "--query-gpu=" + NVIDIA_SMI_QUERY, "--format=csv,noheader,nounits"], timeout=30
            )
            out["nvidia_smi"] = parse_nvidia_smi(done.out.text())
            if out["nvidia_smi"] and not out.get("driver"):
                out["driver"] = out["nvidia_smi"][0]["driver"]
        except OSError as e:
            out["nvidia_smi_error"] = str(e)
        out.update(smi_node(smi))
    out["xid"] = xid_events()
    return out


def query(smi: str, fields: str) -> tuple:
    """(text, None) of `nvidia-smi --query-gpu=FIELDS` (csv, no header, no units), or (None, why)."""
    try:
        done = capture.run([smi, "--query-gpu=" + fields, "--format=csv,noheader,nounits"], timeout=15)
    except OSError as e:
        return None, str(e)
    text = done.out.text()
    if done.timed_out or done.returncode:
        last = ((text + done.err.text()).strip().splitlines() or ["exit %s" % done.returncode])[-1]
        return None, "nvidia-smi --query-gpu: %s" % ("timed out" if done.timed_out else last[:200])
    return text, None


def load_before(smi: str) -> dict:
    """Memory used and utilization per GPU, LOAD_SAMPLES times over about a second, before any
    load (a busy GPU may be idle at one instant)."""
    samples: list = []
    for i in range(LOAD_SAMPLES):
        text, why = query(smi, gpu_causes.LOAD_QUERY)
        if text is None:
            return {"samples": samples, "error": why}
        samples.append(gpu_causes.parse_load(text))
        if i + 1 < LOAD_SAMPLES:
            time.sleep(SAMPLE_EVERY_S)
    return {"samples": samples}


@contextlib.contextmanager
def sampling(smi, fields: str, parse):
    """Reads `fields` every SAMPLE_EVERY_S in a thread while the block runs (the PCIe link during
    the pinned copies); yields {"samples": [...]} (and "error" when a read failed). No nvidia-smi:
    an empty dict."""
    got: dict = {}
    if not smi:
        yield got
        return
    got["samples"] = []
    stop = threading.Event()

    def loop() -> None:
        while True:  # at least one read, however short the block
            text, why = query(smi, fields)
            if text is None:
                got["error"] = why
                return
            got["samples"].append(parse(text))
            if stop.wait(SAMPLE_EVERY_S):
                return

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield got
    finally:
        stop.set()
        t.join(timeout=20)


def smi_node(smi: str) -> dict:
    """The node's state before any load: `nvidia-smi -q` (node_facts) and the topology matrix
    (`nvidia-smi topo -m`: NVLink/PCIe between GPUs, CPU and NUMA affinity per GPU)."""
    out: dict = {}
    for key, argv, limit in (
        ("q", [smi, "-q"], 60),
        ("topology", [smi, "topo", "-m"], 30),
        ("nvlink_status", [smi, "nvlink", "-s"], 30),
        ("nvlink_errors", [smi, "nvlink", "-e"], 30),
    ):
        try:
            done = capture.run(argv, timeout=limit)
        except OSError as e:
            out[key + "_error"] = str(e)
            continue
        text = done.out.text()
        if done.timed_out or done.returncode:
            out[key + "_error"] = "nvidia-smi %s: %s" % (
                " ".join(argv[1:]),
                "timed out"
                if done.timed_out
                else ((text + done.err.text()).strip().splitlines() or ["exit %s" % done.returncode])[-1],
            )
        elif key == "q":
            out["node"] = node_facts(text)
        elif key == "topology":
            out["topology"] = text[:16384]
        else:
            out[key] = text[:65536]
    if "nvlink_status" in out:
        out["nvlink"] = gpu_causes.parse_nvlink(out.pop("nvlink_status"), out.pop("nvlink_errors", ""))
    return out


def xid_events() -> dict:
    """NVIDIA XID events since boot, from the kernel log where this sandbox may read it."""
    exe = shutil.which("dmesg")
    if exe is None:
        return {"readable": False, "why": "no dmesg in the image"}
    try:
        done = capture.run([exe], timeout=15)
    except OSError as e:
        return {"readable": False, "why": str(e)}
    if done.timed_out or done.returncode:
        why = (done.err.text().strip().splitlines() or ["exit %s" % done.returncode])[-1]
        return {"readable": False, "why": "dmesg: %s" % why[:200]}
    events = [ln for ln in done.out.text().splitlines() if "NVRM: Xid" in ln]
    return {"readable": True, "count": len(events), "events": events[-20:]}


def run(params: dict) -> dict:
    tmp = tempfile.mkdtemp(prefix="gpu-preflight-")
    try:
        return _run(params, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(params: dict, tmp: str) -> dict:
    smi = shutil.which("nvidia-smi")
    load = load_before(smi) if smi else {}  # first: before anything of ours is on a GPU
    host = host_facts()
    host["load_before"] = load
    data = {"host": host, "params": params}
    busy = gpu_causes.busy_before(
        load.get("samples") or [],
        host.get("node") or [],
        params.get("max_busy_used_mib", gpu_causes.MAX_USED_MIB),
        params.get("max_busy_utilization_pct", gpu_causes.MAX_UTILIZATION_PCT),
    )
    if busy:
        data["unfit"] = "node"
        return {"status": "ERROR", "detail": NODE_UNFIT + "; ".join(busy), "data": data}
    facts = _worker("facts", [], float(params.get("facts_timeout", 120)), tmp)
    if facts.get("error"):
        if "No module named 'torch'" in facts["error"] or "ModuleNotFoundError" in facts["error"]:
            gpus = host.get("nvidia_smi") or []
            seen = (
                "; ".join(
                    "GPU %d %s, %d MiB, capability %s"
                    % (g["index"], g["name"], g.get("total_memory_bytes", 0) >> 20, g["capability"])
                    for g in gpus
                )
                or "no GPU listed by nvidia-smi"
                if "nvidia_smi" in host
                else "no nvidia-smi"
            )
            data["torch"] = None
            return {
                "status": "ERROR",
                "detail": "no torch in this image: the node check needs the image's torch for the "
                "matmul and the all-reduce; driver %s; %s" % (host.get("driver") or "unknown", seen),
                "data": data,
            }
        data["facts_error"] = facts["error"]
        return {"status": "ERROR", "detail": NODE_UNFIT + facts["error"], "data": data}
    facts["driver"] = host.get("driver")
    data["facts"] = facts
    matmul = allreduce = bandwidth = None
    pre = judge(facts, None, None, params)
    if pre["status"] == "PASS":
        matmul = _worker(
            "matmul",
            [
                params.get("size", 8192),
                params.get("warmup", 5),
                params.get("iters", 20),
                params.get("sustain_s", 3),
            ],
            float(params.get("matmul_timeout", 300)),
            tmp,
        )
        with sampling(smi, gpu_causes.PCIE_QUERY, gpu_causes.parse_pcie) as host["pcie_under_load"]:
            bandwidth = _worker(
                "bandwidth",
                [params.get("bandwidth_bytes", 1 << 30), params.get("bandwidth_iters", 10)],
                float(params.get("bandwidth_timeout", 300)),
                tmp,
            )
        data["bandwidth"] = bandwidth
        world = len(facts["devices"])
        if world >= 2:
            allreduce = _allreduce(world, params, tmp)
        else:
            allreduce = {"skipped": "all-reduce skipped: 1 GPU (it needs 2 or more)"}
        data["matmul"], data["allreduce"] = matmul, allreduce
    verdict = judge(facts, matmul, allreduce, params, bandwidth, host.get("node"), host)
    data["fraction_of_limit"] = fractions(data)
    data["unfit"] = (
        "image"
        if verdict["status"] == "FAIL"
        else "node"
        if verdict["detail"].startswith(NODE_UNFIT)
        else None
    )
    return {"status": verdict["status"], "detail": verdict["detail"], "data": data}
