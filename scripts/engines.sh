#!/usr/bin/env bash
# Installs (if missing) and starts a Docker engine, Podman's Docker-compatible API service.
# Idempotent: an engine that already answers is left alone. PIDs go to $IMAGEGATE_STATE (default
# /run/imagegate-ci) so they can be stopped by PID, never by name: `bash scripts/engines.sh stop`
# (or `stop dockerd`: that one alone).
# --minimal: what one acceptance on the embedded default needs (scripts/demo.sh), no more: the
# Docker engine, mmdebstrap for the image's Debian root, python3-venv; no Podman, no test tools.
set -euo pipefail
state=${IMAGEGATE_STATE:-/run/imagegate-ci}
mkdir -p "$state"

if [ "${1:-}" = "stop" ]; then  # stop what this script started (by the PIDs it recorded), nothing else
  shift
  names=("$@")
  [ ${#names[@]} -gt 0 ] || names=(podman dockerd)
  for name in "${names[@]}"; do
    if [ -f "$state/$name.pid" ] && kill "$(cat "$state/$name.pid")" 2>/dev/null; then
      echo "engines: stopped $name (pid $(cat "$state/$name.pid"))" >&2
    fi
    rm -f "$state/$name.pid"
  done
  exit 0
fi

minimal=
[ "${1:-}" = "--minimal" ] && minimal=1
need_pkgs=()
command -v dockerd >/dev/null || need_pkgs+=(docker.io)
command -v mmdebstrap >/dev/null || need_pkgs+=(mmdebstrap)
# `python3 -m venv` on Debian's Python (scripts/setup.sh's .venv)
dpkg -s python3-venv >/dev/null 2>&1 || need_pkgs+=(python3-venv)
if [ -z "$minimal" ]; then
  command -v podman >/dev/null || need_pkgs+=(podman)
  command -v docker-registry >/dev/null || need_pkgs+=(docker-registry)
  command -v skopeo >/dev/null || need_pkgs+=(skopeo)
  command -v htpasswd >/dev/null || need_pkgs+=(apache2-utils)
  command -v pigz >/dev/null || need_pkgs+=(pigz)
  # igzip (ISA-L's own gunzip): the layer benchmarks' second baseline, the inflater imagegate uses
  command -v igzip >/dev/null || need_pkgs+=(isal)
  command -v curl >/dev/null || need_pkgs+=(curl)
  command -v unshare >/dev/null || need_pkgs+=(util-linux)
  # the rootfs driver's sandbox (run --driver rootfs)
  command -v bwrap >/dev/null || need_pkgs+=(bubblewrap)
  # its seccomp filter, compiled by the system's libseccomp (drivers/seccomp.py loads it with ctypes)
  dpkg -s libseccomp2 >/dev/null 2>&1 || need_pkgs+=(libseccomp2)
  # node and npm for the independent Sigstore bundle check (sigstore-js, from the npm registry)
  command -v node >/dev/null || need_pkgs+=(nodejs)
  command -v npm >/dev/null || need_pkgs+=(npm)
  if [ -f "$(dirname "$0")/../.ci/apt-packages.txt" ]; then
    while read -r pkg; do
      case "$pkg" in ''|'#'*) continue;; esac
      dpkg -s "$pkg" >/dev/null 2>&1 || need_pkgs+=("$pkg")
    done < "$(dirname "$0")/../.ci/apt-packages.txt"
  fi
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "engines: installing ${need_pkgs[*]}" >&2
  apt-get update -qq
  # (no fsync per unpacked file: a set-up interrupted by a crash is simply run again)
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o Dpkg::Options::=--force-unsafe-io \
    "${need_pkgs[@]}" >/dev/null
fi

wait_for() {  # wait_for SECONDS CMD...
  local n=$1; shift
  for _ in $(seq 1 "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  return 1
}

# An engine this script started from a checkout since removed (a CI clone, a benchmark's) runs in
# a deleted folder, and Podman's conmon fails there ("Failed to get working directory"): it is
# stopped and started again. The engines start from / so that they outlive any checkout.
orphaned() {  # orphaned NAME: the engine recorded under NAME runs in a folder that is gone
  local pid
  pid=$(cat "$state/$1.pid" 2>/dev/null) || return 1
  [[ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" == *" (deleted)" ]] || return 1
  echo "engines: $1 (pid $pid) runs in a removed folder: starting it again" >&2
  kill "$pid" 2>/dev/null
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
}
orphaned dockerd || true
orphaned podman || true
cd /

if ! docker -H unix:///var/run/docker.sock version >/dev/null 2>&1; then
  # No CAP_SYS_RESOURCE here (lowered ulimits), cgroup v1/hybrid (cgroupfs), no bridge/iptables.
  nohup dockerd --host unix:///var/run/docker.sock \
    --iptables=false --ip6tables=false --bridge=none \
    --exec-opt native.cgroupdriver=cgroupfs \
    --default-ulimit nofile=4096:4096 --default-ulimit nproc=4096:4096 \
    --data-root /var/lib/docker --pidfile /var/run/docker.pid \
    >"$state/dockerd.log" 2>&1 &
  echo $! >"$state/dockerd.pid"
  wait_for 60 docker -H unix:///var/run/docker.sock version || { tail -20 "$state/dockerd.log" >&2; exit 1; }
fi

if [ -n "$minimal" ]; then
  echo "engines: docker $(docker -H unix:///var/run/docker.sock version -f '{{.Server.Version}}')" >&2
  exit 0
fi

# The test engine's own config (CONTAINERS_CONF, read by the service alone): crun fails on this
# host's hybrid cgroups, runc works. No file of the host's is changed.
cat >"$state/containers.conf" <<'CONF'
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
if ! curl -sf --unix-socket /run/podman.sock http://d/_ping >/dev/null 2>&1; then
  rm -f /run/podman.sock
  CONTAINERS_CONF="$state/containers.conf" nohup podman system service --time=0 unix:///run/podman.sock \
    >"$state/podman.log" 2>&1 &
  echo $! >"$state/podman.pid"
  wait_for 30 curl -sf --unix-socket /run/podman.sock http://d/_ping || { tail -20 "$state/podman.log" >&2; exit 1; }
fi
echo "engines: docker $(docker -H unix:///var/run/docker.sock version -f '{{.Server.Version}}'), podman API on /run/podman.sock" >&2
