"""The GPU node check's workers: each runs in a process of its own (started by gpu_preflight
with the image's python), imports the image's torch and writes one JSON result file. Kept out of
the probe's process so that every step is bounded by a timeout and a hang is killed whole.

    python -c BOOT ROOT facts OUT
    python -c BOOT ROOT matmul OUT SIZE WARMUP ITERS [SUSTAIN_S]
    python -c BOOT ROOT bandwidth OUT NBYTES ITERS
    python -c BOOT ROOT allreduce OUT RANK WORLD RENDEZVOUS_FILE NBYTES WARMUP ITERS

Progress lines `imagegate-step: NAME` go to stderr, so a step that hangs can be named.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time

TOLERANCE = 1e-2  # max |bf16 result - float32 reference| over a block, relative to max |reference|
BLOCK = 256  # rows and columns of the block compared with the float32 reference
SWEEP_BYTES = (8 << 20, 64 << 20, 256 << 20)  # all-reduce sizes timed below the largest


def tflops(size: int, seconds: float) -> float | None:
    """TFLOP/s of one size x size x size matmul taking `seconds`: 2 n^3 floating-point operations
    (a multiply and an add per term)."""
    return 2.0 * size**3 / seconds / 1e12 if seconds > 0 else None


def gbps(nbytes: float, seconds: float) -> float | None:
    """GB/s (10^9 bytes a second) of `nbytes` moved in `seconds`."""
    return nbytes / seconds / 1e9 if seconds > 0 else None


def busbw(algbw: float, world: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce from its algorithm bandwidth: algbw * 2(n-1)/n."""
    return algbw * 2.0 * (world - 1) / world


def step(name: str) -> None:
    sys.stderr.write("imagegate-step: %s\n" % name)
    sys.stderr.flush()


def facts() -> dict:
    step("import torch")
    import torch

    out = {
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "step": "cuda init",
    }
    step("cuda init")
    out["cuda_available"] = bool(torch.cuda.is_available())
    out["arch_list"] = list(torch.cuda.get_arch_list()) if out["cuda_available"] else []
    out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
    devices = []
    for i in range(out["device_count"]):
        step("device %d properties" % i)
        p = torch.cuda.get_device_properties(i)
        d = {
            "index": i,
            "name": p.name,
            "capability": "%d.%d" % (p.major, p.minor),
            "total_memory_bytes": int(p.total_memory),
            "multiprocessors": int(getattr(p, "multi_processor_count", 0)),
        }
        uuid = getattr(p, "uuid", None)
        if uuid is not None:
            d["uuid"] = str(uuid)
        try:
            free, _total = torch.cuda.mem_get_info(i)
            d["free_memory_bytes"] = int(free)
        except Exception as e:  # an old torch, or a device that cannot be queried
            d["free_memory_error"] = "%s: %s" % (type(e).__name__, e)
        devices.append(d)
    out["devices"] = devices
    out.pop("step")
    return out


def reasons_active(text: str) -> list:
    """The active clock event (throttle) reasons of `nvidia-smi -q -d PERFORMANCE` text."""
    out, depth = [], None  # depth: the section header's indentation while inside it
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        if re.match(r"\s*Clocks? (Event|Throttle) Reasons\s*$", line):
            depth = indent
            continue
        if depth is not None:
            m = re.match(r"\s+(.+?)\s*:\s*(\S.*)$", line)
            if not m or indent <= depth:
                depth = None
                continue
            if m.group(2).strip() == "Active":
                out.append(m.group(1).strip())
    return out


def _smi_sample(index: int):
    """nvidia-smi's clocks, power, temperature and event reasons, read while the GPU is loaded."""
    try:
        return subprocess.Popen(
            ["nvidia-smi", "-q", "-d", "PERFORMANCE,CLOCK,POWER,TEMPERATURE", "-i", str(index)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    except OSError:
        return None


def _smi_facts(proc) -> dict:
    if proc is None:
        return {"error": "nvidia-smi not found"}
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return {"error": "nvidia-smi -q did not answer in 30 s"}
    text = out.decode("utf-8", "replace")
    facts = {"event_reasons_active": reasons_active(text)}
    for key, pattern in (
        ("sm_clock_mhz", r"\n\s+Clocks\s*\n(?:.*\n)*?\s+SM\s*:\s*(\d+) MHz"),
        ("max_sm_clock_mhz", r"Max Clocks\s*\n(?:.*\n)*?\s+SM\s*:\s*(\d+) MHz"),
        ("power_draw_w", r"Instantaneous Power Draw\s*:\s*([\d.]+) W"),
        ("average_power_draw_w", r"Average Power Draw\s*:\s*([\d.]+) W"),
        ("temperature_c", r"GPU Current Temp\s*:\s*(\d+) C"),
    ):
        m = re.search(pattern, text)
        if m:
            facts[key] = float(m.group(1))
    if proc.returncode:
        facts["error"] = text.strip().splitlines()[-1:] or ["nvidia-smi exited %s" % proc.returncode]
    return facts


def sustained(torch, a, b, c, index: int, seconds: float, per_matmul_s: float) -> dict:
    """The matmul held for `seconds`: the rate of each ~50 ms batch (CUDA events), the first and
    the last second's mean, the lowest, and nvidia-smi read in the last second (clocks, power,
    event reasons): throttling shows."""
    batch = max(1, int(0.05 / per_matmul_s)) if per_matmul_s > 0 else 1
    rates, smi, t0 = [], None, time.monotonic()
    while True:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(batch):
            torch.matmul(a, b, out=c)
        end.record()
        end.synchronize()
        now = time.monotonic() - t0
        rates.append((now, tflops(a.shape[0], start.elapsed_time(end) / 1000.0 / batch) or 0.0))
        if smi is None and now >= seconds - 0.5:
            smi = _smi_sample(index)
        if now >= seconds:
            break
    return dict(windows(rates), during_last_second=_smi_facts(smi))


def windows(rates: list) -> dict:
    """The figures of a sustained run from its `(seconds since the start, TFLOP/s)` batches: the
    mean of those ending in the first second and of those in the last second (a first batch
    longer than a second stands for the first second alone), and the lowest."""
    now = rates[-1][0]
    first = [r for t, r in rates if t <= 1.0] or [rates[0][1]]
    last = [r for t, r in rates if t >= now - 1.0]  # never empty: the last batch ends at `now`
    return {
        "seconds": round(now, 3),
        "batches": len(rates),
        "first_second_tflops": sum(first) / len(first),
        "last_second_tflops": sum(last) / len(last),
        "min_tflops": min(r for _, r in rates),
    }


def matmul(size: int, warmup: int, iters: int, sustain_s: float = 0.0) -> dict:
    step("import torch")
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference is float32
    results = []
    for i in range(torch.cuda.device_count()):
        dev = torch.device("cuda", i)
        step("matmul gpu %d: allocate %dx%d bf16" % (i, size, size))
        gen = torch.Generator(device=dev)
        gen.manual_seed(1234 + i)
        a = torch.randn(size, size, device=dev, dtype=torch.bfloat16, generator=gen)
        b = torch.randn(size, size, device=dev, dtype=torch.bfloat16, generator=gen)
        c = torch.empty(size, size, device=dev, dtype=torch.bfloat16)
        step("matmul gpu %d: warmup" % i)
        for _ in range(warmup):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize(dev)
        step("matmul gpu %d: timed" % i)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.device(dev):
            start.record()
            for _ in range(iters):
                torch.matmul(a, b, out=c)
            end.record()
        end.synchronize()
        ms = start.elapsed_time(end) / iters
        if sustain_s > 0:
            step("matmul gpu %d: sustained %gs" % (i, sustain_s))
            with torch.cuda.device(dev):
                held = sustained(torch, a, b, c, i, sustain_s, ms / 1000.0)
        step("matmul gpu %d: check" % i)
        finite = bool(torch.isfinite(c).all().item())
        k = min(BLOCK, size)
        ref = a[:k].float() @ b[:, :k].float()
        got = c[:k, :k].float()
        err = float((got - ref).abs().max().item())
        scale = float(ref.abs().max().item())
        results.append(
            {
                "index": i,
                "size": size,
                "seconds_per_matmul": ms / 1000.0,
                "tflops": tflops(size, ms / 1000.0),
                "finite": finite,
                "block": k,
                "max_abs_error": err,
                "reference_max_abs": scale,
                "relative_error": err / scale if scale > 0 else (0.0 if err == 0 else math.inf),
                "tolerance": TOLERANCE,
            }
        )
        if sustain_s > 0:
            results[-1]["sustained"] = held
        del a, b, c, ref, got
        torch.cuda.empty_cache()
    return {"gpus": results}


def _timed_copies(torch, dst, src, iters: int) -> float:
    """Seconds for `iters` copies of src into dst, timed with CUDA events after one untimed."""
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        dst.copy_(src, non_blocking=True)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0


def bandwidth(nbytes: int, iters: int) -> dict:
    """Per GPU: HBM device-to-device copy (bytes read + written), pinned host-to-GPU and GPU-to-host;
    with 2 or more GPUs every ordered pair's peer copy (GPU i to GPU j, one direction)."""
    step("import torch")
    import torch

    n = torch.cuda.device_count()
    gpus, pairs = [], []
    step("pin %d bytes of host memory" % nbytes)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    for i in range(n):
        with torch.cuda.device(i):
            step("bandwidth gpu %d: device copy" % i)
            a = torch.empty(nbytes, dtype=torch.uint8, device=i)
            b = torch.empty(nbytes, dtype=torch.uint8, device=i)
            d2d = _timed_copies(torch, b, a, iters)
            step("bandwidth gpu %d: host to gpu" % i)
            h2d = _timed_copies(torch, a, host, iters)
            step("bandwidth gpu %d: gpu to host" % i)
            d2h = _timed_copies(torch, host, a, iters)
            gpus.append(
                {
                    "index": i,
                    "bytes": nbytes,
                    "hbm_copy_gbps": gbps(2 * nbytes * iters, d2d),
                    "h2d_gbps": gbps(nbytes * iters, h2d),
                    "d2h_gbps": gbps(nbytes * iters, d2h),
                }
            )
            del a, b
            torch.cuda.empty_cache()
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            step("p2p gpu %d -> gpu %d" % (i, j))
            with torch.cuda.device(i):
                src = torch.empty(nbytes, dtype=torch.uint8, device=i)
                dst = torch.empty(nbytes, dtype=torch.uint8, device=j)
                sec = _timed_copies(torch, dst, src, iters)
            peer = bool(torch.cuda.can_device_access_peer(i, j))
            pairs.append({"src": i, "dst": j, "peer_access": peer, "gbps": gbps(nbytes * iters, sec)})
            del src, dst
    return {"gpus": gpus, "p2p": pairs}


def allreduce(rank: int, world: int, rendezvous: str, nbytes: int, warmup: int, iters: int) -> dict:
    step("import torch")
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    step("init_process_group (nccl, file rendezvous)")
    dist.init_process_group("nccl", init_method="file://" + rendezvous, rank=rank, world_size=world)
    try:
        n = max(1, nbytes // 4)
        x = torch.empty(n, device=dev, dtype=torch.float32)
        expected = world * (world + 1) / 2.0  # rank r contributes r+1: an exact float32 sum
        checks = []

        def check(when: str) -> None:
            x.fill_(rank + 1.0)
            dist.all_reduce(x)
            torch.cuda.synchronize(dev)
            lo, hi = float(x.min().item()), float(x.max().item())
            checks.append(
                {"when": when, "expected": expected, "min": lo, "max": hi, "ok": lo == hi == expected}
            )

        step("first all_reduce (sum check)")
        check("before timing")
        step("all_reduce warmup")
        for _ in range(warmup):
            dist.all_reduce(x)
        torch.cuda.synchronize(dev)
        sizes = []
        for m in [*sorted({s // 4 for s in SWEEP_BYTES if s // 4 < n}), n]:
            dist.barrier()
            step("all_reduce timed, %d bytes" % (m * 4))
            part = x[:m]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                dist.all_reduce(part)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1000.0 / iters
            sizes.append({"bytes": m * 4, "busbw_gbps": busbw(gbps(m * 4, seconds) or 0.0, world)})
        step("last all_reduce (sum check)")
        check("after timing")
        algbw = gbps(n * 4, seconds)
        return {
            "rank": rank,
            "world": world,
            "bytes": n * 4,
            "seconds_per_allreduce": seconds,
            "algbw_gbps": algbw,
            "busbw_gbps": busbw(algbw, world) if algbw is not None else None,
            "sizes": sizes,
            "sum_checks": checks,
            "sum_ok": all(c["ok"] for c in checks),
        }
    finally:
        dist.destroy_process_group()


def main(argv) -> int:
    kind, out = argv[0], argv[1]
    t0 = time.monotonic()
    if kind == "facts":
        result = facts()
    elif kind == "matmul":
        result = matmul(int(argv[2]), int(argv[3]), int(argv[4]), float(argv[5]) if len(argv) > 5 else 0.0)
    elif kind == "bandwidth":
        result = bandwidth(int(argv[2]), int(argv[3]))
    elif kind == "allreduce":
        result = allreduce(int(argv[2]), int(argv[3]), argv[4], int(argv[5]), int(argv[6]), int(argv[7]))
    else:
        raise SystemExit("unknown worker %r" % kind)
    result["wall_s"] = round(time.monotonic() - t0, 3)
    with open(out, "w") as f:
        json.dump(result, f)
    step("done")
    return 0
