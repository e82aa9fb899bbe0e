#!/usr/bin/env bash
# `make test-vllm`: set up (cached) the real vLLM, run the drills in tests/real_vllm/, print the summary.
# usage: tools/real-vllm-test.sh [extra pytest args]
# A missing x86-64 CPU or CPU torch wheel is one SKIPPED line and status 0, or a failure under
# LLM_VITALS_REQUIRE_REAL_VLLM=1 (CI).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON_BIN:-.venv/bin/python}
started=$(date +%s)

bash tools/real-vllm-setup.sh
rc=$?
[ $rc = 77 ] && exit 0   # skipped; the setup script said why in one line
[ $rc = 0 ] || exit $rc

CACHE=${LLM_VITALS_CACHE:-.cache}
rm -rf "$CACHE/real-vllm-report.json" "$CACHE/real-vllm-logs"
# Serial on purpose: the drills share one vLLM server and need the whole (2-core) machine.
# A run took 3-7 min on a quiet box; `timeout` bounds a wedged one or a box loaded by others (its SIGTERM still tears vLLM down by PID).
mkdir -p "$CACHE/real-vllm-logs"
LLM_VITALS_REAL_VLLM=1 timeout -k 60 1500 "$PYTHON" -m pytest tests/real_vllm -p no:randomly -p no:cacheprovider "$@" \
  2>&1 | tee "$CACHE/real-vllm-logs/pytest.log"
rc=${PIPESTATUS[0]}
[ $rc = 124 ] && echo "real-vLLM tier: pytest timed out after 1500 s" >&2
echo
"$PYTHON" tools/real-vllm-report.py "$CACHE/real-vllm-report.json" || true
echo "real-vLLM tier: $(( $(date +%s) - started )) s in all (pytest status $rc)"
exit $rc
