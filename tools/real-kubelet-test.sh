#!/usr/bin/env bash
# `make test-kubelet`: build what the tier needs (cached outside the clone; tools/real-kubelet-setup.sh),
# then run tests/kubelet/ against a real two-node Kubernetes 1.20.2 cluster that the tests start and
# stop by PID (tests/kubelet/cluster.py), and check that nothing of it is left on the machine.
# usage: tools/real-kubelet-test.sh [extra pytest args]
# A machine that cannot run it is one SKIPPED line and status 0, or a failure under
# LLM_VITALS_REQUIRE_REAL_KUBELET=1 (CI).
set -uo pipefail
cd "$(dirname "$0")/.."

source tools/real-tier-lib.sh
tier_setup kubelet
paths=$(tail -1 <<<"$SETUP_OUT")
field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$paths"; }
export LLM_VITALS_KUBE_BIN=$(field KUBE_BIN)
export LLM_VITALS_KUBELET_BASE_TAR=$(field BASE_TAR)
export LLM_VITALS_LLAMACPP_BIN=$(field LLAMA_BIN) LLM_VITALS_LLAMACPP_MODEL=$(field LLAMA_MODEL)

# One tier run at a time on a machine: the cluster's namespaces, addresses and guard route are fixed.
# (The lock file lives beside the cache, which outlives runs anyway.)
exec 8>"$(dirname "$LLM_VITALS_KUBE_BIN")/kubelet-tier.lock"
flock 8
OUT=.cache/real-kubelet
rm -rf "$OUT" && mkdir -p "$OUT"
# The cluster's run dir lives under this one; whatever pytest could not stop (it was killed), the
# backstop below stops by the PIDs and host changes recorded there.
export LLM_VITALS_KUBELET_RUN=$(mktemp -d /tmp/lvk.XXXXXX)
backstop() {
  local dir
  for dir in "$LLM_VITALS_KUBELET_RUN"/c.*; do
    [ -d "$dir" ] || continue
    echo "real-kubelet tier: stopping what is left of $dir" >&2
    "$PYTHON" tests/kubelet/cluster.py stop "$dir" >&2 || echo "real-kubelet tier: LEFT OVER after the backstop (above)" >&2
  done
  rm -rf "$LLM_VITALS_KUBELET_RUN"
}
trap backstop EXIT
trap 'exit 130' INT TERM

# Serial on purpose: one cluster; the probe drills run side by side inside it (tests/kubelet/test_probes.py).
# `timeout` bounds a wedged run (its SIGTERM still stops the cluster by PID, in the fixture's teardown).
LLM_VITALS_REAL_KUBELET=1 timeout -k 60 3300 "$PYTHON" -m pytest tests/kubelet -p no:randomly -p no:cacheprovider "$@" \
  2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}
[ $rc = 124 ] && echo "real-kubelet tier: pytest timed out after 3300 s" >&2
echo "real-kubelet tier: $(( $(date +%s) - TIER_STARTED )) s in all (setup ${SETUP_S} s; pytest status $rc)"
exit $rc
