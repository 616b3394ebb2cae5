#!/usr/bin/env bash
# The conformance tests: the built-in pipelines on the real SGLang images (11 GB more set-up than
# the blocking CI, which runs the vLLM ones), then, with --records, the dated records of every
# real release the pipelines name (scripts/real-frameworks.py: vLLM and SGLang, older ones too).
#   bash scripts/conformance.sh [--records] [PYTEST ARG ...]
set -euo pipefail
cd "$(dirname "$0")/.."
records=0
if [ "${1:-}" = "--records" ]; then records=1; shift; fi
bash scripts/setup.sh --all
.venv/bin/pytest -ra -m conformance -n 2 --dist loadfile "$@"
if [ "$records" = 1 ]; then
  .venv/bin/python scripts/real-frameworks.py
fi
