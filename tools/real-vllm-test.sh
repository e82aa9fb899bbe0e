#!/usr/bin/env bash
# `make test-vllm`: set up (cached outside the clone) the real vLLM, run the drills in tests/real_vllm/,
# print the summary table; report and logs in .cache/real-vllm/ (tools/real-tier-lib.sh: run_engine_tier).
# usage: tools/real-vllm-test.sh [extra pytest args]
# A missing x86-64 CPU or CPU torch wheel is one SKIPPED line and status 0, or a failure under
# LLM_VITALS_REQUIRE_REAL_VLLM=1 (CI).
set -uo pipefail
cd "$(dirname "$0")/.."
TIER_NAME=vLLM TIER_VAR=VLLM
source tools/real-tier-lib.sh
# A run took 3-7 min on a quiet box; the bound is for a wedged one or a box loaded by others.
run_engine_tier vllm 1500 "$@"
