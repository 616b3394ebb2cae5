#!/usr/bin/env bash
# GPU acceptance on real hardware, as a user would do it, with no container engine and no network:
#   (a) imagegate run --here -p gpu --gpus all                  the node check alone
#   (b) imagegate run --here -p torch-gpu.yaml                  GPUs hidden -> CPU_PASS_GPU_TORCH_DEFERRED
#       imagegate complete <that attempt> --here --gpus all     -> PASS, linked to the first
#       imagegate verify <the completion>                       the chain: both signatures, the link
#   (c) the plain-torch baseline on the same GPUs: an 8192^3 bf16 matmul timed with CUDA events and
#       (2 or more GPUs) a 1 GiB torch.distributed all_reduce loop, one process per GPU
#   (d) summary.json: the node check's figures beside the baseline's, and the verdicts
# Any number of GPUs; well under 9 minutes on H200s. Everything lands under $OUT:
#   log.txt, summary.json, baseline.json, evidence.tar.gz (every attempt folder), pub.pem
#
# Run from the project root with `python3` holding torch (CUDA). imagegate itself runs from src/
# (PYTHONPATH); its runtime dependencies that such a machine may lack travel as wheels in .whl/
# and are installed with `pip install --no-index --no-deps --target /tmp/site .whl/*.whl`:
#   pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
#   typing_extensions==4.16.0 cryptography==50.0.2 cffi==2.1.1 platformdirs==4.14.8
#   typer==0.29.2 annotated-doc==0.0.7 rich==15.0.0 shellingham==1.5.4 PyYAML==6.0.4
# (`run --here`, `complete --here` and `verify` import nothing else: docker, httpx, pip-audit and
# kubernetes-validate are imported only by the commands and stages that use them. Checked with a
# bare Python that had none of them: these 13 wheels were enough.) Fetch them, for Python 3.12:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl <the names above>
# and run: device call with carry [".whl"], command `bash scripts/gpu-acceptance.sh` (it installs
# them into $SITE, default /tmp/site, itself).
#
# Environment: OUT (default ./gpu-acceptance-out), GPUS (default all), IMAGEGATE_STEP_TIMEOUT
# (seconds per imagegate command, default 240), SIZE (matmul n, default 8192), ALLREDUCE_BYTES
# (default 1 GiB).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-acceptance-out}
GPUS=${GPUS:-all}
SITE=${SITE:-/tmp/site}  # where the carried wheels are installed
STEP_TIMEOUT=${IMAGEGATE_STEP_TIMEOUT:-240}
SIZE=${SIZE:-8192}
ALLREDUCE_BYTES=${ALLREDUCE_BYTES:-1073741824}
TORCH_MODULES=${TORCH_MODULES:-torch, torch.distributed}  # a dry run without torch: TORCH_MODULES=json
WORK_PREFIX=gpu-acceptance
# shellcheck source=scripts/device-env.sh
source "$ROOT/scripts/device-env.sh"

say "date $(date -u +%Y-%m-%dT%H:%M:%SZ); host $(uname -n); python3 $(python3 -c 'import sys; print(sys.version.split()[0])')"
nvidia-smi --query-gpu=index,name,memory.total,memory.free,driver_version,compute_cap,uuid \
    --format=csv,noheader,nounits >>"$LOG" 2>&1 || say "nvidia-smi: not available"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(), torch.cuda.get_arch_list())' >>"$LOG" 2>&1 \
    || say "torch: not importable"

ig keygen --out "$WORK/key" >>"$LOG" 2>&1 || { say "keygen failed"; exit 3; }
export IMAGEGATE_SIGNING_KEY=$WORK/key.key
cp "$WORK/key.pub" "$OUT/pub.pem"

# --here signs only where bubblewrap hides the key from the probes; a GPU machine without it (a
# bare test box) signs anyway, and the statements say keyIsolation: none.
UNISOLATED=()
command -v bwrap >/dev/null || { UNISOLATED=(--sign-unisolated); say "no bwrap: signing with --sign-unisolated"; }

latest() { ls -d "$RUNS"/ref-local/*/ 2>/dev/null | sort | tail -1; }
verdict_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["predicate"]["verdict"])' "$1/statement.json" 2>/dev/null || echo none; }

# (a) the node check alone
say "(a) imagegate run --here -p gpu --gpus $GPUS"
T0=$(date +%s)
ig run --here "${UNISOLATED[@]}" -p gpu --gpus "$GPUS" -o "$RUNS" >>"$LOG" 2>&1
echo "exit $? in $(($(date +%s) - T0))s" | tee -a "$LOG"
NODE_ATTEMPT=$(latest)

# (b) deferred on the GPU host with its GPUs hidden, then completed with them
cat >"$WORK/torch-gpu.yaml" <<EOF
apiVersion: imagegate/v1
kind: Pipeline
name: torch-gpu
description: The environment's torch imports, and runs a CUDA kernel where there is a GPU.
stages:
  - id: find_spec
    probe: find_spec
    timeout: 2m
    with:
      modules: [$TORCH_MODULES]
  - id: gpu_torch
    probe: cli
    requires: [gpu]
    timeout: 4m
    with:
      command: [python3, -c, "import torch; assert torch.cuda.is_available(), 'CUDA not available'; x = torch.ones(1 << 20, device='cuda', dtype=torch.bfloat16); print('sum', float((x @ x).item()), torch.cuda.get_device_name(0))"]
      stdout_regex: "sum 1048576\\\\.0"
EOF
say "(b1) imagegate run --here -p torch-gpu.yaml   (GPUs hidden: the default)"
T0=$(date +%s)
ig run --here "${UNISOLATED[@]}" -p "$WORK/torch-gpu.yaml" -o "$RUNS" >>"$LOG" 2>&1
echo "exit $? in $(($(date +%s) - T0))s" | tee -a "$LOG"
FIRST=$(latest)
say "(b2) imagegate complete $FIRST --here --gpus $GPUS"
T0=$(date +%s)
ig complete "$FIRST" --here "${UNISOLATED[@]}" --gpus "$GPUS" >>"$LOG" 2>&1
echo "exit $? in $(($(date +%s) - T0))s" | tee -a "$LOG"
SECOND=$(latest)
say "(b3) imagegate verify $SECOND/attestation.dsse.json"
ig verify "$SECOND/attestation.dsse.json" --key "$WORK/key.pub" >>"$LOG" 2>&1
VERIFY_RC=$?
echo "exit $VERIFY_RC" | tee -a "$LOG"

# (c) the plain-torch baseline
say "(c) plain torch baseline: ${SIZE}^3 bf16 matmul per GPU, ${ALLREDUCE_BYTES}-byte all_reduce"
cat >"$WORK/baseline.py" <<'EOF'
import json, os, sys, tempfile
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZE, NBYTES, WARMUP, ITERS = int(sys.argv[1]), int(sys.argv[2]), 5, 20


def matmul(i):
    dev = torch.device("cuda", i)
    a = torch.randn(SIZE, SIZE, device=dev, dtype=torch.bfloat16)
    b = torch.randn(SIZE, SIZE, device=dev, dtype=torch.bfloat16)
    with torch.cuda.device(dev):
        for _ in range(WARMUP):
            c = a @ b
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(ITERS):
            c = a @ b
        e.record()
        e.synchronize()
    sec = s.elapsed_time(e) / 1000 / ITERS
    return {"index": i, "name": torch.cuda.get_device_name(i), "tflops": 2 * SIZE**3 / sec / 1e12}


def ranker(rank, world, rdv, q):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="file://" + rdv, rank=rank, world_size=world)
    x = torch.full((NBYTES // 4,), float(rank + 1), device="cuda")
    dist.all_reduce(x)
    ok = bool((x == world * (world + 1) / 2).all().item())
    for _ in range(WARMUP):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.barrier()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(ITERS):
        dist.all_reduce(x)
    e.record()
    e.synchronize()
    sec = s.elapsed_time(e) / 1000 / ITERS
    algbw = x.numel() * 4 / sec / 1e9
    q.put({"rank": rank, "sum_ok": ok, "algbw_gbps": algbw, "busbw_gbps": algbw * 2 * (world - 1) / world})
    dist.destroy_process_group()


if __name__ == "__main__":
    n = torch.cuda.device_count()
    out = {"torch": torch.__version__, "gpus": n, "matmul": [matmul(i) for i in range(n)]}
    if n >= 2:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        rdv = os.path.join(tempfile.mkdtemp(), "rdv")
        procs = [ctx.Process(target=ranker, args=(r, n, rdv, q)) for r in range(n)]
        for p in procs:
            p.start()
        ranks = sorted((q.get(timeout=300) for _ in range(n)), key=lambda r: r["rank"])
        for p in procs:
            p.join(60)
        out["allreduce"] = {"bytes": NBYTES, "ranks": ranks, "busbw_gbps_slowest": min(r["busbw_gbps"] for r in ranks)}
    else:
        out["allreduce"] = {"skipped": "%d GPU(s)" % n}
    print(json.dumps(out, indent=1))
EOF
T0=$(date +%s)
timeout --kill-after=10 300 python3 "$WORK/baseline.py" "$SIZE" "$ALLREDUCE_BYTES" >"$OUT/baseline.json" 2>>"$LOG"
echo "exit $? in $(($(date +%s) - T0))s" | tee -a "$LOG"
cat "$OUT/baseline.json" >>"$LOG"

# (d) the figures side by side
python3 - "$NODE_ATTEMPT" "$FIRST" "$SECOND" "$VERIFY_RC" "$OUT/baseline.json" >"$OUT/summary.json" 2>>"$LOG" <<'EOF'
import json, sys

node, first, second, verify_rc, base_path = sys.argv[1:6]


def statement(folder):
    try:
        with open(folder.rstrip("/") + "/statement.json") as f:
            return json.load(f)["predicate"]
    except (OSError, ValueError, KeyError):
        return {}


def node_facts(pred):
    for s in pred.get("stages", []):
        if s.get("probe") == "gpu_preflight":
            return {"status": s["status"], "detail": s["detail"], **s.get("facts", {})}
    return {}


try:
    base = json.load(open(base_path))
except (OSError, ValueError):
    base = {}
a, b1, b2 = statement(node), statement(first), statement(second)
nf = node_facts(a)
out = {
    "node_check": {"attempt": node, "verdict": a.get("verdict"), **nf},
    "deferred_run": {"attempt": first, "verdict": b1.get("verdict")},
    "completion": {
        "attempt": second,
        "verdict": b2.get("verdict"),
        "completes": b2.get("completes"),
        "node_check": node_facts(b2),
        "verify_exit": int(verify_rc),
    },
    "baseline": base,
}
ratios = {}
mm = {g["index"]: g.get("tflops") for g in (nf.get("matmul") or {}).get("gpus") or []}
for g in base.get("matmul") or []:
    if mm.get(g["index"]) and g.get("tflops"):
        ratios["matmul_gpu%d_node_check_over_baseline" % g["index"]] = mm[g["index"]] / g["tflops"]
ar = (nf.get("allreduce") or {}).get("ranks")
if ar and base.get("allreduce", {}).get("busbw_gbps_slowest"):
    ratios["allreduce_busbw_node_check_over_baseline"] = min(r["busbw_gbps"] for r in ar) / base["allreduce"]["busbw_gbps_slowest"]
out["ratios"] = ratios
print(json.dumps(out, indent=1))
EOF
cat "$OUT/summary.json" | tee -a "$LOG" | head -c 4000

tar czf "$OUT/evidence.tar.gz" -C "$WORK" runs torch-gpu.yaml baseline.py key.pub 2>>"$LOG"
say "done: $(ls "$OUT" | tr '\n' ' ')"
