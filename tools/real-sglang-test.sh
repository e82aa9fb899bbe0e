#!/usr/bin/env bash
# `make test-sglang`: set up (cached outside the clone) the real SGLang, run the drills in
# tests/real_sglang/, print the summary table.
# usage: tools/real-sglang-test.sh [extra pytest args]
# A missing x86-64 CPU or CPU torch wheel is one SKIPPED line and status 0, or a failure under
# LLM_VITALS_REQUIRE_REAL_SGLANG=1 (CI).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON_BIN:-.venv/bin/python}
started=$(date +%s)

bash tools/real-sglang-setup.sh
rc=$?
[ $rc = 77 ] && exit 0   # skipped; the setup script said why in one line
[ $rc = 0 ] || exit $rc

RUN=${LLM_VITALS_CACHE:-.cache}
rm -rf "$RUN/real-sglang-report.json" "$RUN/real-sglang-logs"
mkdir -p "$RUN/real-sglang-logs"
# Serial on purpose: the drills share one SGLang server. `timeout` bounds a wedged run (its SIGTERM
# still tears SGLang down by PID).
LLM_VITALS_REAL_SGLANG=1 timeout -k 60 1500 "$PYTHON" -m pytest tests/real_sglang -p no:randomly -p no:cacheprovider "$@" \
  2>&1 | tee "$RUN/real-sglang-logs/pytest.log"
rc=${PIPESTATUS[0]}
[ $rc = 124 ] && echo "real-SGLang tier: pytest timed out after 1500 s" >&2
echo
"$PYTHON" tools/real-vllm-report.py "$RUN/real-sglang-report.json" || true
echo "real-SGLang tier: $(( $(date +%s) - started )) s in all (pytest status $rc)"
exit $rc
