#!/usr/bin/env bash
# The serve stage on a real GPU, as a user would run it, with no container engine and no network:
#   (a) the tiny random-weight model made offline (tests/images/transformers-serve's tiny_models.py)
#   (b) imagegate run --here -p <serve on cuda> --model M --gpus all      -> PASS: the timeline on
#       the GPU, the phases, the recommended startupProbe, chat, streaming, bad media, recovery
#   (c) the same with GPUs hidden -> CPU_PASS_SERVE_DEFERRED (the raw failure kept), then
#       imagegate complete <that attempt> --here --gpus all -> PASS, linked; imagegate verify
#   (d) benchmarks/bench_serve.py --here: the same server by hand, its /health polled every
#       0.05 s, beside stage runs (interleaved): the seconds the stage adds to readiness
#   (e) summary.json: the timelines, the startupProbe, the verdicts, the by-hand figures
# Everything lands under $OUT: log.txt, summary.json, evidence.tar.gz (every attempt), pub.pem.
#
# Needs python3 with torch (CUDA), transformers[serving] (>= 5.20: `transformers serve`, fastapi,
# uvicorn) and accelerate; imagegate runs from src/ with the wheels `scripts/gpu-wheels.py --serve
# --download .whl` fetches (imagegate's own and transformers serve's), installed from .whl/ into
# $SITE when present.
# The one command, on an H200 host from the project root (COMMIT: the commit the tree is, for the
# record, where the copy has no git):
#   COMMIT=$(git rev-parse HEAD) OUT=/tmp/gpu-serve bash scripts/gpu-serve.sh
# (through the device tool: carry [".whl"], command `bash scripts/gpu-serve.sh`, then keep $OUT's
# summary.json as benchmarks/records/<date>-gpu-serve-h200.md/.json).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-serve-out}
SITE=${SITE:-/tmp/site}
STEP_TIMEOUT=${IMAGEGATE_STEP_TIMEOUT:-900}
DEVICE=${DEVICE:-cuda}  # where transformers puts the model; DEVICE=cpu GPUS= is a dry run without a GPU
GPUS=${GPUS-all}
GPU_ARGS=(); [ -n "$GPUS" ] && GPU_ARGS=(--gpus "$GPUS")
WORK_PREFIX=gpu-serve
# shellcheck source=scripts/device-env.sh
source "$ROOT/scripts/device-env.sh"
export HF_HUB_OFFLINE=1

say "(a) tiny model, offline"
python3 "$ROOT/tests/images/transformers-serve/opt/imagegate-test/tiny_models.py" "$WORK/models" >>"$LOG" 2>&1 \
    || { say "could not make the model (transformers, tokenizers, torch needed)"; exit 3; }
MODEL=$WORK/models/tiny-llama
ig keygen --out "$WORK/key" >>"$LOG" 2>&1 || { say "keygen failed"; exit 3; }
export IMAGEGATE_SIGNING_KEY=$WORK/key.key
cp "$WORK/key.pub" "$OUT/pub.pem"
UNISOLATED=()  # --here signs only where bubblewrap hides the key; a bare box signs anyway, saying so
command -v bwrap >/dev/null || { UNISOLATED=(--sign-unisolated); say "no bwrap: signing with --sign-unisolated"; }
latest() { ls -d "$RUNS"/ref-local/*/ 2>/dev/null | sort | tail -1; }

pipeline() {  # $1: requires gpu (yes/no)
    python3 - "$1" "$DEVICE" <<'PY'
import json, sys
stage = {"id": "serve", "probe": "serve", "timeout": "15m",
         "with": {"command": ["transformers", "serve", "--host", "{host}", "--port", "{port}",
                              "--device", sys.argv[2], "{model}"], "engine": "transformers"}}
if sys.argv[1] == "yes":
    stage["requires"] = ["gpu"]
print(json.dumps({"apiVersion": "imagegate/v1", "name": "serve-cuda", "stages": [stage]}))
PY
}
pipeline no >"$WORK/serve.yaml"
pipeline yes >"$WORK/serve-gpu.yaml"

say "(b) the serve stage on the GPU"
ig run --here "${UNISOLATED[@]}" -p "$WORK/serve.yaml" --model "$MODEL" "${GPU_ARGS[@]}" -o "$RUNS" \
    --format json >"$OUT/b.json" 2>>"$LOG"; echo "exit $?" | tee -a "$LOG"

say "(c) GPUs hidden, then completed on them (the plan keeps the model's path: --here uses it in place)"
ig run --here "${UNISOLATED[@]}" -p "$WORK/serve-gpu.yaml" --model "$MODEL" -o "$RUNS" \
    --format json >"$OUT/c1.json" 2>>"$LOG"; echo "exit $?" | tee -a "$LOG"
FIRST=$(latest)
ig complete "$FIRST" --here "${UNISOLATED[@]}" "${GPU_ARGS[@]}" >>"$LOG" 2>&1; echo "exit $?" | tee -a "$LOG"
SECOND=$(latest)
cp "$SECOND/statement.json" "$OUT/c2-statement.json" 2>/dev/null
ig verify "$SECOND/attestation.dsse.json" --key "$WORK/key.pub" >>"$LOG" 2>&1
echo "verify exit $?" | tee -a "$LOG"

say "(d) by hand against the stage, interleaved (benchmarks/bench_serve.py --here)"
timeout --kill-after=10 "$STEP_TIMEOUT" python3 "$ROOT/benchmarks/bench_serve.py" --here --model "$MODEL" --device "$DEVICE" "${GPU_ARGS[@]}" \
    --record "$OUT/bench_serve.json" >>"$LOG" 2>&1
echo "exit $?" | tee -a "$LOG"

say "(e) summary"
python3 - "$OUT" <<'PY' | tee -a "$LOG"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def stage(name):
    try:
        doc = json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None
    p = doc.get("predicate") or doc
    s = next((s for s in p["stages"] if s["id"] == "serve"), {})
    facts = s.get("facts") or {}
    return {"verdict": p["verdict"], "status": s.get("status"), "detail": s.get("detail"),
            "timeline": facts.get("timeline"), "phases": facts.get("phases"),
            "startup_probe": facts.get("startup_probe"), "gpu": p["environment"].get("gpu")}
bench = out / "bench_serve.json"
import datetime, os, subprocess
try:
    gpus = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
except (OSError, subprocess.SubprocessError):
    gpus = []
summary = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": os.environ.get("COMMIT"), "nvidia_smi": gpus,
           "gpu_run": stage("b.json"), "hidden": stage("c1.json"), "completed": stage("c2-statement.json"),
           "bench_serve": json.loads(bench.read_text()) if bench.exists() else None}
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
PY
tar -czf "$OUT/evidence.tar.gz" -C "$WORK" runs 2>>"$LOG"
rm -rf "$WORK"
