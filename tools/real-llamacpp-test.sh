#!/usr/bin/env bash
# `make test-llamacpp`: build (cached outside the clone) llama.cpp's llama-server and the tiny GGUF,
# run the drills in tests/real_llamacpp/ against the real server, print the summary table.
# usage: tools/real-llamacpp-test.sh [extra pytest args]
# A missing build tool is one SKIPPED line and status 0, or a failure under
# LLM_VITALS_REQUIRE_REAL_LLAMACPP=1 (CI).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON_BIN:-.venv/bin/python}
started=$(date +%s)

# tee into a file and onto our stderr by its descriptor: `tee /dev/stderr` reopens the path, which
# truncates a log file that CI redirects the run into (and loses everything before this point).
setup_log=$(mktemp)
bash tools/real-llamacpp-setup.sh | tee "$setup_log" >&2
rc=${PIPESTATUS[0]}
setup_out=$(cat "$setup_log")
rm -f "$setup_log"
[ $rc = 77 ] && exit 0   # skipped; the setup script said why in one line
[ $rc = 0 ] || exit $rc
paths=$(tail -1 <<<"$setup_out")
export LLM_VITALS_LLAMACPP_BIN=$(sed -n 's/^BIN=\([^ ]*\) MODEL=.*/\1/p' <<<"$paths")
export LLM_VITALS_LLAMACPP_MODEL=$(sed -n 's/.* MODEL=\(.*\)$/\1/p' <<<"$paths")
setup_s=$(( $(date +%s) - started ))

OUT=${LLM_VITALS_LLAMACPP_OUT:-.cache/real-llamacpp}
rm -rf "$OUT"
mkdir -p "$OUT/logs"
# Serial on purpose: the drills share one server and need the whole (2-core) machine.
# `timeout` bounds a wedged run (its SIGTERM still stops llama-server by PID).
LLM_VITALS_REAL_LLAMACPP=1 timeout -k 60 900 "$PYTHON" -m pytest tests/real_llamacpp -p no:randomly -p no:cacheprovider "$@" \
  2>&1 | tee "$OUT/logs/pytest.log"
rc=${PIPESTATUS[0]}
[ $rc = 124 ] && echo "real-llama.cpp tier: pytest timed out after 900 s" >&2
echo
"$PYTHON" tools/real-llamacpp-report.py "$OUT/report.json" || true
echo "real-llama.cpp tier: $(( $(date +%s) - started )) s in all (setup ${setup_s} s; pytest status $rc)"
exit $rc
