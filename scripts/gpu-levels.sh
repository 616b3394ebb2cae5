#!/usr/bin/env bash
# The levels a signed verdict reaches, on a real GPU, through the same commands a GPU node runs
# (no container engine, no network there: `run --here` on the machine's own Python and torch):
#   (a) a pipeline shaped as the built-in sglang one (a CPU stage; the node check, gpu_preflight,
#       as its GPU stage), run with the GPUs hidden -> CPU_PASS_NODE_CHECK_DEFERRED, exit 0, the
#       VSA's levels IMAGEGATE_CPU alone, the runner's fact: no GPU granted; verify exits 0;
#       verify --require-complete exits 1
#   (b) imagegate complete <that attempt> --here --gpus all -> PASS, linked, exit 0; the VSA's
#       levels IMAGEGATE_CPU and IMAGEGATE_GPU; the runner's fact recorded: the node check stage
#       `gpuGranted`, `environment.gpus_granted` naming the /dev/nvidiaN nodes it saw (run.json
#       too); verify exits 0
#   (c) the same pipeline on the GPUs with its CPU stage left out (--skip find_spec) -> the node
#       check passes, the verdict names find_spec as deferred, no level is reached: run exits 1,
#       verify exits 1 saying so
#   (d) GPUs not asked for, an interpreter that claims them (a wrapper setting the visibility
#       variables; where bubblewrap is missing the host's nodes are in sight, and the node check
#       really runs on them): never IMAGEGATE_GPU, the node check DEFERRED whatever it said
# Prints one PASS/FAIL line per check and `gpu-levels: PASS` or `gpu-levels: FAIL` last; exits 0
# when every check passed, 1 otherwise. Everything lands under $OUT: log.txt, summary.json,
# evidence.tar.gz (every attempt), pub.pem.
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
# (d)'s interpreter: says a GPU is there whatever the runner gave (a node of its own where it can
# make one, never over a real one).
cat >"$WORK/claims-gpu" <<'WRAP'
#!/bin/sh
[ -e /dev/nvidia0 ] || : >/dev/nvidia0 2>/dev/null
export CUDA_VISIBLE_DEVICES=0 NVIDIA_VISIBLE_DEVICES=all
exec python3 "$@"
WRAP
chmod +x "$WORK/claims-gpu"
step() {  # $1: name for the record; the rest: imagegate's arguments. Its exit code goes to rc-NAME.
    local n=$1; shift
    ig "$@" -q >>"$LOG" 2>&1; local rc=$?
    echo "$rc" >"$OUT/rc-$n"; echo "$n exit $rc" | tee -a "$LOG"
}
verify() {  # $1: attempt folder, $2: name for the record; the rest: verify's options
    local a=$1 n=$2; shift 2
    ig verify "$a/attestation.dsse.json" --key "$WORK/key.pub" "$@" >"$OUT/verify-$n.txt" 2>&1
    echo "$?" >"$OUT/rc-verify-$n"; echo "verify $n exit $(cat "$OUT/rc-verify-$n")" | tee -a "$LOG"
}

say "(a) GPUs hidden"
step a run --here "${UNISOLATED[@]}" -p "$WORK/levels.yaml" -o "$RUNS"
FIRST=$(latest)
cp "$FIRST/vsa.dsse.json" "$OUT/a-vsa.dsse.json" 2>/dev/null
verify "$FIRST" a
verify "$FIRST" a-require-complete --require-complete

say "(b) completed on the GPUs"
step b complete "$FIRST" --here "${UNISOLATED[@]}" --gpus "$GPUS"
SECOND=$(latest)
cp "$SECOND/vsa.dsse.json" "$OUT/b-vsa.dsse.json" 2>/dev/null
verify "$SECOND" b

say "(c) on the GPUs, find_spec left out"
step c run --here "${UNISOLATED[@]}" -p "$WORK/levels.yaml" --gpus "$GPUS" --skip find_spec -o "$RUNS"
THIRD=$(latest)
cp "$THIRD/vsa.dsse.json" "$OUT/c-vsa.dsse.json" 2>/dev/null
verify "$THIRD" c

say "(d) no GPUs asked for, an interpreter that claims them"
step d run --here "${UNISOLATED[@]}" --python "$WORK/claims-gpu" -p "$WORK/levels.yaml" -o "$RUNS"
FOURTH=$(latest)
cp "$FOURTH/vsa.dsse.json" "$OUT/d-vsa.dsse.json" 2>/dev/null
verify "$FOURTH" d

say "summary"
python3 "$ROOT/scripts/gpu-levels-check.py" "$OUT" "$FIRST" "$SECOND" "$THIRD" "$FOURTH" | tee -a "$LOG"
RESULT=${PIPESTATUS[0]}
tar -czf "$OUT/evidence.tar.gz" -C "$WORK" runs 2>>"$LOG"
rm -rf "$WORK"
exit "$RESULT"
