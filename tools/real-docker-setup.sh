#!/usr/bin/env bash
# Install, once, what the real-Docker tier needs (fixtures/docker RECIPE):
#   - Debian's docker.io (Engine 20.10), docker-compose 1.29 and debootstrap, with apt (a fresh
#     machine has none of them; installing does not start a daemon: the tier starts its own);
#   - the base image's root filesystem, made locally (nothing can be pulled here): debootstrap
#     bookworm minbase + python3, tarred and cached outside the clone (tools/cache-path.sh
#     docker-base bookworm-py3); the tier `docker import`s it into its own daemon on every run.
#
# Exit status: 0 ready (the rootfs tar's path is on the last line); 77 skipped (one line says why);
# 1 failed, or skipped while LLM_VITALS_REQUIRE_REAL_DOCKER=1 (CI), where a skip is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${LLM_VITALS_DOCKER_BASE_CACHE:-$(bash tools/cache-path.sh docker-base bookworm-py3)}
ROOTFS_TAR=$CACHE/rootfs.tar
STAMP=$CACHE/.llm-vitals-built
INCLUDE=python3,python3-venv,ca-certificates
want="debootstrap --variant=minbase --include=$INCLUDE bookworm"

TIER_NAME=Docker TIER_VAR=DOCKER
source tools/real-tier-lib.sh   # tier_skip

[ "$(uname -s)" = Linux ] || tier_skip "needs Linux, this is $(uname -s)"
need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
[ -f "$STAMP" ] || command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "real-Docker setup: installing ${need[*]} from Debian"
    export DEBIAN_FRONTEND=noninteractive
    # --no-install-recommends: no cgroupfs-mount/needrestart side effects; the daemon is ours to start.
    apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${need[@]}" >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 &&
        apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${need[@]}" >/dev/null 2>&1; } ||
      tier_skip "apt-get install ${need[*]} failed"
  else
    tier_skip "missing ${need[*]}; as root: apt-get install --no-install-recommends ${need[*]}"
  fi
fi
[ "$(id -u)" = 0 ] || tier_skip "dockerd needs root (this tier starts a daemon of its own)"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -s "$ROOTFS_TAR" ]; then
  echo "real-Docker setup: base rootfs cached ($ROOTFS_TAR)"
  echo "$ROOTFS_TAR"
  exit 0
fi

mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$mirror" ] || tier_skip "no Debian mirror found in apt's sources for debootstrap"

mkdir -p "$CACHE"
work=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
LOG=$CACHE/debootstrap.log
t0=$(date +%s)
echo "real-Docker setup: debootstrap bookworm from $mirror (95-590 s on a loaded 2-core box, 170 MB; log: $LOG)"
if ! nice -n 10 debootstrap --variant=minbase --include="$INCLUDE" bookworm "$work/rootfs" "$mirror" >"$LOG" 2>&1; then
  echo "real-Docker setup: debootstrap failed; last lines of $LOG:" >&2
  tail -15 "$LOG" >&2
  exit 1
fi
# Nothing of this machine's apt state beyond what debootstrap wrote; a smaller image.
rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
tar -C "$work/rootfs" -cf "$work/rootfs.tar" .
mv "$work/rootfs.tar" "$ROOTFS_TAR"
echo "$want" >"$STAMP"
echo "real-Docker setup: base rootfs ready in $(( $(date +%s) - t0 )) s ($(du -sm "$ROOTFS_TAR" | cut -f1) MB)"
echo "$ROOTFS_TAR"
