#!/usr/bin/env bash
# `make test-triton`: install (cached outside the clone) PyTriton/Triton 2.51, run the drills in
# tests/real_triton/, print the summary table; report and logs in .cache/real-triton/
# (tools/real-tier-lib.sh: run_engine_tier).
# usage: tools/real-triton-test.sh [extra pytest args]
# A machine that cannot run it is one SKIPPED line and status 0, or a failure under
# LLM_VITALS_REQUIRE_REAL_TRITON=1 (CI).
set -uo pipefail
cd "$(dirname "$0")/.."
TIER_NAME=Triton TIER_VAR=TRITON
source tools/real-tier-lib.sh
run_engine_tier triton 900 "$@"
