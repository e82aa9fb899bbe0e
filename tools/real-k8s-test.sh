#!/usr/bin/env bash
# `make test-k8s`: build (cached outside the clone) kube-apiserver + kube-controller-manager 1.20.2 and
# install etcd, then run tests/k8s/ against a real control plane that the tests start on free ports.
# usage: tools/real-k8s-test.sh [extra pytest args]
# A machine that cannot build is one SKIPPED line and status 0, or a failure under
# LLM_VITALS_REQUIRE_REAL_K8S=1 (CI).
set -uo pipefail
cd "$(dirname "$0")/.."

source tools/real-tier-lib.sh
tier_setup k8s
export LLM_VITALS_K8S_BIN_DIR=$(tail -1 <<<"$SETUP_OUT" | sed -n 's/^BIN_DIR=\([^ ]*\) .*/\1/p')

# Two workers: each starts its own control plane (about 5 s and 300 MB), and the tests spend most
# of their time waiting on expiries and outages, not on the CPU. `timeout` bounds a wedged run (its
# SIGTERM still stops every server by PID).
LLM_VITALS_REAL_K8S=1 timeout -k 60 1200 "$PYTHON" -m pytest tests/k8s -p no:randomly -p no:cacheprovider \
  -n 2 --dist loadfile "$@"
rc=$?
[ $rc = 124 ] && echo "real-Kubernetes tier: pytest timed out after 1200 s" >&2
echo "real-Kubernetes tier: $(( $(date +%s) - TIER_STARTED )) s in all (setup ${SETUP_S} s; pytest status $rc)"
exit $rc
