#!/usr/bin/env bash
# `make test-sglang`: set up (cached outside the clone) the real SGLang, run the drills in
# tests/real_sglang/, print the summary table; report and logs in .cache/real-sglang/
# (tools/real-tier-lib.sh: run_engine_tier).
# usage: tools/real-sglang-test.sh [extra pytest args]
# A missing x86-64 CPU or CPU torch wheel is one SKIPPED line and status 0, or a failure under
# LLM_VITALS_REQUIRE_REAL_SGLANG=1 (CI).
set -uo pipefail
cd "$(dirname "$0")/.."
TIER_NAME=SGLang TIER_VAR=SGLANG
source tools/real-tier-lib.sh
run_engine_tier sglang 1500 "$@"
