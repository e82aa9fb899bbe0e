#!/usr/bin/env bash
# `make test-triton`: install (cached) PyTriton/Triton 2.51, run the drills in tests/real_triton/, print the summary.
# usage: tools/real-triton-test.sh [extra pytest args]
# A machine that cannot run it is one SKIPPED line and status 0, or a failure under
# LLM_VITALS_REQUIRE_REAL_TRITON=1 (CI).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON_BIN:-.venv/bin/python}
started=$(date +%s)

bash tools/real-triton-setup.sh
rc=$?
[ $rc = 77 ] && exit 0   # skipped; the setup script said why in one line
[ $rc = 0 ] || exit $rc

CACHE=${LLM_VITALS_CACHE:-.cache}
rm -rf "$CACHE/real-triton-report.json" "$CACHE/real-triton-logs"
mkdir -p "$CACHE/real-triton-logs"
# Serial on purpose: the drills share one server and need the whole (2-core) machine.
# `timeout` bounds a wedged run; its SIGTERM still tears Triton down by PID.
LLM_VITALS_REAL_TRITON=1 timeout -k 60 900 "$PYTHON" -m pytest tests/real_triton -p no:randomly -p no:cacheprovider "$@" \
  2>&1 | tee "$CACHE/real-triton-logs/pytest.log"
rc=${PIPESTATUS[0]}
[ $rc = 124 ] && echo "real-Triton tier: pytest timed out after 900 s" >&2
echo
"$PYTHON" tools/real-vllm-report.py "$CACHE/real-triton-report.json" || true
echo "real-Triton tier: $(( $(date +%s) - started )) s in all (pytest status $rc)"
exit $rc
