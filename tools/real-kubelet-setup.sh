#!/usr/bin/env bash
# Gather, once, what the real-kubelet tier needs, each part cached OUTSIDE the clone by the setup
# that owns it (tools/cache-path.sh):
#  - Kubernetes 1.20.2: the k8s tier's build (tools/real-k8s-setup.sh), which builds kube-scheduler,
#    the kubelet, kubectl and `pause` beside kube-apiserver and kube-controller-manager, so that one
#    build serves both tiers;
#  - Debian's Docker Engine, Prometheus, Alertmanager and the small tools the kubelet looks for (apt,
#    the ordinary client);
#  - the Docker tier's Debian base rootfs (tools/real-docker-setup.sh, debootstrap) for the image;
#  - the llama.cpp tier's llama-server and tiny GGUF (tools/real-llamacpp-setup.sh), mounted into a pod.
#
# Exit status: 0 ready (the last line is KUBE_BIN=... BASE_TAR=... LLAMA_BIN=... LLAMA_MODEL=...);
# 77 skipped (one line says why); 1 failed, or skipped while LLM_VITALS_REQUIRE_REAL_KUBELET=1 (CI).
set -euo pipefail
cd "$(dirname "$0")/.."

TIER_NAME=kubelet TIER_VAR=KUBELET
source tools/real-tier-lib.sh   # tier_skip
[ "$(uname -s)" = Linux ] || tier_skip "needs Linux, this is $(uname -s)"
[ "$(id -u)" = 0 ] || tier_skip "needs root: network namespaces, dockerd, the kubelet's mounts and cgroups"

# Each part below takes its own setup's lock; a part another job is building now is waited for.
sub() {  # name script env... : run a sibling setup with our requirement, return its last line
  # (its output to a file, then onto our stderr: `tee /dev/stderr` reopens the path, which truncates
  # a log file that CI redirects the run into)
  local out rc
  out=$(mktemp)
  env "${@:3}" bash "$2" >"$out" && rc=0 || rc=$?
  cat "$out" >&2
  [ "$rc" = 0 ] || { [ "$rc" = 77 ] && tier_skip "$1: $(tail -1 "$out")"; rm -f "$out"; exit "$rc"; }
  tail -1 "$out"
  rm -f "$out"
}
k8s=$(sub "the k8s tier's build" tools/real-k8s-setup.sh LLM_VITALS_REQUIRE_REAL_K8S="${LLM_VITALS_REQUIRE_REAL_KUBELET:-}")
KUBE_BIN=$(sed -n 's/^BIN_DIR=\([^ ]*\) .*/\1/p' <<<"$k8s")
BASE_TAR=$(sub "the Docker tier's base" tools/real-docker-setup.sh LLM_VITALS_REQUIRE_REAL_DOCKER="${LLM_VITALS_REQUIRE_REAL_KUBELET:-}")
llama=$(sub "the llama.cpp tier's build" tools/real-llamacpp-setup.sh LLM_VITALS_REQUIRE_REAL_LLAMACPP="${LLM_VITALS_REQUIRE_REAL_KUBELET:-}")
LLAMA_BIN=$(sed -n 's/^BIN=\([^ ]*\) MODEL=.*/\1/p' <<<"$llama")
LLAMA_MODEL=$(sed -n 's/.* MODEL=\(.*\)$/\1/p' <<<"$llama")

# What the kubelet and dockerd look for on a node (iptables, conntrack, ethtool, ebtables), the
# namespace tools (ip netns, nsenter, unshare) and the two daemons' packages. Installing docker.io
# starts no daemon that matters here: the tier starts its own, one per node, and stops them by PID.
apt_install() {
  local need=() p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
  [ "${#need[@]}" = 0 ] && return 0
  command -v apt-get >/dev/null || tier_skip "needs ${need[*]} and there is no apt-get"
  echo "real-kubelet setup: installing ${need[*]} from Debian"
  env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 nice -n 10 apt-get -o DPkg::Lock::Timeout=600 install -y -q \
    --no-install-recommends "${need[@]}" >/dev/null ||
    { apt-get update -q >/dev/null && env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get -o DPkg::Lock::Timeout=600 \
        install -y -q --no-install-recommends "${need[@]}" >/dev/null; } ||
    tier_skip "could not apt-get install ${need[*]} (root and the Debian mirror are needed)"
}
apt_install docker.io iptables conntrack ethtool ebtables iproute2 util-linux prometheus prometheus-alertmanager

echo "KUBE_BIN=$KUBE_BIN BASE_TAR=$BASE_TAR LLAMA_BIN=$LLAMA_BIN LLAMA_MODEL=$LLAMA_MODEL"
