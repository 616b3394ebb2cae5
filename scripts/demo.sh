#!/usr/bin/env bash
# A real acceptance on the embedded default: a vLLM-like image built from Debian packages and
# real wheels (its CLI fails without a GPU the way vLLM's does), checked with the vllm pipeline.
# Expect CPU_PASS_GPU_CLI_DEFERRED on a machine without a GPU, exit 0.
# It installs only what that needs (scripts/setup.sh --minimal: the Docker engine, imagegate in
# .venv, the image's build) and stops, at the end, the engine it started; one already running
# is left running.
set -euo pipefail
cd "$(dirname "$0")/.."
engine_was_up=
docker -H unix:///var/run/docker.sock version >/dev/null 2>&1 && engine_was_up=1
stop_started() { [ -n "$engine_was_up" ] || bash scripts/engines.sh stop dockerd; }
trap stop_started EXIT
bash scripts/setup.sh --minimal vllm-like >/dev/null
.venv/bin/imagegate run imagegate-test/vllm-like:latest -p vllm "$@"
