#!/usr/bin/env bash
# Build, once, what the real-kubelet tier needs, cached OUTSIDE the clone (tools/cache-path.sh):
#  - kube-apiserver and kube-controller-manager: the k8s tier's build, reused as it is
#    (tools/real-k8s-setup.sh: Kubernetes 1.20.2 from Debian's source package, Debian's Go 1.19);
#  - kube-scheduler, the kubelet (with its built-in dockershim) and kubectl, built here from the same
#    Debian source with the same Go and the same reflect2 fix, plus `pause` (the sandbox's one
#    process, a static C program in the same tree). Cached under `kubelet-1.20.2[-oomadj0]`.
#    The kubelet gets the fixture recipe's two-line patch only where the machine needs it: dockershim
#    gives every sandbox oom_score_adj -998 and a Guaranteed container -997, a negative value needs
#    CAP_SYS_RESOURCE, and where the bounding set lacks it runc fails every sandbox ("can't get final
#    child's PID from pipe: EOF"). No flag sets either value, so both become 0 (the `-oomadj0` cache).
#  - Debian's Docker Engine and the small tools the kubelet looks for (apt, the ordinary client);
#  - the Docker tier's Debian base rootfs (tools/real-docker-setup.sh, debootstrap) for the image;
#  - the llama.cpp tier's llama-server and tiny GGUF (tools/real-llamacpp-setup.sh), mounted into a pod.
#
# Exit status: 0 ready (the last line is KUBE_BIN=... NODE_BIN=... BASE_TAR=... LLAMA_BIN=... LLAMA_MODEL=...);
# 77 skipped (one line says why); 1 failed, or skipped while LLM_VITALS_REQUIRE_REAL_KUBELET=1 (CI).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/kubernetes-source.sh

VERSION=1.20.2
WHAT="cmd/kube-scheduler cmd/kubelet cmd/kubectl"
NAMES="kube-scheduler kubelet kubectl pause"

skip() {
  local msg="SKIPPED: real-kubelet tier: $1"
  if [ "${LLM_VITALS_REQUIRE_REAL_KUBELET:-}" = 1 ]; then
    echo "$msg [LLM_VITALS_REQUIRE_REAL_KUBELET=1 makes this a failure]" >&2
    exit 1
  fi
  echo "$msg"
  exit 77
}
[ "$(uname -s)" = Linux ] || skip "needs Linux, this is $(uname -s)"
[ "$(id -u)" = 0 ] || skip "needs root: network namespaces, dockerd, the kubelet's mounts and cgroups"

# The patch is needed where CAP_SYS_RESOURCE (bit 24) is missing from the bounding set.
capbnd=$(awk '/^CapBnd:/{print $2}' /proc/self/status)
if (( (16#$capbnd >> 24) & 1 )); then OOM_PATCH=0; SUFFIX=""; else OOM_PATCH=1; SUFFIX="-oomadj0"; fi
NODE_BIN=$(tools/cache-path.sh kubelet "$VERSION$SUFFIX")
want="debian-source kubernetes $VERSION reflect2=1.0.2 oom_adj_patch=$OOM_PATCH $WHAT pause"

# Each part below takes its own setup's lock; a part another job is building now is waited for.
sub() {  # name script env... : run a sibling setup with our requirement, return its last line
  # (its output to a file, then onto our stderr: `tee /dev/stderr` reopens the path, which truncates
  # a log file that CI redirects the run into)
  local out rc
  out=$(mktemp)
  env "${@:3}" bash "$2" >"$out" && rc=0 || rc=$?
  cat "$out" >&2
  [ "$rc" = 0 ] || { [ "$rc" = 77 ] && skip "$1: $(tail -1 "$out")"; rm -f "$out"; exit "$rc"; }
  tail -1 "$out"
  rm -f "$out"
}
k8s=$(sub "the k8s tier's build" tools/real-k8s-setup.sh LLM_VITALS_REQUIRE_REAL_K8S="${LLM_VITALS_REQUIRE_REAL_KUBELET:-}")
KUBE_BIN=$(sed -n 's/^BIN_DIR=\([^ ]*\) .*/\1/p' <<<"$k8s")
BASE_TAR=$(sub "the Docker tier's base" tools/real-docker-setup.sh LLM_VITALS_REQUIRE_REAL_DOCKER="${LLM_VITALS_REQUIRE_REAL_KUBELET:-}")
llama=$(sub "the llama.cpp tier's build" tools/real-llamacpp-setup.sh LLM_VITALS_REQUIRE_REAL_LLAMACPP="${LLM_VITALS_REQUIRE_REAL_KUBELET:-}")
LLAMA_BIN=$(sed -n 's/^BIN=\([^ ]*\) MODEL=.*/\1/p' <<<"$llama")
LLAMA_MODEL=$(sed -n 's/.* MODEL=\(.*\)$/\1/p' <<<"$llama")

ready() {
  echo "KUBE_BIN=$KUBE_BIN NODE_BIN=$NODE_BIN BASE_TAR=$BASE_TAR LLAMA_BIN=$LLAMA_BIN LLAMA_MODEL=$LLAMA_MODEL"
  exit 0
}
bin_ready() {
  local n
  for n in $NAMES; do [ -x "$NODE_BIN/$n" ] || return 1; done
  [ -f "$NODE_BIN/.llm-vitals-built" ] && [ "$(cat "$NODE_BIN/.llm-vitals-built")" = "$want" ]
}

# What the kubelet and dockerd look for on a node (iptables, conntrack, ethtool, ebtables), the
# namespace tools (ip netns, nsenter, unshare) and the two daemons' packages. Installing docker.io
# starts no daemon that matters here: the tier starts its own, one per node, and stops them by PID.
apt_install() {
  local need=() p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
  [ "${#need[@]}" = 0 ] && return 0
  command -v apt-get >/dev/null || skip "needs ${need[*]} and there is no apt-get"
  echo "real-kubelet setup: installing ${need[*]} from Debian"
  env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 nice -n 10 apt-get -o DPkg::Lock::Timeout=600 install -y -q \
    --no-install-recommends "${need[@]}" >/dev/null ||
    { apt-get update -q >/dev/null && env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get -o DPkg::Lock::Timeout=600 \
        install -y -q --no-install-recommends "${need[@]}" >/dev/null; } ||
    skip "could not apt-get install ${need[*]} (root and the Debian mirror are needed)"
}
apt_install docker.io iptables conntrack ethtool ebtables iproute2 util-linux prometheus prometheus-alertmanager

if bin_ready; then echo "real-kubelet setup: cached ($NODE_BIN)"; ready; fi

mkdir -p "$(dirname "$NODE_BIN")"
exec 9>"$NODE_BIN.lock"    # one builder at a time (two checkouts may run the tier at once)
flock 9
if bin_ready; then ready; fi

t0=$(date +%s)
# The k8s tier's setup added the deb-src entries and installed Go and the reflect2 source.
apt_install golang-go dpkg-dev golang-github-modern-go-reflect2-dev make gcc libc6-dev
work=$NODE_BIN.work
log=$NODE_BIN.build.log
rm -rf "$work"
mkdir -p "$work"
echo "real-kubelet setup: building kube-scheduler, kubelet, kubectl and pause $VERSION from Debian's source" \
     "(oom_score_adj patch: $OOM_PATCH; 6-12 min on a loaded 2-core box; log: $log)"
tb=$(date +%s)
{
  cd "$work"
  kubernetes_source "$VERSION"   # the k8s tier's source and reflect2 fix (tools/kubernetes-source.sh)
  if [ "$OOM_PATCH" = 1 ]; then
    sed -i 's/^\tdefaultSandboxOOMAdj int = -998$/\tdefaultSandboxOOMAdj int = 0 \/\/ was -998; negative needs CAP_SYS_RESOURCE/' \
      pkg/kubelet/dockershim/docker_sandbox.go
    sed -i 's/^\tguaranteedOOMScoreAdj int = -997$/\tguaranteedOOMScoreAdj int = 0 \/\/ was -997; negative needs CAP_SYS_RESOURCE/' \
      pkg/kubelet/qos/policy.go
    grep -q 'was -998' pkg/kubelet/dockershim/docker_sandbox.go && grep -q 'was -997' pkg/kubelet/qos/policy.go ||
      { echo "the oom_score_adj patch did not apply (has the source changed?)"; exit 1; }
  fi
  go version
  # make, not `go build` (generated openapi, GOPATH mode against vendor/). The scheduler and kubectl
  # build static (the tree's own list); the kubelet with cgo, as upstream's, against this glibc.
  env HOME="$work" GOCACHE="$work/gocache" GOPROXY=off GOFLAGS= GOAMD64=v1 nice -n 10 make WHAT="$WHAT"
  # pause: the sandbox's only process, static, from the tree's own C source.
  nice -n 10 gcc -Os -Wall -Werror -static -DVERSION="v$VERSION-llm-vitals" -o _output/bin/pause build/pause/linux/pause.c
  strip _output/bin/pause
} >"$log" 2>&1 || {
  echo "real-kubelet setup: the build failed; last lines of $log:" >&2
  tail -20 "$log" >&2
  exit 1
}
mkdir -p "$NODE_BIN"
for n in $NAMES; do
  cp "$work/kubernetes/_output/bin/$n" "$NODE_BIN/$n.tmp" && mv "$NODE_BIN/$n.tmp" "$NODE_BIN/$n"
done
rm -rf "$work"   # 2-3.5 GB of source, generated code and Go cache; the binaries are all we need
"$NODE_BIN/kubelet" --version >>"$log" 2>&1 || { echo "real-kubelet setup: the built kubelet does not run; see $log" >&2; exit 1; }
echo "$want" >"$NODE_BIN/.llm-vitals-built"
echo "real-kubelet setup: built in $(( $(date +%s) - tb )) s ($(( $(date +%s) - t0 )) s with apt) -> $NODE_BIN"
ready
