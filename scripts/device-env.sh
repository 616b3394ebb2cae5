# Sourced by the GPU-host scripts (gpu-acceptance.sh, gpu-serve.sh): the log, the environment
# every GPU program gets, imagegate from src/ with the wheels carried in .whl/ (installed into
# $SITE), a work folder and `ig`, imagegate bounded by $STEP_TIMEOUT. Needs ROOT, OUT, SITE,
# STEP_TIMEOUT and WORK_PREFIX set.
mkdir -p "$OUT"
LOG=$OUT/log.txt
: >"$LOG"
say() { echo "== $*" | tee -a "$LOG"; }

# Never NVLink multicast: a program that uses it can take a shared host's GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1

if compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
    say "installing $(ls "$ROOT"/.whl/*.whl | wc -l) wheels into $SITE"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$ROOT"/.whl/*.whl >>"$LOG" 2>&1 || { say "wheel install failed"; exit 3; }
fi
export PYTHONPATH=$ROOT/src:$SITE${PYTHONPATH:+:$PYTHONPATH}
export PATH=$SITE/bin:$PATH  # the carried wheels' programs (e.g. `transformers`) before the machine's own

WORK=$(mktemp -d "/tmp/$WORK_PREFIX.XXXXXX")
RUNS=$WORK/runs
ig() { timeout --kill-after=10 "$STEP_TIMEOUT" python3 -m imagegate "$@"; }
