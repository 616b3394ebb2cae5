#!/usr/bin/env bash
# The levels a signed verdict reaches, on a real GPU, through the same commands a GPU node runs
# (no container engine, no network there: `run --here` on the machine's own Python and torch):
#   (a) a pipeline shaped as the built-in sglang one (a CPU stage; the node check, gpu_preflight,
#       as its GPU stage), run with the GPUs hidden -> CPU_PASS_NODE_CHECK_DEFERRED, the VSA's
#       levels IMAGEGATE_CPU alone; verify exits 0 and says so
#   (b) imagegate complete <that attempt> --here --gpus all -> PASS, linked; the VSA's levels
#       IMAGEGATE_CPU and IMAGEGATE_GPU; verify exits 0; verify --require-complete of (a) exits 1
#   (c) the same pipeline on the GPUs with its CPU stage left out (--skip find_spec) -> the node
#       check passes, the verdict names find_spec as deferred, and no level is reached
# Everything lands under $OUT: log.txt, summary.json, evidence.tar.gz (every attempt), pub.pem.
# Needs python3 with torch (CUDA); imagegate runs from src/ with the wheels
# `scripts/gpu-wheels.py --download .whl` fetches, installed from .whl/ into $SITE when present.
#   COMMIT=$(git rev-parse HEAD) OUT=/tmp/gpu-levels bash scripts/gpu-levels.sh
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-levels-out}
SITE=${SITE:-/tmp/site}
STEP_TIMEOUT=${IMAGEGATE_STEP_TIMEOUT:-600}
GPUS=${GPUS-all}
WORK_PREFIX=gpu-levels
# shellcheck source=scripts/device-env.sh
source "$ROOT/scripts/device-env.sh"

ig keygen --out "$WORK/key" >>"$LOG" 2>&1 || { say "keygen failed"; exit 3; }
export IMAGEGATE_SIGNING_KEY=$WORK/key.key
cp "$WORK/key.pub" "$OUT/pub.pem"
UNISOLATED=()  # --here signs only where bubblewrap hides the key; a bare box signs anyway, saying so
command -v bwrap >/dev/null || { UNISOLATED=(--sign-unisolated); say "no bwrap: signing with --sign-unisolated"; }
latest() { ls -d "$RUNS"/ref-local/*/ 2>/dev/null | sort | tail -1; }
cat >"$WORK/levels.yaml" <<'YAML'
apiVersion: imagegate/v1
name: sglang-shaped
stages:
  - id: node_check
    probe: gpu_preflight
    requires: [gpu]
    timeout: 10m
  - id: find_spec
    probe: find_spec
    timeout: 5m
    with:
      modules: [torch, json]
YAML
verify() {  # $1: attempt folder, $2: name for the record; the rest: verify's options
    local a=$1 n=$2; shift 2
    ig verify "$a/attestation.dsse.json" --key "$WORK/key.pub" "$@" >"$OUT/verify-$n.txt" 2>&1
    echo "verify $n exit $?" | tee -a "$LOG"
}

say "(a) GPUs hidden"
ig run --here "${UNISOLATED[@]}" -p "$WORK/levels.yaml" -o "$RUNS" -q >>"$LOG" 2>&1; echo "exit $?" | tee -a "$LOG"
FIRST=$(latest)
cp "$FIRST/vsa.dsse.json" "$OUT/a-vsa.dsse.json" 2>/dev/null
verify "$FIRST" a
verify "$FIRST" a-require-complete --require-complete

say "(b) completed on the GPUs"
ig complete "$FIRST" --here "${UNISOLATED[@]}" --gpus "$GPUS" -q >>"$LOG" 2>&1; echo "exit $?" | tee -a "$LOG"
SECOND=$(latest)
cp "$SECOND/vsa.dsse.json" "$OUT/b-vsa.dsse.json" 2>/dev/null
verify "$SECOND" b

say "(c) on the GPUs, find_spec left out"
ig run --here "${UNISOLATED[@]}" -p "$WORK/levels.yaml" --gpus "$GPUS" --skip find_spec -o "$RUNS" -q >>"$LOG" 2>&1
echo "exit $?" | tee -a "$LOG"
THIRD=$(latest)
cp "$THIRD/vsa.dsse.json" "$OUT/c-vsa.dsse.json" 2>/dev/null
verify "$THIRD" c

say "summary"
python3 - "$OUT" "$FIRST" "$SECOND" "$THIRD" <<'PY' | tee -a "$LOG"
import base64, datetime, json, os, subprocess, sys
from pathlib import Path
out = Path(sys.argv[1])
def vsa(name):
    try:
        return json.loads(base64.b64decode(json.loads((out / name).read_text())["payload"]))["predicate"]
    except (OSError, ValueError, KeyError):
        return None
def attempt(folder):
    try:
        p = json.loads((Path(folder) / "statement.json").read_text())["predicate"]
    except (OSError, ValueError):
        return None
    return {"verdict": p["verdict"], "stages": {s["id"]: s["status"] for s in p["stages"]},
            "gpu": p["environment"].get("gpu"), "completes": (p.get("completes") or {}).get("attempt")}
def said(n):
    t = out / f"verify-{n}.txt"
    return t.read_text().strip().splitlines()[-1] if t.exists() else None
try:
    gpus = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
except (OSError, subprocess.SubprocessError):
    gpus = []
summary = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": os.environ.get("COMMIT"), "nvidia_smi": gpus}
for key, folder, name in (("hidden", sys.argv[2], "a"), ("completed", sys.argv[3], "b"), ("skipped", sys.argv[4], "c")):
    v = vsa(f"{name}-vsa.dsse.json") or {}
    summary[key] = {**(attempt(folder) or {}), "vsa": {"verificationResult": v.get("verificationResult"),
                    "verifiedLevels": v.get("verifiedLevels"), "stages": (v.get("https://imagegate.dev/attestations/vsa/run") or {}).get("stages")},
                    "verify": said(name)}
summary["hidden"]["verify_require_complete"] = said("a-require-complete")
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
PY
tar -czf "$OUT/evidence.tar.gz" -C "$WORK" runs 2>>"$LOG"
rm -rf "$WORK"
