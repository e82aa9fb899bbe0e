#!/usr/bin/env bash
# `make test-llamacpp`: build (cached outside the clone) llama.cpp's llama-server and the tiny GGUF,
# run the drills in tests/real_llamacpp/ against the real server, print the summary table; report
# and logs in .cache/real-llamacpp/ (tools/real-tier-lib.sh: run_engine_tier).
# usage: tools/real-llamacpp-test.sh [extra pytest args]
# A missing build tool is one SKIPPED line and status 0, or a failure under
# LLM_VITALS_REQUIRE_REAL_LLAMACPP=1 (CI).
set -uo pipefail
cd "$(dirname "$0")/.."
TIER_NAME=llama.cpp TIER_VAR=LLAMACPP
source tools/real-tier-lib.sh

# The setup's last line names what it built: BIN=... MODEL=...; the drills find them in the environment.
tier_after_setup() {
  local paths
  paths=$(tail -1 <<<"$1")
  export LLM_VITALS_LLAMACPP_BIN=${paths#BIN=}
  LLM_VITALS_LLAMACPP_BIN=${LLM_VITALS_LLAMACPP_BIN%% MODEL=*}
  export LLM_VITALS_LLAMACPP_MODEL=${paths##* MODEL=}
}
run_engine_tier llamacpp 900 "$@"
