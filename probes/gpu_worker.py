"""The GPU node check's workers: each runs in a process of its own (started by gpu_preflight
with the image's python), imports the image's torch and writes one JSON result file. Kept out of
the probe's process so that every step is bounded by a timeout and a hang is killed whole.

    python -c BOOT ROOT facts OUT
    python -c BOOT ROOT matmul OUT SIZE WARMUP ITERS
    python -c BOOT ROOT allreduce OUT RANK WORLD RENDEZVOUS_FILE NBYTES WARMUP ITERS

Progress lines `imagegate-step: NAME` go to stderr, so a step that hangs can be named.
"""

from __future__ import annotations

import json
import math
import sys
import time

TOLERANCE = 1e-2  # max |bf16 result - float32 reference| over a block, relative to max |reference|
BLOCK = 256  # rows and columns of the block compared with the float32 reference


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


def matmul(size: int, warmup: int, iters: int) -> dict:
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
        del a, b, c, ref, got
        torch.cuda.empty_cache()
    return {"gpus": results}


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
        dist.barrier()
        step("all_reduce timed")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(x)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000.0 / iters
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
        result = matmul(int(argv[2]), int(argv[3]), int(argv[4]))
    elif kind == "allreduce":
        result = allreduce(int(argv[2]), int(argv[3]), argv[4], int(argv[5]), int(argv[6]), int(argv[7]))
    else:
        raise SystemExit("unknown worker %r" % kind)
    result["wall_s"] = round(time.monotonic() - t0, 3)
    with open(out, "w") as f:
        json.dump(result, f)
    step("done")
    return 0
