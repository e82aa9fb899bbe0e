# shellcheck shell=bash
# Sourced by the real tiers' scripts, tools/real-*-{setup,test}.sh: what every tier's setup does the
# same way (where a built part lives, one builder at a time, stamps, the venv, the skip that is a
# failure when the tier is required, running the setup from the test script) and the one runner
# every `make test-<engine>` is. The sourcing script cd's to the repository and sets TIER_NAME (as the
# messages say it: "vLLM") and TIER_VAR (its switches' suffix: VLLM, as in LLM_VITALS_REAL_VLLM and
# LLM_VITALS_REQUIRE_REAL_VLLM) first.

# tier_skip WHY: one line saying why the tier cannot run here, then exit 77; or, when the tier is
# required (LLM_VITALS_REQUIRE_REAL_<TIER>=1, which CI sets), the same line on stderr and exit 1.
# The rule tests/real_tier.py keeps for the tests.
tier_skip() {
  local msg="SKIPPED: real-$TIER_NAME tier: $1" require="LLM_VITALS_REQUIRE_REAL_$TIER_VAR"
  if [ "${!require:-}" = 1 ]; then
    echo "$msg [$require=1 makes this a failure]" >&2
    exit 1
  fi
  echo "$msg"
  exit 77
}

# tier_fail WHAT LOG: a step of the setup failed: say which, show the end of its log, exit 1.
tier_fail() {
  echo "real-$TIER_NAME setup: $1; last lines of $2:" >&2
  grep -v "^WARNING: Location" "$2" | tail -20 >&2
  exit 1
}

# The project's venv, which runs the tiers' tests (PYTHON_BIN overrides it).
PYTHON=${PYTHON_BIN:-.venv/bin/python}

# cache_dir NAME VERSION [--cpu]: where a built part lives, outside the clone (tools/cache-path.sh).
cache_dir() { bash tools/cache-path.sh "$@"; }

# stamp_is FILE WANT: the stamp a finished build wrote says it was built the way WANT asks now.
stamp_is() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

# build_lock DIR: one builder of DIR at a time (two checkouts, or CI and a developer, may set a tier
# up at once); held on DIR.lock until the script exits. Check the stamps again once it is held:
# the other builder may have finished the work.
build_lock() {
  mkdir -p "$(dirname "$1")"
  exec 9>"$1.lock"
  if ! flock -n 9; then
    echo "real-$TIER_NAME setup: another setup is building $1; waiting for it"
    flock 9
  fi
}

# new_venv PYTHON DIR: a fresh venv at DIR. One without its stamp is a build that failed or was cut
# short: nothing in it is trusted.
new_venv() {
  rm -rf "$2"
  mkdir -p "$(dirname "$2")"
  nice -n 10 "$1" -m venv "$2"
}

# cpu_torch_reachable PYTHON WHEEL_GLOB: PyPI has no "+cpu" torch. True when a wheel matching the
# glob is in a find-links folder pip is configured with (environment or pip.conf), or pip is pointed
# at the PyTorch CPU index.
cpu_torch_reachable() {
  local dirs dir
  dirs="${PIP_FIND_LINKS:-} $("$1" -m pip config get global.find-links 2>/dev/null || true)"
  for dir in $dirs; do
    dir=${dir#file://}
    compgen -G "$dir/$2" >/dev/null && return 0
  done
  case "${PIP_EXTRA_INDEX_URL:-} ${PIP_INDEX_URL:-} $("$1" -m pip config list 2>/dev/null)" in
    *download.pytorch.org/whl/cpu*) return 0 ;;
  esac
  return 1
}

# build_tiny_model PYTHON MODEL_DIR WANT LOG [MAX_POSITION_EMBEDDINGS]: the tiny random Llama of
# tests/real_vllm/make_tiny_model.py (deterministic, no download; the vLLM and SGLang tiers serve it),
# written by PYTHON (the tier venv's), built aside and moved into MODEL_DIR with its stamp saying
# WANT. MAX_POSITION_EMBEDDINGS widens the context its config declares.
build_tiny_model() {
  local python=$1 model=$2 want=$3 log=$4 positions=${5:-} t0
  t0=$(date +%s)
  mkdir -p "$(dirname "$model")"
  rm -rf "$model.tmp"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 nice -n 10 "$python" tests/real_vllm/make_tiny_model.py "$model.tmp" >>"$log" 2>&1 ||
    tier_fail "building the tiny model failed" "$log"
  if [ -n "$positions" ]; then
    "$python" - "$model.tmp/config.json" "$positions" >>"$log" 2>&1 <<'PY' || tier_fail "widening the tiny model's context failed" "$log"
import json, sys
path, positions = sys.argv[1], int(sys.argv[2])
config = json.load(open(path))
config["max_position_embeddings"] = positions
json.dump(config, open(path, "w"), indent=2)
PY
  fi
  rm -rf "$model"
  mv "$model.tmp" "$model"
  echo "$want" >"$model/.llm-vitals-built"
  echo "real-$TIER_NAME setup: tiny model built in $(( $(date +%s) - t0 )) s ($model)"
}

# skip_unless_cpu_torch X86_WHY PY311_WHY TORCH_PIN WHEEL_GLOB: what a tier on CPU torch (vLLM,
# SGLang) needs of this machine to build its venv: x86-64, python3.11, and the CPU torch wheel
# reachable by pip; one tier_skip line when it lacks one.
skip_unless_cpu_torch() {
  local arch
  arch=$(uname -m)
  [ "$arch" = x86_64 ] || tier_skip "needs x86-64, this machine is $arch ($1)"
  command -v python3.11 >/dev/null || tier_skip "needs python3.11 ($2)"
  cpu_torch_reachable python3.11 "$4" ||
    tier_skip "the CPU torch wheel ($3) is not reachable: PyPI has none; put $4 in a PIP_FIND_LINKS folder or set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu"
}

# tier_setup KEY: a test script runs its tier's setup, tools/real-KEY-setup.sh, whose output goes onto
# our stderr and into SETUP_OUT (its last line names the built paths); TIER_STARTED is when the tier
# began (now, unless the script set it) and SETUP_S how long it took until the setup was done. A setup that skips is status 0
# here, having said why in one line (under LLM_VITALS_REQUIRE_REAL_<TIER>=1 it failed instead); a
# failure exits with its status.
tier_setup() {
  local log rc
  TIER_STARTED=${TIER_STARTED:-$(date +%s)}
  # tee into a file and onto our stderr by its descriptor: `tee /dev/stderr` reopens the path, which
  # truncates a log file that CI redirects the run into (and loses everything before this point).
  log=$(mktemp)
  bash "tools/real-$1-setup.sh" | tee "$log" >&2
  rc=${PIPESTATUS[0]}
  SETUP_OUT=$(cat "$log")
  rm -f "$log"
  [ "$rc" = 77 ] && exit 0
  [ "$rc" = 0 ] || exit "$rc"
  SETUP_S=$(( $(date +%s) - TIER_STARTED ))
}

# run_engine_tier KEY LIMIT_S [PYTEST_ARGS...]: `make test-<engine>`. The setup (cached), then the
# drills in tests/real_<KEY>/ with the tier's switch on, serial on purpose (they share one server and
# need the whole 2-core machine) and bounded by `timeout LIMIT_S` (its SIGTERM still stops the engine
# by PID), then the summary table. The report and logs go to .cache/real-<KEY>/ (LLM_VITALS_CACHE
# moves .cache). A setup that skips is status 0 here, having said why in one line; under the tier's
# LLM_VITALS_REQUIRE_REAL_<TIER>=1 it failed instead. A `tier_after_setup SETUP_OUTPUT` function,
# where the sourcing script defines one, takes what the setup printed (llama.cpp: the built paths).
run_engine_tier() {
  local key=$1 limit=$2
  shift 2
  local rc out
  tier_setup "$key"
  if declare -F tier_after_setup >/dev/null; then
    tier_after_setup "$SETUP_OUT"
  fi

  out=${LLM_VITALS_CACHE:-.cache}/real-$key
  rm -rf "$out"
  mkdir -p "$out/logs"
  env "LLM_VITALS_REAL_$TIER_VAR=1" timeout -k 60 "$limit" "$PYTHON" -m pytest "tests/real_$key" -p no:randomly -p no:cacheprovider "$@" \
    2>&1 | tee "$out/logs/pytest.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 124 ] && echo "real-$TIER_NAME tier: pytest timed out after $limit s" >&2
  echo
  "$PYTHON" tools/real-engine-report.py "$out/report.json" || true
  echo "real-$TIER_NAME tier: $(( $(date +%s) - TIER_STARTED )) s in all (setup ${SETUP_S} s; pytest status $rc)"
  exit "$rc"
}
