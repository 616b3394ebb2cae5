"""gpu_causes: why a GPU node is not fit, named before (or beside) any figure: a GPU in use before
the check, a PCIe link below its maximum under load, Xid events by NVIDIA's Xid catalog, NVLink
links down or recovering, and the likeliest cause of a missed figure. Pure functions over what
nvidia-smi and the kernel log print (tests/probes/test_gpu_causes.py); gpu_preflight reads the
facts and calls them.
"""

from __future__ import annotations

import re

# Clock event reasons that are the node's fault (gpu_preflight.FAULT_REASONS).
FAULT_REASONS = ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown")

# A GPU in use before the check: DCGM's diagnostics look for other processes first, and its memory
# bandwidth test refuses a GPU whose memory-controller utilization is above 10 %. A CUDA context
# holds about 0.5 GiB, so more than 1 GiB used is another process's memory, not a driver's.
MAX_UTILIZATION_PCT = 10
MAX_USED_MIB = 1024
LOAD_QUERY = "index,memory.used,memory.total,utilization.gpu,utilization.memory"
# The link as it runs: idle GPUs lower their PCIe generation to save power, so it is read while
# the pinned copy runs. pcie.link.gen.max: the most this GPU and this host's slot allow.
PCIE_QUERY = "index,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
# NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors, "Resolution Bucket (Immediate Action)"):
# the events whose action is a GPU reset or a node reboot make the node unfit until it is done;
# an application's own errors (restart the application) are named and not judged.
XID_CATALOG = {
    13: ("graphics engine exception", "RESTART_APP"),
    31: ("GPU memory page fault", "RESTART_APP"),
    43: ("GPU stopped processing", "RESTART_APP"),
    45: ("preemptive cleanup, due to a previous error", "RESTART_APP"),
    48: ("double-bit ECC error", "RESET_GPU"),
    63: ("row remapping recorded", "RESET_GPU"),
    64: ("row remapping failure", "RESET_GPU"),
    74: ("NVLink error", "RESET_GPU"),
    79: ("GPU has fallen off the bus", "RESTART_BM"),
    92: ("high single-bit ECC error rate", "RESET_GPU"),
    94: ("contained ECC error", "RESTART_APP"),
    95: ("uncontained ECC error", "RESET_GPU"),
    119: ("GSP RPC timeout", "RESET_GPU"),
    120: ("GSP error", "RESET_GPU"),
}
ACTIONS = {
    "RESET_GPU": "reset the GPU",
    "RESTART_BM": "reboot the node",
    "RESTART_APP": "restart the application",
}
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+)(?:, (.*))?")


def _cells(text: str, width: int) -> list:
    rows = []
    for line in (text or "").splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= width and cells[0].isdigit():
            rows.append(cells)
    return rows


def _num(cell: str):
    try:
        return float(cell.rstrip("x"))
    except ValueError:
        return None  # [N/A], [Not Supported]


def parse_load(text: str) -> list:
    """Rows of `nvidia-smi --query-gpu=LOAD_QUERY --format=csv,noheader,nounits`."""
    return [
        {"index": int(c[0]), "used_mib": _num(c[1]), "total_mib": _num(c[2]),
         "utilization_gpu_pct": _num(c[3]), "utilization_memory_pct": _num(c[4])}
        for c in _cells(text, 5)
    ]  # fmt: skip


def busy_before(
    samples: list, nodes: list, max_used_mib: float = MAX_USED_MIB, max_util_pct: float = MAX_UTILIZATION_PCT
) -> list:
    """Each GPU in use before any load, from nvidia-smi read several times over about a second
    (`samples`: a parse_load list each) and the processes `nvidia-smi -q` lists (`nodes`, in index
    order; from inside a container's PID namespace it lists none, hence the figures)."""
    seen: dict = {}
    for sample in samples:
        for g in sample:
            was = seen.setdefault(g["index"], {"used": 0.0, "util": 0.0})
            was["used"] = max(was["used"], g["used_mib"] or 0.0)
            was["util"] = max(
                was["util"], g["utilization_gpu_pct"] or 0.0, g["utilization_memory_pct"] or 0.0
            )
    listed = {i for i, g in enumerate(nodes or []) if g.get("processes") == "listed"}
    problems = []
    for index in sorted(seen.keys() | listed):
        was = seen.get(index, {"used": 0.0, "util": 0.0})
        if was["used"] > max_used_mib or was["util"] > max_util_pct or index in listed:
            problems.append(
                "GPU %d in use before the check: %d MiB used, %d %% utilization (%s)"
                % (
                    index,
                    was["used"],
                    was["util"],
                    "processes listed" if index in listed else "another process",
                )
            )
    return problems


def parse_pcie(text: str) -> list:
    """Rows of `nvidia-smi --query-gpu=PCIE_QUERY --format=csv,noheader,nounits`."""
    return [
        {"index": int(c[0]), "gen": _num(c[1]), "gen_max": _num(c[2]), "width": _num(c[3]), "width_max": _num(c[4])}
        for c in _cells(text, 5)
    ]  # fmt: skip


def link_downgrades(samples: list) -> list:
    """Each GPU whose PCIe link never reached its maximum generation or width while the pinned
    copy ran (`samples`: parse_pcie lists read during it): the best it reached is what it had."""
    best: dict = {}
    for sample in samples:
        for g in sample:
            b = best.setdefault(g["index"], dict(g))
            for k in ("gen", "width"):
                if g[k] is not None and (b[k] is None or g[k] > b[k]):
                    b[k] = g[k]
    problems = []
    for index, b in sorted(best.items()):
        if None in (b["gen"], b["gen_max"], b["width"], b["width_max"]):
            continue
        if b["gen"] < b["gen_max"] or b["width"] < b["width_max"]:
            problems.append(
                "GPU %d: PCIe link gen %d x%d under load, its maximum gen %d x%d (link downgraded)"
                % (index, b["gen"], b["width"], b["gen_max"], b["width_max"])
            )
    return problems


def parse_xids(events: list) -> list:
    """The Xid events of kernel log lines: bus, code, what the driver said."""
    out = []
    for line in events or []:
        m = XID_LINE.search(line)
        if m:
            out.append({"bus": m.group(1), "xid": int(m.group(2)), "said": (m.group(3) or "")[:200]})
    return out


def judge_xids(xid: dict) -> tuple:
    """(problems, notes) from the Xid events since boot: a reset or reboot pending makes the node
    unfit; an application's error is noted; an unreadable log is said."""
    if not xid or not xid.get("readable"):
        why = (xid or {}).get("why") or "not read"
        return [], ["Xid events not readable (%s)" % why]
    problems, notes = [], []
    for e in parse_xids(xid.get("events") or []):
        what, action = XID_CATALOG.get(e["xid"], ("not in the catalog", "CONTACT_SUPPORT"))
        line = "GPU %s: Xid %d (%s) since boot" % (e["bus"], e["xid"], what)
        if action in ("RESET_GPU", "RESTART_BM"):
            problems.append("%s: %s" % (line, ACTIONS[action]))
        else:
            notes.append("%s: %s" % (line, ACTIONS.get(action, "contact NVIDIA support")))
    return problems, notes


NVLINK_GPU = re.compile(r"^GPU (\d+):")
NVLINK_LINK = re.compile(r"^\s*Link (\d+): (.*)$")


def parse_nvlink(status: str, errors: str = "") -> dict:
    """`nvidia-smi nvlink -s` (each link's speed or <inactive>) and `nvidia-smi nvlink -e` (its
    error counters) per GPU index: {index: {"active": n, "links": n, "recovery_errors": n}}."""
    out: dict = {}
    for text, errs in ((status, False), (errors, True)):
        gpu = None
        for line in (text or "").splitlines():
            g = NVLINK_GPU.match(line)
            if g:
                gpu = out.setdefault(int(g.group(1)), {"active": 0, "links": 0, "recovery_errors": 0})
                continue
            m = NVLINK_LINK.match(line)
            if gpu is None or not m:
                continue
            if not errs:
                gpu["links"] += 1
                gpu["active"] += 0 if "inactive" in m.group(2) else 1
            elif m.group(2).startswith("Recovery Errors:"):
                gpu["recovery_errors"] += int(_num(m.group(2).split(":")[1].strip()) or 0)
    return out


def nvlink_problems(links: dict) -> list:
    """With 2 or more GPUs: a GPU with fewer active NVLink links than its peers' most, or a link
    that had to recover (its errors), is unfit."""
    if len(links) < 2:
        return []
    most = max(g["active"] for g in links.values())
    problems = []
    for index, g in sorted(links.items()):
        if g["active"] < most:
            problems.append(
                "GPU %d: %d of %d NVLink links active (its peers have %d)"
                % (index, g["active"], g["links"], most)
            )
        if g["recovery_errors"]:
            problems.append("GPU %d: %d NVLink recovery errors" % (index, g["recovery_errors"]))
    return problems


def likeliest_cause(nodes: list, downgrades: list) -> str:
    """What the facts say about a figure missed: a clock slowed by the hardware, a link running
    below its maximum, uncorrected memory errors; empty when none of them."""
    causes = list(downgrades)
    for g in nodes or []:
        faults = [r for r in g.get("event_reasons_active") or [] if r in FAULT_REASONS]
        if faults:
            causes.append("GPU %s clocks slowed by %s" % (g.get("bus_id"), ", ".join(faults)))
        if (g.get("ecc_uncorrected") or {}).get("Volatile"):
            causes.append("GPU %s has uncorrected ECC errors" % g.get("bus_id"))
    return "likeliest cause: " + "; ".join(causes) if causes else ""
