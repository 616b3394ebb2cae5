"""Why a GPU node is not fit, named (probes/pending/gpu_causes.py, not yet in the node check): a GPU in use before the check, a PCIe
link below its maximum under load, Xid events, NVLink links down, on the real H200's recorded
`nvidia-smi -q` and the forms nvidia-smi's queries and the driver's Xid lines print. No GPU is
faked: each case is judged from data."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.probes.test_parsers import load


@pytest.fixture(scope="module")
def gc():  # type: ignore[no-untyped-def]
    return load("pending.gpu_causes")


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
