#!/usr/bin/env bash
# All set-up on a fresh Debian 12 machine (as root): Debian packages (bubblewrap for the rootfs
# driver among them), a Docker engine and Podman's Docker API (scripts/engines.sh), the Python
# environment (.venv), the test images.
# --minimal (scripts/demo.sh): only what one acceptance needs: the Docker engine, imagegate in
# .venv without the test toolchain, the images named after it.
set -euo pipefail
cd "$(dirname "$0")/.."
minimal= extras='[test]'
if [ "${1:-}" = "--minimal" ]; then minimal=1 extras=; shift; fi
# Where a set-up's minutes go (CI's record reads these lines): "setup: PART took Ns".
mark=$(date +%s)
took() { echo "setup: $1 took $(( $(date +%s) - mark ))s" >&2; mark=$(date +%s); }
bash scripts/engines.sh ${minimal:+--minimal}
took "packages and engines"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# (this machine's pip configuration may name index folders that are absent: drop that noise)
.venv/bin/python -m pip install -q -e ".$extras" 2> >(grep -v '^WARNING: Location' >&2)
took "python environment"
# (.ci/run builds the images itself, the real ones beside the rest)
[ "${1:-}" = "--no-images" ] && exit 0
.venv/bin/python tests/images/build.py "$@"
took "test images"
