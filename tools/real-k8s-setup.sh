#!/usr/bin/env bash
# Build, once, what the real-Kubernetes tier needs, cached OUTSIDE the clone (tools/cache-path.sh):
#  - kube-apiserver and kube-controller-manager v1.20.2, built from Debian bookworm's *source*
#    package `kubernetes` (the whole tree with vendor/) with Debian's Go 1.19, offline
#    (GOPROXY=off): no kube-apiserver binary package exists in Debian, and the Go module proxy is
#    not reachable from here. Go builds with CGO_ENABLED=0 for the baseline amd64 (GOAMD64=v1, the
#    default) are portable across x86-64 CPUs, so the cache is not keyed on CPU flags.
#  - etcd-server / etcd-client 3.4.23, openssl, from Debian through apt (the ordinary client).
# Recipe: the kubernetes fixture recipe (build-kube-apiserver.sh) it came from.
#
# Exit status: 0 ready (the last line is BIN_DIR=... ETCD=...); 77 skipped (one line says why);
# 1 failed, or skipped while LLM_VITALS_REQUIRE_REAL_K8S=1 (CI), where a skip is a failure.
# Re-runs are fast: a stamp records what was built.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/kubernetes-source.sh

VERSION=1.20.2
WHAT="cmd/kube-apiserver cmd/kube-controller-manager"
BIN_DIR=$(tools/cache-path.sh kubernetes "$VERSION")
want="debian-source kubernetes $VERSION reflect2=1.0.2 CGO_ENABLED=0 $WHAT"

skip() {
  local msg="SKIPPED: real-Kubernetes tier: $1"
  if [ "${LLM_VITALS_REQUIRE_REAL_K8S:-}" = 1 ]; then
    echo "$msg [LLM_VITALS_REQUIRE_REAL_K8S=1 makes this a failure]" >&2
    exit 1
  fi
  echo "$msg"
  exit 77
}
bin_ready() {
  [ -x "$BIN_DIR/kube-apiserver" ] && [ -x "$BIN_DIR/kube-controller-manager" ] &&
    [ -f "$BIN_DIR/.llm-vitals-built" ] && [ "$(cat "$BIN_DIR/.llm-vitals-built")" = "$want" ]
}
etcd_path() { command -v etcd || { [ -x /usr/bin/etcd ] && echo /usr/bin/etcd; } || true; }
ready() { echo "BIN_DIR=$BIN_DIR ETCD=$(etcd_path)"; exit 0; }

if bin_ready && [ -n "$(etcd_path)" ] && command -v openssl >/dev/null; then
  echo "real-Kubernetes setup: cached ($BIN_DIR)"
  ready
fi

# apt needs root; without it a machine that lacks the packages cannot run the tier.
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo "$@"; else return 1; fi; }
apt_install() {
  local need=() p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
  [ "${#need[@]}" = 0 ] && return 0
  command -v apt-get >/dev/null || skip "needs ${need[*]} and there is no apt-get"
  # policy-rc.d-less images may try to start Debian's own etcd service on :2379: refuse it, the
  # tier starts its own etcd on free ports.
  as_root env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 nice -n 10 apt-get install -y -q --no-install-recommends "${need[@]}" ||
    skip "could not apt-get install ${need[*]} (root and the Debian mirror are needed)"
}

mkdir -p "$(dirname "$BIN_DIR")"
exec 9>"$BIN_DIR.lock"    # one builder at a time (two checkouts may run the tier at once)
flock 9
if bin_ready; then apt_install etcd-server etcd-client openssl; ready; fi

t0=$(date +%s)
# deb-src entries mirroring the deb ones, once, for `apt-get source`.
if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list 2>/dev/null; then
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources |
      as_root tee /etc/apt/sources.list.d/llm-vitals-debian-src.sources >/dev/null || skip "cannot add deb-src entries (root needed)"
  else
    grep '^deb ' /etc/apt/sources.list | sed 's/^deb /deb-src /' |
      as_root tee /etc/apt/sources.list.d/llm-vitals-debian-src.list >/dev/null || skip "cannot add deb-src entries (root needed)"
  fi
  as_root nice -n 10 apt-get update -q || skip "apt-get update failed"
fi
apt_install golang-go etcd-server etcd-client dpkg-dev rsync openssl golang-github-modern-go-reflect2-dev make
echo "real-Kubernetes setup: apt done in $(( $(date +%s) - t0 )) s"

work=$BIN_DIR.work
log=$BIN_DIR.build.log
rm -rf "$work"
mkdir -p "$work"
echo "real-Kubernetes setup: building kube-apiserver + kube-controller-manager $VERSION from Debian's source (about 5 min on a quiet 2-core box, far longer on a loaded one; log: $log)"
tb=$(date +%s)
{
  cd "$work"
  kubernetes_source "$VERSION"   # into ./kubernetes, entered, with Debian's reflect2 (tools/kubernetes-source.sh)
  go version
  # make, not a plain `go build`: it generates pkg/generated/openapi first and builds in GOPATH
  # mode against vendor/, as the Debian package does.
  env HOME="$work" GOCACHE="$work/gocache" CGO_ENABLED=0 GOPROXY=off GOFLAGS= GOAMD64=v1 \
    nice -n 10 make WHAT="$WHAT"
} >"$log" 2>&1 || {
  echo "real-Kubernetes setup: the build failed; last lines of $log:" >&2
  tail -20 "$log" >&2
  exit 1
}
for w in $WHAT; do
  cp "$work/kubernetes/_output/bin/$(basename "$w")" "$BIN_DIR.tmp-$(basename "$w")"
done
mkdir -p "$BIN_DIR"
for w in $WHAT; do mv "$BIN_DIR.tmp-$(basename "$w")" "$BIN_DIR/$(basename "$w")"; done
rm -rf "$work"   # about 2-3.5 GB of source, generated code and Go cache; the binaries are all we need
"$BIN_DIR/kube-apiserver" --version >>"$log" 2>&1 || { echo "real-Kubernetes setup: the built kube-apiserver does not run; see $log" >&2; exit 1; }
echo "$want" >"$BIN_DIR/.llm-vitals-built"
echo "real-Kubernetes setup: built in $(( $(date +%s) - tb )) s ($(( $(date +%s) - t0 )) s with apt) -> $BIN_DIR"
ready
