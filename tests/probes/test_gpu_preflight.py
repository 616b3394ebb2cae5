"""The GPU node check's judgement (probes/gpu_preflight.py), on outputs recorded from real
installations, and its bounded workers on a host without torch or GPUs. No GPU is faked: every
case here that needs one is judged from data, and none of it claims a measured pass."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.probes.test_parsers import PROBES, load

# torch.cuda.get_arch_list() as printed by real wheels (pytorch/pytorch issue 182250, and the
# "supports CUDA capabilities ..." warning of a torch 1.x cu11x wheel, quoted in public issues).
ARCH_2_11_CU126 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
ARCH_2_11_CU128 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
ARCH_2_10_CU128 = ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
ARCH_OLD_WITH_PTX = [
    "sm_37",
    "sm_50",
    "sm_60",
    "sm_61",
    "sm_70",
    "sm_75",
    "sm_80",
    "sm_86",
    "sm_90",
    "compute_37",
]

# /proc/driver/nvidia/version first lines as real drivers write them (proprietary and open modules).
PROC_PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.82.07  Tue Aug  5 17:24:00 UTC 2025\n"
PROC_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build  "
    "(dvs-builder@U16)  Tue May 20 2025\nGCC version:  gcc version 12.3.0\n"
)
PROC_SHORT = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  515.76  Mon Sep 12 19:21:56 UTC 2022\n"

# Rows in the form `nvidia-smi --query-gpu=index,name,memory.total,memory.free,driver_version,
# compute_cap,uuid --format=csv,noheader,nounits` prints, WRITTEN FROM the facts of a 2-GPU H200
# node in benchmarks/records/2026-11-30-gpu-h200.md (name, 143771 MiB, driver 580.159.04,
# capability 9.0): the raw log of that run was not kept, and the free memory and UUIDs are made up.
SMI_2xH200 = (
    "0, NVIDIA H200, 143771, 143156, 580.159.04, 9.0, GPU-3cf75db2-5cba-bdeb-063d-4cfc6e966eb1\n"
    "1, NVIDIA H200, 143771, 143156, 580.159.04, 9.0, GPU-ed74a9a9-8727-4505-8c06-7199bff5b64a\n"
)


@pytest.fixture(scope="module")
def gp():  # type: ignore[no-untyped-def]
    return load("gpu_preflight")


def test_arch_list_covers_the_gpu_by_cubin_or_lower_ptx(gp) -> None:  # type: ignore[no-untyped-def]
    h200 = gp.arch_coverage(ARCH_2_11_CU128, "9.0")
    assert h200["covered"] and h200["by"] == "sm_90"
    # torch 2.11+cu128 dropped sm_70: a V100 gets "no kernel image is available" (issue 182250)
    v100 = gp.arch_coverage(ARCH_2_11_CU128, "7.0")
    assert not v100["covered"]
    assert "no sm_70 and no compute_XY <= 70" in v100["why"] and "no kernel image" in v100["why"]
    assert gp.arch_coverage(ARCH_2_10_CU128, "7.0")["covered"]
    # an RTX 5090 (12.0) on a cu126 wheel: no sm_120, no PTX
    assert not gp.arch_coverage(ARCH_2_11_CU126, "12.0")["covered"]
    # PTX for an older architecture is JIT-compiled by the driver: covered, and said how
    ptx = gp.arch_coverage(ARCH_OLD_WITH_PTX, "12.0")
    assert ptx["covered"] and ptx["by"] == "compute_37" and "PTX" in ptx["why"]
    # a cubin for a newer architecture does not run on an older one, nor sm_89 code on 8.6
    assert not gp.arch_coverage(["sm_89", "sm_90"], "8.6")["covered"]
    assert not gp.arch_coverage(["compute_90"], "8.0")["covered"]
    # arch-specific builds (sm_90a) name the architecture too
    assert gp.arch_coverage(["sm_80", "sm_90a"], "9.0")["by"] == "sm_90a"
    assert not gp.arch_coverage([], "9.0")["covered"]


def test_driver_older_than_the_cuda_runtime_names_both(gp) -> None:  # type: ignore[no-untyped-def]
    ok = gp.driver_check("580.159.04", "13.0")
    assert ok["ok"] is True and ok["min_driver"] == "580.65.06"
    old = gp.driver_check("575.57.08", "13.0")
    assert old["ok"] is False
    assert "575.57.08" in old["why"] and "CUDA 13.0" in old["why"] and "580.65.06" in old["why"]
    # minor-version compatibility: a cu128 wheel runs on a 12.0-era 525 driver, not on 470
    assert gp.driver_check("525.60.13", "12.8")["ok"] is True
    assert gp.driver_check("470.82.01", "12.1")["ok"] is False
    assert gp.driver_check("515.76", "11.8")["ok"] is True
    assert gp.driver_check(None, "12.8")["ok"] is None
    assert gp.driver_check("580.82.07", "10.2")["ok"] is None  # no minimum on record: not judged


def test_driver_version_parsed_from_proc_and_nvidia_smi(gp) -> None:  # type: ignore[no-untyped-def]
    assert gp.parse_proc_driver(PROC_PROPRIETARY) == "580.82.07"
    assert gp.parse_proc_driver(PROC_OPEN) == "575.57.08"
    assert gp.parse_proc_driver(PROC_SHORT) == "515.76"
    assert gp.parse_proc_driver("") is None
    gpus = gp.parse_nvidia_smi(SMI_2xH200 + "\nNo devices were found\n")
    assert [g["index"] for g in gpus] == [0, 1]
    assert gpus[0]["name"] == "NVIDIA H200" and gpus[0]["capability"] == "9.0"
    assert gpus[0]["total_memory_bytes"] == 143771 * 1024 * 1024
    assert gpus[1]["driver"] == "580.159.04" and gpus[1]["uuid"].startswith("GPU-ed74")


def test_busbw_is_nccl_tests_definition(gp) -> None:  # type: ignore[no-untyped-def]
    # 1 GiB in 5 ms: algbw 214.7 GB/s; 2 ranks: x1; 8 ranks: x1.75
    assert gp.busbw(1 << 30, 0.005, 2) == pytest.approx((1 << 30) / 0.005 / 1e9)
    assert gp.busbw(1 << 30, 0.005, 8) == pytest.approx((1 << 30) / 0.005 / 1e9 * 1.75)


def test_every_figure_is_its_textbook_formula() -> None:
    """Against values computed by hand, not by the same expressions: a doubled or halved formula
    fails here."""
    gw = load("gpu_worker")
    # 8192^3 x 2 = 1,099,511,627,776 FLOP; in 1 ms: 1099.51 TFLOP/s; an H200's 8192^3 in 1.39 ms: ~791
    assert gw.tflops(8192, 0.001) == pytest.approx(1099.511627776)
    assert gw.tflops(8192, 0.00139) == pytest.approx(791.0155595511, rel=1e-9)
    assert gw.tflops(4096, 0.5) == pytest.approx(0.274877906944)
    assert gw.tflops(8192, 0) is None
    # 1 GiB in 20 ms: 53.6870912 GB/s (10^9 bytes); 4 GB in 1 s: 4
    assert gw.gbps(1 << 30, 0.02) == pytest.approx(53.6870912)
    assert gw.gbps(4e9, 1.0) == pytest.approx(4.0)
    # exactly, where the arithmetic is exact: a constant off by one part in 10^9 fails too
    assert gw.tflops(10000, 1.0) == 2.0 and gw.gbps(4e9, 1.0) == 4.0
    # no time measured, or a clock that went back: no figure, never a division by zero
    for seconds in (0, 0.0, -0.001, -1.0):
        assert gw.tflops(8192, seconds) is None and gw.gbps(1 << 30, seconds) is None
    # nccl-tests: busbw = algbw x 2(n-1)/n: 2 ranks x1, 4 ranks x1.5, 8 ranks x1.75
    assert gw.busbw(200.0, 2) == pytest.approx(200.0)
    assert gw.busbw(200.0, 4) == pytest.approx(300.0)
    assert gw.busbw(200.0, 8) == pytest.approx(350.0)


def _facts(n: int = 2, arch=ARCH_2_11_CU128, cap: str = "9.0", driver: str = "580.159.04") -> dict:  # type: ignore[no-untyped-def]
    return {
        "torch": "2.11.0+cu130",
        "cuda_runtime": "13.0",
        "arch_list": arch,
        "driver": driver,
        "devices": [{"index": i, "name": "NVIDIA H200", "capability": cap} for i in range(n)],
    }


def _mm(*tflops: float, finite: bool = True, rel: float = 0.002) -> dict:  # type: ignore[type-arg]
    return {
        "gpus": [
            {
                "index": i,
                "size": 8192,
                "tflops": t,
                "finite": finite,
                "relative_error": rel,
                "tolerance": 0.01,
            }
            for i, t in enumerate(tflops)
        ]
    }


def _ar(*busbw: float, ok: bool = True) -> dict:  # type: ignore[type-arg]
    return {
        "ranks": [{"rank": r, "bytes": 1 << 30, "busbw_gbps": b, "sum_ok": ok} for r, b in enumerate(busbw)]
    }


def test_judgement_image_fail_node_error_and_figures(gp) -> None:  # type: ignore[no-untyped-def]
    # the image cannot run here: FAIL, naming the GPU and why
    bad_arch = gp.judge(_facts(arch=ARCH_2_11_CU126, cap="12.0"), None, None, {})
    assert bad_arch["status"] == "FAIL" and "capability 12.0" in bad_arch["detail"]
    old_driver = gp.judge(_facts(driver="570.86.15"), None, None, {})
    assert (
        old_driver["status"] == "FAIL"
        and "570.86.15" in old_driver["detail"]
        and "13.0" in old_driver["detail"]
    )
    cpu_torch = gp.judge(dict(_facts(0), torch="2.11.0+cpu", cuda_runtime=None), None, None, {})
    assert cpu_torch["status"] == "FAIL" and "torch 2.11.0+cpu is a CPU-only build" in cpu_torch["detail"]
    # a broken node: ERROR "node not fit", never FAIL
    nan = gp.judge(_facts(), _mm(700.0, 710.0, finite=False), _ar(300.0, 310.0), {})
    assert (
        nan["status"] == "ERROR"
        and nan["detail"].startswith("node not fit: ")
        and "not finite" in nan["detail"]
    )
    off = gp.judge(_facts(), _mm(700.0, 710.0, rel=0.5), _ar(300.0, 310.0), {})
    assert off["status"] == "ERROR" and "float32 reference" in off["detail"]
    wrong_sum = gp.judge(_facts(), _mm(700.0, 710.0), _ar(300.0, 310.0, ok=False), {})
    assert wrong_sum["status"] == "ERROR" and "sum wrong on rank(s) 0, 1" in wrong_sum["detail"]
    hung = gp.judge(_facts(), _mm(700.0, 710.0), {"error": "allreduce rank 1 timed out in step 'init'"}, {})
    assert hung["status"] == "ERROR" and "timed out in step 'init'" in hung["detail"]
    # thresholds name the slowest GPU and rank
    slow = gp.judge(
        _facts(), _mm(780.0, 650.0), _ar(330.0, 150.0), {"min_tflops": 700, "min_busbw_gbps": 300}
    )
    assert slow["status"] == "ERROR"
    assert "GPU 1: 650.0 TFLOP/s < min_tflops 700" in slow["detail"]
    assert "rank 1: busbw 150.0 GB/s < min_busbw_gbps 300" in slow["detail"]
    good = gp.judge(_facts(), _mm(780.0, 790.0), _ar(330.0, 320.0), {"min_tflops": 700})
    assert good["status"] == "PASS"
    assert "slowest: GPU 0, 780.0" in good["detail"] and "slowest: rank 1" in good["detail"]
    assert "2 x NVIDIA H200" in good["detail"]
    one = gp.judge(_facts(1), _mm(790.0), {"skipped": "all-reduce skipped: 1 GPU (it needs 2 or more)"}, {})
    assert one["status"] == "PASS" and "all-reduce skipped: 1 GPU" in one["detail"]
    # no GPU visible to torch: nothing measured, nothing passed
    assert gp.judge(_facts(0), None, None, {})["status"] == "ERROR"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_allreduce_workers_are_bounded_and_killed(gp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The all-reduce step runs one process per GPU; a step past its time is ERROR naming it, and
    every rank is killed. Here the ranks never get past importing torch (there is none)."""
    t0 = time.monotonic()
    res = gp._allreduce(
        3, {"allreduce_timeout": 0.05, "allreduce_bytes": 1024, "warmup": 1, "iters": 1}, str(tmp_path)
    )
    assert time.monotonic() - t0 < 15
    assert "error" in res
    for rank in range(3):
        assert f"rank {rank}" in res["error"]
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    mine = [p for p in pids if _alive(p) and str(tmp_path) in _cmdline(p)]
    assert mine == []
    # given time, a rank says where it stopped (torch is not there), and the first rank that fails
    # stops the others at once instead of leaving them to wait for it until the deadline
    t0 = time.monotonic()
    res = gp._allreduce(
        2, {"allreduce_timeout": 60, "allreduce_bytes": 1024, "warmup": 1, "iters": 1}, str(tmp_path)
    )
    assert time.monotonic() - t0 < 30
    assert "exited 1 in step 'import torch': ModuleNotFoundError: No module named 'torch'" in res["error"]


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


# `nvidia-smi -q` of one H200 in the layout driver 580 prints (sections by indentation, "Key : Value"),
# cut to the sections the node check reads; the counts and states are set per test below.
SMI_Q = """\
==============NVSMI LOG==============

Timestamp                                 : Tue Dec  1 10:15:00 2026
Driver Version                            : 580.159.04
CUDA Version                              : 13.0

Attached GPUs                             : 1
GPU 00000000:18:00.0
    Product Name                          : NVIDIA H200
    Persistence Mode                      : Enabled
    PCI
        Bus                               : 0x18
        GPU Link Info
            PCIe Generation
                Max                       : 5
                Current                   : {gen}
            Link Width
                Max                       : 16x
                Current                   : 16x
    Clocks Event Reasons
        Idle                              : Not Active
        Applications Clocks Setting       : Not Active
        SW Power Cap                      : {cap}
        HW Slowdown                       : {hw}
            HW Thermal Slowdown           : Not Active
            HW Power Brake Slowdown       : Not Active
        Sync Boost                        : Not Active
        SW Thermal Slowdown               : Not Active
    ECC Mode
        Current                           : Enabled
        Pending                           : Enabled
    ECC Errors
        Volatile
            SRAM Correctable              : 3
            SRAM Uncorrectable Parity     : 0
            SRAM Uncorrectable SEC-DED    : 0
            DRAM Correctable              : 12
            DRAM Uncorrectable            : {dram}
        Aggregate
            SRAM Correctable              : 3
            SRAM Uncorrectable Parity     : 0
            SRAM Uncorrectable SEC-DED    : 1
            DRAM Correctable              : 40
            DRAM Uncorrectable            : {dram}
    Remapped Rows
        Correctable Error                 : 0
        Uncorrectable Error               : 0
        Pending                           : {pending}
        Remapping Failure Occurred        : No
    Temperature
        GPU Current Temp                  : 38 C
    GPU Power Readings
        Average Power Draw                : 120.00 W
        Instantaneous Power Draw          : 121.50 W
    Processes                             : None
"""


def _smi(**kw: str) -> str:
    return SMI_Q.format(
        **{"gen": "5", "cap": "Not Active", "hw": "Not Active", "dram": "0", "pending": "No", **kw}
    )


def test_node_facts_read_from_nvidia_smi_q(gp) -> None:  # type: ignore[no-untyped-def]
    (g,) = gp.node_facts(_smi(gen="4", dram="2", cap="Active"))
    assert g["bus_id"] == "00000000:18:00.0" and g["name"] == "NVIDIA H200"
    assert g["persistence_mode"] == "Enabled" and g["ecc_mode"] == "Enabled"
    assert g["pcie_generation"] == {"current": "4", "max": "5"}
    assert g["pcie_width"] == {"current": "16x", "max": "16x"}
    # uncorrected only: SRAM parity + SEC-DED + DRAM; correctable counts are not faults
    assert g["ecc_uncorrected"] == {"Volatile": 2, "Aggregate": 3}
    assert g["remapped_rows"] == {"pending": "No", "failure": "No"}
    assert g["event_reasons_active"] == ["SW Power Cap"]
    assert g["power_draw"] == "121.50 W" and g["temperature"] == "38 C" and g["processes"] == "None"


def test_node_faults_are_ecc_remaps_and_hardware_slowdowns_not_a_power_cap(gp) -> None:  # type: ignore[no-untyped-def]
    assert gp.node_faults(gp.node_facts(_smi(cap="Active")), {}) == []  # capped under load: normal
    (ecc,) = gp.node_faults(gp.node_facts(_smi(dram="1")), {})
    assert "1 uncorrected ECC errors since the driver loaded (max_ecc_uncorrected 0)" in ecc
    assert gp.node_faults(gp.node_facts(_smi(dram="1")), {"max_ecc_uncorrected": 1}) == []
    (pending,) = gp.node_faults(gp.node_facts(_smi(pending="Yes")), {})
    assert "row remapping is pending" in pending
    (hw,) = gp.node_faults(gp.node_facts(_smi(hw="Active")), {})
    assert hw.endswith("clocks slowed by HW Slowdown")


def _bw(hbm: float, h2d: float, d2h: float, p2p: float | None = None) -> dict:  # type: ignore[type-arg]
    out = {"gpus": [{"index": 0, "hbm_copy_gbps": hbm, "h2d_gbps": h2d, "d2h_gbps": d2h}], "p2p": []}
    if p2p is not None:
        out["gpus"].append({"index": 1, "hbm_copy_gbps": hbm, "h2d_gbps": h2d, "d2h_gbps": d2h})
        out["p2p"] = [{"src": 0, "dst": 1, "gbps": p2p}, {"src": 1, "dst": 0, "gbps": p2p + 10}]
    return out


def test_bandwidth_and_sustained_rate_judged_against_the_h200s_limits(gp) -> None:  # type: ignore[no-untyped-def]
    facts = _facts(2)
    # The 2026-12-01 plain-torch figures: fit (half of 4800, 64, 450 GB/s is the default floor).
    ok = gp.judge(facts, None, None, {}, _bw(4293.0, 55.4, 55.3, 380.0))
    assert ok["status"] == "PASS", ok
    assert "HBM copy 4293 GB/s" in ok["detail"] and "slowest GPU 0->1 380 GB/s" in ok["detail"]
    slow = gp.judge(facts, None, None, {}, _bw(4293.0, 20.0, 55.3))
    assert slow["status"] == "ERROR" and "GPU 0: host->GPU 20.0 GB/s < 32" in slow["detail"]
    set_floor = gp.judge(facts, None, None, {"min_hbm_gbps": 4500}, _bw(4293.0, 55.4, 55.3))
    assert "GPU 0: HBM copy 4293.0 GB/s < 4500" in set_floor["detail"]
    mm = _mm(785.0, 790.0)
    mm["gpus"][0]["sustained"] = {
        "seconds": 10.0,
        "first_second_tflops": 785.0,
        "last_second_tflops": 673.0,
        "min_tflops": 583.0,
        "during_last_second": {
            "event_reasons_active": ["SW Power Cap"],
            "sm_clock_mhz": 1470.0,
            "power_draw_w": 672.0,
        },
    }
    held = gp.judge(facts, mm, None, {})
    assert held["status"] == "PASS", held
    assert (
        "GPU 0 held 10s: 785.0 -> 673.0 TFLOP/s (min 583.0), SM 1470 MHz, 672.0 W, reasons: SW Power Cap"
        in held["detail"]
    )
    mm["gpus"][0]["sustained"]["during_last_second"]["event_reasons_active"] = ["HW Thermal Slowdown"]
    hot = gp.judge(facts, mm, None, {"min_sustained_tflops": 700})
    assert "GPU 0: 673.0 TFLOP/s sustained < 700" in hot["detail"]
    assert "GPU 0: clocks slowed under load by HW Thermal Slowdown" in hot["detail"]
    fr = gp.fractions({"facts": facts, "matmul": mm, "bandwidth": _bw(4800.0, 32.0, 64.0)})
    assert fr["gpu0_bf16"] == {
        "tflops": round(785.0 / 989, 4),
        "sustained_last_second": round(673.0 / 989, 4),
    }
    assert fr["gpu0_bandwidth"] == {"hbm_copy_gbps": 1.0, "h2d_gbps": 0.5, "d2h_gbps": 1.0}


def test_peer_copies_get_the_nvlink_floor_only_where_nvswitch_joins_every_pair(gp) -> None:  # type: ignore[no-untyped-def]
    def bw(gpus: int, slow: float) -> dict:  # type: ignore[type-arg]
        row = {"hbm_copy_gbps": 4293.0, "h2d_gbps": 55.4, "d2h_gbps": 55.3}
        pairs = [{"src": a, "dst": b, "gbps": 380.0} for a in range(gpus) for b in range(gpus) if a != b]
        pairs[-1]["gbps"] = slow
        return {"gpus": [{"index": i, **row} for i in range(gpus)], "p2p": pairs}

    # 8 H200s on NVSwitch: a pair at a third of NVLink is a fault (half of 450 GB/s is the floor)
    eight = gp.judge(_facts(8), None, None, {}, bw(8, 150.0))
    assert eight["status"] == "ERROR" and "GPU 7->6: peer copy 150.0 GB/s < 225" in eight["detail"], eight
    assert gp.judge(_facts(8), None, None, {}, bw(8, 300.0))["status"] == "PASS"
    assert gp.judge(_facts(8), None, None, {}, bw(8, 225.0))["status"] == "PASS"  # at the floor: fit
    # 16 on NVSwitch (an HGX-2 board): every pair has the whole link too
    sixteen = gp.judge(_facts(16), None, None, {}, bw(16, 150.0))
    assert sixteen["status"] == "ERROR" and "peer copy 150.0 GB/s < 225" in sixteen["detail"], sixteen
    # 4 of them linked directly (an HGX 4-GPU board): a third of the links a pair is the board, not a fault
    four = gp.judge(_facts(4), None, None, {}, bw(4, 150.0))
    assert four["status"] == "PASS", four
    assert "150 GB/s (no default floor with 4 GPUs; min_p2p_gbps sets one)" in four["detail"]
    set_floor = gp.judge(_facts(4), None, None, {"min_p2p_gbps": 200}, bw(4, 150.0))
    assert "GPU 3->2: peer copy 150.0 GB/s < 200" in set_floor["detail"], set_floor


# Names as torch.cuda.get_device_name and nvidia-smi print them (the H100's and the H200's as read
# on real ones in benchmarks/records, the others as NVIDIA's tools print them in public logs), the
# model whose row they must get, and their compute capability.
REPORTED = [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", "9.0"),
    ("NVIDIA H100 PCIe", "H100 PCIe", "9.0"),
    ("NVIDIA H100 NVL", "H100 NVL", "9.0"),
    ("NVIDIA H200", "H200", "9.0"),
    ("NVIDIA H200 NVL", "H200 NVL", "9.0"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB", "8.0"),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB", "8.0"),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB", "8.0"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB", "8.0"),
    ("NVIDIA L40S", "L40S", "8.9"),
    ("NVIDIA B200", "B200", "10.0"),
]
ARCH_ALL = ["sm_70", "sm_80", "sm_89", "sm_90", "sm_100"]


def _node(*gpus: tuple[str, str]) -> dict:  # type: ignore[type-arg]
    """Facts of a node of these (name, capability) GPUs, an image that runs on all of them."""
    devices = [{"index": i, "name": n, "capability": c} for i, (n, c) in enumerate(gpus)]
    return {**_facts(0, arch=ARCH_ALL), "devices": devices}


def _held(tflops: float, last: float) -> dict:  # type: ignore[type-arg]
    mm = _mm(tflops)
    mm["gpus"][0]["sustained"] = {
        "seconds": 3.0,
        "first_second_tflops": tflops,
        "last_second_tflops": last,
        "min_tflops": last,
    }
    return mm


@pytest.mark.parametrize(("name", "model", "cap"), REPORTED, ids=[r[0] for r in REPORTED])
def test_each_reported_name_gets_its_own_models_limits(gp, name: str, model: str, cap: str) -> None:  # type: ignore[no-untyped-def]
    """A PCIe or NVL card never gets its SXM sibling's row ("H100 PCIe", "H200 NVL" hold the
    family's name too), nor an A100 40GB the 80GB part's; upper or lower case as the tools print."""
    assert gp.model_of(name) == model
    assert gp.limits_for(name) == gp.LIMITS[model]
    assert gp.model_of(name.upper()) == model
    # the model's own words alone (no "NVIDIA", as some tools and labels print it) are enough
    bare = " ".join(w for w in name.split() if w != "NVIDIA")
    assert gp.model_of(bare) == model, bare


@pytest.mark.parametrize(("name", "model", "cap"), REPORTED, ids=[r[0] for r in REPORTED])
def test_a_figure_under_the_fraction_of_its_own_models_limit_is_not_fit(  # type: ignore[no-untyped-def]
    gp, name: str, model: str, cap: str
) -> None:
    """Every figure with a floor (bf16 TFLOP/s, held, HBM copy, host->GPU, GPU->host) at 0.49 of
    the card's own limit is named not fit, with the fraction and the model the floor came from;
    each at 0.51 passes. An A100 or an L40S at 0.51 of its own limits is under the H200's floors,
    a B200 at 0.49 of its own above them: the card's own figures decide, not the H200's."""
    lim = gp.LIMITS[model]
    facts = _node((name, cap))

    def run(tf: float, held: float, hbm: float, h2d: float, d2h: float) -> dict:  # type: ignore[type-arg]
        bw = _bw(hbm * lim["hbm_gbps"], h2d * lim["pcie_gbps"], d2h * lim["pcie_gbps"])
        mm = _held(tf * lim["bf16_tflops"], held * lim["bf16_tflops"])
        return gp.judge(facts, mm, None, {}, bw)  # type: ignore[no-any-return]

    fit = run(0.51, 0.51, 0.51, 0.51, 0.51)
    assert fit["status"] == "PASS", fit
    at_the_floor = run(0.5, 0.5, 0.5, 0.5, 0.5)  # a figure at its floor is fit: under it is not
    assert at_the_floor["status"] == "PASS", at_the_floor
    no_hbm = _bw(0.9 * lim["hbm_gbps"], 0.49 * lim["pcie_gbps"], 0.9 * lim["pcie_gbps"])
    del no_hbm["gpus"][0]["hbm_copy_gbps"]  # a figure not measured: the others still judged
    missing = gp.judge(facts, None, None, {}, no_hbm)
    assert missing["status"] == "ERROR" and "host->GPU" in missing["detail"], missing
    figures = {
        "TFLOP/s <": (0.49, 0.9, 0.9, 0.9, 0.9),
        "TFLOP/s sustained <": (0.9, 0.49, 0.9, 0.9, 0.9),
        "HBM copy": (0.9, 0.9, 0.49, 0.9, 0.9),
        "host->GPU": (0.9, 0.9, 0.9, 0.49, 0.9),
        "GPU->host": (0.9, 0.9, 0.9, 0.9, 0.49),
    }
    limit_of = {"HBM copy": "hbm_gbps", "host->GPU": "pcie_gbps", "GPU->host": "pcie_gbps"}
    for label, at in figures.items():
        got = run(*at)
        assert got["status"] == "ERROR" and got["detail"].startswith("node not fit: GPU 0: "), got
        limit = lim[limit_of.get(label, "bf16_tflops")]
        assert label in got["detail"]
        assert "< %g (0.5 of the %s's %g)" % (0.5 * limit, model, limit) in got["detail"]


def test_a_gpu_of_a_model_not_in_the_table_has_no_floor(gp) -> None:  # type: ignore[no-untyped-def]
    """A Grace Hopper or Grace Blackwell part (its host link is no PCIe), an L40 (not an L40S), a
    V100, a name not read: no limits, so only a threshold set by hand judges their figures, and
    no fraction of a limit is reported for them."""
    for name, cap in (
        ("NVIDIA GH200 480GB", "9.0"),
        ("NVIDIA GB200", "10.0"),
        ("NVIDIA L40", "8.9"),
        ("Tesla V100-SXM2-32GB", "7.0"),
        ("", "9.0"),
    ):
        assert gp.model_of(name) is None and gp.limits_for(name) == {}
        facts, mm, bw = _node((name, cap)), _held(1.0, 1.0), _bw(1.0, 1.0, 1.0)
        assert gp.judge(facts, mm, None, {}, bw)["status"] == "PASS"
        assert gp.judge(facts, mm, None, {"min_hbm_gbps": 2}, bw)["status"] == "ERROR"
        fr = gp.fractions({"facts": facts, "matmul": mm, "bandwidth": bw})
        assert fr == {"gpu0_bandwidth": {}}


def test_each_gpu_of_a_mixed_node_is_judged_by_its_own_model(gp) -> None:  # type: ignore[no-untyped-def]
    """An H100 SXM beside an A100 40GB: the A100's 1000 GB/s copy is the slowest and fit for it
    (floor 777.5), the H100's 1600 is not (floor 1675), and is the one named."""
    facts = _node(("NVIDIA H100 80GB HBM3", "9.0"), ("NVIDIA A100-SXM4-40GB", "8.0"))
    bw = {
        "gpus": [
            {"index": 0, "hbm_copy_gbps": 1600.0, "h2d_gbps": 50.0, "d2h_gbps": 50.0},
            {"index": 1, "hbm_copy_gbps": 1000.0, "h2d_gbps": 25.0, "d2h_gbps": 25.0},
        ]
    }
    got = gp.judge(facts, None, None, {}, bw)
    assert got["status"] == "ERROR", got
    assert "GPU 0: HBM copy 1600.0 GB/s < 1675 (0.5 of the H100 SXM's 3350)" in got["detail"]
    assert "GPU 1: HBM" not in got["detail"]


def test_sustained_figures_are_the_first_and_last_second_of_the_timings() -> None:
    """The sustained matmul's figures from its batch timings (no GPU: the windowing alone). The
    timings are shaped like an H200's throttling run: 50 ms batches at 785 TFLOP/s, slowing to
    673 in the last second; a wider or shifted window mixes the two rates and fails here."""
    gw = load("gpu_worker")
    times = [round(0.05 * i, 2) for i in range(1, 61)]
    rates = [(t, 785.0 if t < 2.0 else 673.0) for t in times]
    figures = gw.windows(rates)
    assert figures == {
        "seconds": 3.0,
        "batches": 60,
        "first_second_tflops": pytest.approx(785.0),
        "last_second_tflops": pytest.approx(673.0),
        "min_tflops": 673.0,
    }
    # a dip in the middle is the lowest, and neither the first nor the last second
    dipped = [(t, 500.0 if t == 1.5 else r) for t, r in rates]
    assert gw.windows(dipped)["min_tflops"] == 500.0
    assert gw.windows(dipped)["first_second_tflops"] == pytest.approx(785.0)
    # the batch that ends at exactly 1 s belongs to the first second, the one at now - 1 s to the last
    edges = [(0.5, 100.0), (1.0, 200.0), (1.5, 300.0), (2.0, 400.0), (2.5, 500.0)]
    assert gw.windows(edges)["first_second_tflops"] == pytest.approx(150.0)
    assert gw.windows(edges)["last_second_tflops"] == pytest.approx(400.0)
    # batches longer than a second: the first batch stands for the first second, the last for the last
    slow = [(1.5, 700.0), (3.0, 650.0), (4.5, 600.0)]
    figures = gw.windows(slow)
    assert (figures["first_second_tflops"], figures["last_second_tflops"]) == (700.0, 600.0)
    assert (figures["seconds"], figures["batches"]) == (4.5, 3)
    # the run's length as the clock read it, to the millisecond
    assert gw.windows([(0.5, 1.0), (2.34567, 1.0)])["seconds"] == 2.346


def test_reasons_active_read_while_loaded() -> None:
    gw = load("gpu_worker")
    text = "    Clocks Event Reasons\n        Idle                  : Not Active\n        SW Power Cap          : Active\n        HW Slowdown           : Not Active\n    Other Section\n        Thing                 : Active\n"
    assert gw.reasons_active(text) == ["SW Power Cap"]


def test_reasons_active_are_the_lines_inside_the_section_only() -> None:
    """`nvidia-smi -q` as an H200 printed it (idle), with reasons set Active: a nested one and the
    section's last; what follows the section (at its header's depth or shallower) is no reason,
    whatever it says; and without `-i`, every GPU's section is read."""
    gw = load("gpu_worker")
    real = (Path(__file__).parent / "nvidia-smi-q-h200.txt").read_text()
    busy = real.replace(
        "HW Thermal Slowdown                        : Not Active", "HW Thermal Slowdown : Active"
    ).replace("Display Clock Setting                          : Not Active", "Display Clock Setting : Active")
    assert busy.count(": Active") == 2
    assert gw.reasons_active(busy) == ["HW Thermal Slowdown", "Display Clock Setting"]
    section = "    Clocks Event Reasons\n        SW Power Cap : Active\n"
    assert gw.reasons_active(section + "    Sparse Operation Mode : Active\n") == ["SW Power Cap"]
    assert gw.reasons_active("  GPU\n" + section + "  Summary : Active\n") == ["SW Power Cap"]
    two_gpus = busy + busy.replace("Display Clock Setting : Active", "Display Clock Setting : Not Active")
    assert gw.reasons_active(two_gpus) == [
        "HW Thermal Slowdown",
        "Display Clock Setting",
        "HW Thermal Slowdown",
    ]


def test_every_fact_the_node_check_reports_is_known_to_the_attestation() -> None:
    """A fact the statement does not know stops the run after the stage passed (seen on an H200)."""
    import re

    from imagegate.attest.statement import COMMON_CARRIED, FACTS

    source = (PROBES / "gpu_preflight.py").read_text()
    reported = set(re.findall(r'data\["(\w+)"\]', source)) | {"host", "params"}
    rules = FACTS["gpu_preflight"]
    assert reported <= {*COMMON_CARRIED, *rules.carried, *rules.evidence_only}, reported


def test_node_facts_of_a_real_h200(gp) -> None:  # type: ignore[no-untyped-def]
    """`nvidia-smi -q` as an H200 (driver 580.159.04) printed it on 2026-12-01, idle: a fit node."""
    text = (Path(__file__).parent / "nvidia-smi-q-h200.txt").read_text()
    (g,) = gp.node_facts(text)
    assert g["name"] == "NVIDIA H200" and g["persistence_mode"] == "Enabled"
    assert g["pcie_generation"] == {"current": "5", "max": "5"} and g["pcie_width"] == {
        "current": "16x",
        "max": "16x",
    }
    assert g["ecc_mode"] == "Enabled" and g["ecc_uncorrected"] == {"Volatile": 0, "Aggregate": 0}
    assert g["remapped_rows"] == {"pending": "No", "failure": "No"}
    assert g["event_reasons_active"] == [] and g["processes"] == "None"
    assert gp.node_faults([g], {}) == []
