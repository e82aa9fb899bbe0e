#!/usr/bin/env bash
# Build, once, the Kubernetes that the real-Kubernetes and real-kubelet tiers need, cached OUTSIDE the
# clone (tools/cache-path.sh), in one build that both tiers share:
#  - kube-apiserver, kube-controller-manager, kube-scheduler, the kubelet (with its built-in
#    dockershim) and kubectl v1.20.2, built from Debian bookworm's *source* package `kubernetes` (the
#    whole tree with vendor/) with Debian's Go 1.19, offline (GOPROXY=off): no kube-apiserver binary
#    package exists in Debian, and the Go module proxy is not reachable from here. One `make` for all
#    five generates the code once and compiles the packages they share once (two builds took about
#    5 and 9 minutes). The tree's static list builds all but the kubelet with CGO_ENABLED=0; the
#    kubelet links glibc, as upstream's. Built for the baseline amd64 (GOAMD64=v1), they are portable
#    across x86-64 CPUs, so the cache is not keyed on CPU flags.
#  - `pause`, the sandbox's one process, a static C program from the same tree.
#  - The kubelet gets the kubelet fixture recipe's two-line patch only where the machine needs it:
#    dockershim gives every sandbox oom_score_adj -998 and a Guaranteed container -997, a negative
#    value needs CAP_SYS_RESOURCE, and where the bounding set lacks it runc fails every sandbox
#    ("can't get final child's PID from pipe: EOF"). No flag sets either value, so both become 0
#    (the cache `kubernetes-1.20.2-oomadj0`).
#  - etcd-server / etcd-client 3.4.23, openssl, from Debian through apt (the ordinary client).
# Recipes: the kubernetes fixture recipe (build-kube-apiserver.sh) and the kubelet's.
#
# Exit status: 0 ready (the last line is BIN_DIR=... ETCD=...); 77 skipped (one line says why);
# 1 failed, or skipped while LLM_VITALS_REQUIRE_REAL_K8S=1 (CI), where a skip is a failure.
# Re-runs are fast: a stamp records what was built. usage: tools/real-k8s-setup.sh [--where]
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=1.20.2
WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubelet cmd/kubectl"
NAMES="kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl pause"
# The patch is needed where CAP_SYS_RESOURCE (bit 24) is missing from the bounding set.
capbnd=$(awk '/^CapBnd:/{print $2}' /proc/self/status)
if (( (16#$capbnd >> 24) & 1 )); then OOM_PATCH=0; SUFFIX=""; else OOM_PATCH=1; SUFFIX="-oomadj0"; fi
BIN_DIR=$(tools/cache-path.sh kubernetes "$VERSION$SUFFIX")
want="debian-source kubernetes $VERSION reflect2=1.0.2 oom_adj_patch=$OOM_PATCH $WHAT pause"
# --where: only say where the build lives on this machine (tests/k8s/control_plane.py asks).
[ "${1:-}" = --where ] && { echo "$BIN_DIR"; exit 0; }

TIER_NAME=Kubernetes TIER_VAR=K8S
source tools/real-tier-lib.sh   # tier_skip, build_lock
bin_ready() {
  local n
  for n in $NAMES; do [ -x "$BIN_DIR/$n" ] || return 1; done
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
  command -v apt-get >/dev/null || tier_skip "needs ${need[*]} and there is no apt-get"
  # policy-rc.d-less images may try to start Debian's own etcd service on :2379: refuse it, the
  # tier starts its own etcd on free ports.
  as_root env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 nice -n 10 apt-get -o DPkg::Lock::Timeout=600 install -y -q \
    --no-install-recommends "${need[@]}" ||
    tier_skip "could not apt-get install ${need[*]} (root and the Debian mirror are needed)"
}

build_lock "$BIN_DIR"
if bin_ready; then apt_install etcd-server etcd-client openssl; ready; fi

t0=$(date +%s)
# deb-src entries mirroring the deb ones, once, for `apt-get source`.
if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list 2>/dev/null; then
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources |
      as_root tee /etc/apt/sources.list.d/llm-vitals-debian-src.sources >/dev/null || tier_skip "cannot add deb-src entries (root needed)"
  else
    grep '^deb ' /etc/apt/sources.list | sed 's/^deb /deb-src /' |
      as_root tee /etc/apt/sources.list.d/llm-vitals-debian-src.list >/dev/null || tier_skip "cannot add deb-src entries (root needed)"
  fi
  as_root nice -n 10 apt-get update -q || tier_skip "apt-get update failed"
fi
apt_install golang-go etcd-server etcd-client dpkg-dev rsync openssl golang-github-modern-go-reflect2-dev make gcc libc6-dev
echo "real-Kubernetes setup: apt done in $(( $(date +%s) - t0 )) s"

work=$BIN_DIR.work
log=$BIN_DIR.build.log
rm -rf "$work"
mkdir -p "$work"
echo "real-Kubernetes setup: building $NAMES $VERSION from Debian's source (oom_score_adj patch: $OOM_PATCH;" \
     "about 10 min on a quiet 2-core box, far longer on a loaded one; log: $log)"
tb=$(date +%s)
{
  cd "$work"
  R=vendor/github.com/modern-go/reflect2
  nice -n 10 apt-get source --download-only "kubernetes=$VERSION*" || nice -n 10 apt-get source --download-only kubernetes
  nice -n 10 dpkg-source -x kubernetes_*.dsc kubernetes
  cd kubernetes
  head -1 debian/changelog | grep -q "$VERSION" || { echo "expected kubernetes $VERSION, got: $(head -1 debian/changelog)"; exit 1; }
  # Kubernetes 1.20 vendors github.com/modern-go/reflect2 v1.0.1, which breaks under Go >= 1.18:
  # the apiserver panics (nil pointer in reflect2.Type2) on some requests, e.g. POST
  # /api/v1/namespaces, intermittently. Debian's 1.0.2 is the API-compatible Go 1.18 fix
  # (golang-github-modern-go-reflect2-dev).
  rm -rf "$R" && mkdir -p "$R"
  cp -a /usr/share/gocode/src/github.com/modern-go/reflect2/. "$R/"
  if [ "$OOM_PATCH" = 1 ]; then
    sed -i 's/^\tdefaultSandboxOOMAdj int = -998$/\tdefaultSandboxOOMAdj int = 0 \/\/ was -998; negative needs CAP_SYS_RESOURCE/' \
      pkg/kubelet/dockershim/docker_sandbox.go
    sed -i 's/^\tguaranteedOOMScoreAdj int = -997$/\tguaranteedOOMScoreAdj int = 0 \/\/ was -997; negative needs CAP_SYS_RESOURCE/' \
      pkg/kubelet/qos/policy.go
    grep -q 'was -998' pkg/kubelet/dockershim/docker_sandbox.go && grep -q 'was -997' pkg/kubelet/qos/policy.go ||
      { echo "the oom_score_adj patch did not apply (has the source changed?)"; exit 1; }
  fi
  go version
  # make, not a plain `go build`: it generates pkg/generated/openapi first and builds in GOPATH
  # mode against vendor/, as the Debian package does.
  env HOME="$work" GOCACHE="$work/gocache" GOPROXY=off GOFLAGS= GOAMD64=v1 nice -n 10 make WHAT="$WHAT"
  nice -n 10 gcc -Os -Wall -Werror -static -DVERSION="v$VERSION-llm-vitals" -o _output/bin/pause build/pause/linux/pause.c
  strip _output/bin/pause
} >"$log" 2>&1 || {
  echo "real-Kubernetes setup: the build failed; last lines of $log:" >&2
  tail -20 "$log" >&2
  exit 1
}
mkdir -p "$BIN_DIR"
for n in $NAMES; do
  cp "$work/kubernetes/_output/bin/$n" "$BIN_DIR/$n.tmp" && mv "$BIN_DIR/$n.tmp" "$BIN_DIR/$n"
done
rm -rf "$work"   # about 3-4 GB of source, generated code and Go cache; the binaries are all we need
for n in kube-apiserver kubelet; do
  "$BIN_DIR/$n" --version >>"$log" 2>&1 || { echo "real-Kubernetes setup: the built $n does not run; see $log" >&2; exit 1; }
done
echo "$want" >"$BIN_DIR/.llm-vitals-built"
echo "real-Kubernetes setup: built in $(( $(date +%s) - tb )) s ($(( $(date +%s) - t0 )) s with apt) -> $BIN_DIR"
ready
