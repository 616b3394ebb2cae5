#!/usr/bin/env bash
# A real acceptance on the embedded default: a vLLM-like image built from Debian packages and
# real wheels (its CLI fails without a GPU the way vLLM's does), checked with the vllm pipeline.
# Expect CPU_PASS_GPU_CLI_DEFERRED on a machine without a GPU, exit 0.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh vllm-like >/dev/null
exec .venv/bin/imagegate run imagegate-test/vllm-like:latest -p vllm "$@"
