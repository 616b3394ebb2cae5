"""Why a GPU node is not fit, named (probes/gpu_causes.py, called by the node check): a GPU in use before the check, a PCIe
link below its maximum under load, Xid events, NVLink links down, on the real H200's recorded
`nvidia-smi -q` and the forms nvidia-smi's queries and the driver's Xid lines print. No GPU is
faked: each case is judged from data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.probes.test_parsers import load


@pytest.fixture(scope="module")
def gc():  # type: ignore[no-untyped-def]
    return load("gpu_causes")


def _nodes(text: str) -> list:  # type: ignore[type-arg]
    """What gpu_preflight reads of `nvidia-smi -q`, per GPU (its processes among them)."""
    return load("gpu_preflight").node_facts(text)  # type: ignore[no-any-return]


# -- before any load, links and logs: each unfit case names its cause ---------------------------
# The real H200's `nvidia-smi -q` (nvidia-smi-q-h200.txt), idle, and in the forms nvidia-smi's
# --query-gpu prints the same facts (csv, noheader, nounits), each perturbed into one way a
# shared fleet fails; the Xid lines in the form the driver logs them (NVIDIA's Xid catalog).
H200_Q = (Path(__file__).parent / "nvidia-smi-q-h200.txt").read_text()
IDLE = "0, 0, 143771, 0, 0\n"


def test_an_idle_gpu_is_not_busy(gc) -> None:  # type: ignore[no-untyped-def]
    samples = [gc.parse_load(IDLE)] * 5
    assert gc.busy_before(samples, _nodes(H200_Q)) == []


@pytest.mark.parametrize(
    ("rows", "said"),
    [
        # another process computing: utilization in one of the ~1 s of samples is enough
        (
            ["0, 812, 143771, 0, 0\n", "0, 812, 143771, 97, 41\n"],
            "GPU 0 in use before the check: 812 MiB used, 97 % utilization (another process)",
        ),
        # another process holding most of the memory, idle at the moment
        (
            ["0, 120000, 143771, 0, 0\n"],
            "GPU 0 in use before the check: 120000 MiB used, 0 % utilization (another process)",
        ),
    ],
    ids=["busy", "memory held"],
)
def test_a_gpu_in_use_before_the_check_is_named_with_its_figures(gc, rows: list[str], said: str) -> None:  # type: ignore[no-untyped-def]
    assert gc.busy_before([gc.parse_load(r) for r in rows], _nodes(H200_Q)) == [said]


def test_processes_nvidia_smi_lists_make_the_gpu_in_use(gc) -> None:  # type: ignore[no-untyped-def]
    listed = H200_Q.replace(
        "    Processes                                          : None",
        "    Processes\n        GPU instance ID                   : N/A\n        Process ID                        : 4242\n"
        "            Type                          : C\n            Name                          : python3\n"
        "            Used GPU Memory               : 600 MiB",
    )
    assert listed != H200_Q
    (said,) = gc.busy_before([gc.parse_load(IDLE)], _nodes(listed))
    assert said == "GPU 0 in use before the check: 0 MiB used, 0 % utilization (processes listed)"


def test_a_pcie_link_below_its_maximum_under_load_is_named(gc) -> None:  # type: ignore[no-untyped-def]
    # idle, a GPU lowers its generation (gen 1 here) and raises it under load: the best seen counts
    full = [gc.parse_pcie("0, 1, 5, 16, 16\n"), gc.parse_pcie("0, 5, 5, 16, 16\n")]
    assert gc.link_downgrades(full) == []
    gen3 = [gc.parse_pcie("0, 1, 5, 16, 16\n"), gc.parse_pcie("0, 3, 5, 16, 16\n")]
    assert gc.link_downgrades(gen3) == [
        "GPU 0: PCIe link gen 3 x16 under load, its maximum gen 5 x16 (link downgraded)"
    ]
    x8 = [gc.parse_pcie("0, 5, 5, 8, 16\n")]
    assert gc.link_downgrades(x8) == [
        "GPU 0: PCIe link gen 5 x8 under load, its maximum gen 5 x16 (link downgraded)"
    ]
    assert gc.link_downgrades([gc.parse_pcie("0, [N/A], 5, 16, 16\n")]) == []  # unreadable: not judged


XIDS = [
    "[ 5102.101] NVRM: Xid (PCI:0000:18:00): 79, pid=2241, name=python3, GPU has fallen off the bus.",
    "[ 6011.337] NVRM: Xid (PCI:0000:2a:00): 48, pid=3310, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 2, subpartition 0.",
    "[ 7210.005] NVRM: Xid (PCI:0000:3b:00): 94, pid=4102, name=python3, Contained: CE User Channel (0x9). RST: No, D-RST: No",
]


def test_xid_events_name_their_cause_and_what_to_do(gc) -> None:  # type: ignore[no-untyped-def]
    problems, notes = gc.judge_xids({"readable": True, "count": 3, "events": XIDS})
    assert problems == [
        "GPU 0000:18:00: Xid 79 (GPU has fallen off the bus) since boot: reboot the node",
        "GPU 0000:2a:00: Xid 48 (double-bit ECC error) since boot: reset the GPU",
    ]
    # contained: the application that hit it was stopped, the GPU goes on
    assert notes == ["GPU 0000:3b:00: Xid 94 (contained ECC error) since boot: restart the application"]
    assert gc.judge_xids(
        {"readable": False, "why": "dmesg: read kernel buffer failed: Operation not permitted"}
    ) == ([], ["Xid events not readable (dmesg: read kernel buffer failed: Operation not permitted)"])


# `nvidia-smi nvlink -s` and `-e` on a 2-GPU H200 node in the form they print (18 links a GPU).
def _nvlink(inactive: int = 0, recovery: int = 0) -> tuple[str, str]:
    status, errors = "", ""
    for gpu in (0, 1):
        status += f"GPU {gpu}: NVIDIA H200 (UUID: GPU-{gpu}a)\n"
        errors += f"GPU {gpu}: NVIDIA H200 (UUID: GPU-{gpu}a)\n"
        for link in range(18):
            down = gpu == 1 and link < inactive
            status += f"\t Link {link}: " + ("<inactive>\n" if down else "26.562 GB/s\n")
            for kind, n in (
                ("Replay Errors", 0),
                ("Recovery Errors", recovery if gpu == 0 and link == 3 else 0),
                ("CRC Errors", 0),
            ):
                errors += f"\t Link {link}: {kind}: {n}\n"
    return status, errors


def test_nvlink_links_down_or_recovering_are_named(gc) -> None:  # type: ignore[no-untyped-def]
    assert gc.nvlink_problems(gc.parse_nvlink(*_nvlink())) == []
    assert gc.nvlink_problems(gc.parse_nvlink(*_nvlink(inactive=2))) == [
        "GPU 1: 16 of 18 NVLink links active (its peers have 18)"
    ]
    assert gc.nvlink_problems(gc.parse_nvlink(*_nvlink(recovery=5))) == ["GPU 0: 5 NVLink recovery errors"]
    one = gc.parse_nvlink("GPU 0: NVIDIA H200 (UUID: GPU-0a)\n\t Link 0: <inactive>\n")
    assert gc.nvlink_problems(one) == []  # one GPU: no peers, nothing to compare


def test_the_likeliest_cause_of_a_missed_figure(gc) -> None:  # type: ignore[no-untyped-def]
    nodes = [{"bus_id": "00000000:18:00.0", "event_reasons_active": ["SW Power Cap", "HW Slowdown"],
              "ecc_uncorrected": {"Volatile": 2}}]  # fmt: skip
    down = gc.link_downgrades([gc.parse_pcie("0, 3, 5, 16, 16\n")])
    assert gc.likeliest_cause(nodes, down) == (
        "likeliest cause: GPU 0: PCIe link gen 3 x16 under load, its maximum gen 5 x16 (link downgraded); "
        "GPU 00000000:18:00.0 clocks slowed by HW Slowdown; GPU 00000000:18:00.0 has uncorrected ECC errors"
    )
    assert gc.likeliest_cause([{"bus_id": "x", "event_reasons_active": ["SW Power Cap"]}], []) == ""


# -- wired into the node check (probes/gpu_preflight.py) -----------------------------------------
# A GPU cannot start here: `nvidia-smi` is a fake on PATH (named as such), a shell script that
# prints what the real one prints for each query (the H200's `-q` recorded above), so the node
# check's own code reads it as it reads the real one.


def _fake_smi(folder: Path, load_rows: str, pcie_rows: str = "0, 5, 5, 16, 16\n") -> Path:
    (folder / "q.txt").write_text(H200_Q)
    (folder / "load.txt").write_text(load_rows)
    (folder / "pcie.txt").write_text(pcie_rows)
    smi = folder / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        f'case "$1" in\n'
        f'  -q) cat "{folder}/q.txt" ;;\n'
        f'  --query-gpu=index,memory.used*) cat "{folder}/load.txt" ;;\n'
        f'  --query-gpu=index,pcie*) cat "{folder}/pcie.txt" ;;\n'
        '  nvlink) echo "nvlink: not supported" >&2; exit 3 ;;\n'
        "  *) exit 0 ;;\n"
        "esac\n"
    )
    smi.chmod(0o755)
    return smi


@pytest.fixture()
def gp():  # type: ignore[no-untyped-def]
    return load("gpu_preflight")


def test_a_busy_gpu_ends_the_check_before_any_worker_names_the_cause(gp, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _fake_smi(tmp_path, "0, 120000, 143771, 0, 0\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    out = gp.run({})
    assert out["status"] == "ERROR"
    assert out["detail"] == (
        "node not fit: GPU 0 in use before the check: 120000 MiB used, 0 % utilization (another process)"
    )
    data = out["data"]
    assert "facts" not in data and "matmul" not in data and data["unfit"] == "node"  # no worker ran
    assert len(data["host"]["load_before"]["samples"]) == gp.LOAD_SAMPLES
    # the thresholds are the pipeline's parameters
    assert not gp.run({"max_busy_used_mib": 200000})["detail"].startswith("node not fit: GPU 0 in use")


def test_an_idle_gpu_goes_on_to_the_workers(gp, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _fake_smi(tmp_path, IDLE)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    out = gp.run({})
    # no torch in this interpreter: the facts worker ran and said so (the busy check let it)
    assert out["detail"].startswith("no torch in this image"), out["detail"]
    assert out["data"]["host"]["nvlink_status_error"].endswith("nvlink: not supported")


def test_the_pcie_link_is_read_while_the_block_runs(gp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    smi = _fake_smi(tmp_path, IDLE, "0, 3, 5, 16, 16\n")
    gc = load("gpu_causes")
    with gp.sampling(str(smi), gc.PCIE_QUERY, gc.parse_pcie) as got:
        pass
    assert got["samples"] == [[{"index": 0, "gen": 3.0, "gen_max": 5.0, "width": 16.0, "width_max": 16.0}]]
    with gp.sampling(None, gc.PCIE_QUERY, gc.parse_pcie) as none:
        pass
    assert none == {}


H200 = {"devices": [{"index": 0, "name": "NVIDIA H200", "capability": "9.0"}], "torch": "2.9.0",
        "cuda_runtime": "12.8", "arch_list": ["sm_90"], "driver": "580.159.04"}  # fmt: skip
MATMUL_SLOW = {"gpus": [{"index": 0, "size": 8192, "tflops": 331.0, "finite": True, "relative_error": 0.001,
                         "tolerance": 0.01}]}  # fmt: skip


def test_links_and_logs_are_judged_and_a_missed_figure_gets_its_likeliest_cause(gp) -> None:  # type: ignore[no-untyped-def]
    gc = load("gpu_causes")
    down = {"pcie_under_load": {"samples": [gc.parse_pcie("0, 3, 5, 16, 16\n")]},
            "xid": {"readable": True, "events": ["NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus."]}}  # fmt: skip
    got = gp.judge(H200, MATMUL_SLOW, None, {"min_tflops": 494.5}, host=down)
    assert got["status"] == "ERROR"
    assert got["detail"].startswith(
        "node not fit: GPU 0: 331.0 TFLOP/s < min_tflops 494.5; likeliest cause: GPU 0: PCIe link gen 3 x16 "
        "under load, its maximum gen 5 x16 (link downgraded); GPU 0: PCIe link gen 3 x16"
    ), got["detail"]
    assert "Xid 79 (GPU has fallen off the bus) since boot: reboot the node" in got["detail"]
    # the same figure met, an idle log unreadable: PASS, the log's state said
    fast = {"gpus": [dict(MATMUL_SLOW["gpus"][0], tflops=700.0)]}
    fine = gp.judge(H200, fast, None, {"min_tflops": 494.5}, host={"xid": {"readable": False, "why": "no dmesg in the image"}})  # fmt: skip
    assert fine["status"] == "PASS" and "Xid events not readable (no dmesg in the image)" in fine["detail"]
