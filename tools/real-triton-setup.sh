#!/usr/bin/env bash
# Install, once, what the real-Triton test tier needs: a venv with nvidia-pytriton 0.7.0, which bundles
# the tritonserver 2.51 binary, cached outside the clone (tools/cache-path.sh triton 2.51).
#
# Trap (fixtures/triton RECIPE): the bundled Python-backend stub links the *system* libpython, so the
# venv must be made from /usr/bin/python3; a venv of another 3.11 build fails at model load with
# "'_thread.RLock' object has no attribute '_recursion_count'".
#
# Exit status: 0 ready (the venv's path is on the last line); 77 skipped (one line says why);
# 1 failed, or skipped while LLM_VITALS_REQUIRE_REAL_TRITON=1 (CI), where a skip is a failure
# (tools/real-tier-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
TIER_NAME=Triton TIER_VAR=TRITON
source tools/real-tier-lib.sh

PYTRITON_VERSION=0.7.0
SYSTEM_PYTHON=${LLM_VITALS_TRITON_PYTHON:-/usr/bin/python3}
VENV=${LLM_VITALS_TRITON_VENV:-$(cache_dir triton 2.51)}
STAMP=$VENV/.llm-vitals-installed
LOG=$VENV.install.log
want="nvidia-pytriton==$PYTRITON_VERSION from $SYSTEM_PYTHON"
ready() { stamp_is "$STAMP" "$want" && [ -x "$VENV/bin/python" ]; }

if ready; then
  echo "real-Triton setup: cached ($VENV)"
  echo "$VENV"
  exit 0
fi

[ "$(uname -m)" = x86_64 ] || tier_skip "needs x86-64 Linux (nvidia-pytriton ships manylinux x86-64 wheels only), this is $(uname -m)"
[ -x "$SYSTEM_PYTHON" ] || tier_skip "needs the system python3 at $SYSTEM_PYTHON (the bundled backend stub links its libpython)"
if ! "$SYSTEM_PYTHON" -c "import venv, ensurepip" 2>/dev/null; then
  # Debian splits venv/ensurepip out of python3: install it when we may (root with apt), as a fresh CI machine needs.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "real-Triton setup: installing python3-venv (the system python3 has no ensurepip)"
    apt-get -o DPkg::Lock::Timeout=600 install -y -q python3-venv >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && apt-get -o DPkg::Lock::Timeout=600 install -y -q python3-venv >/dev/null 2>&1; } || true
  fi
  "$SYSTEM_PYTHON" -c "import venv, ensurepip" 2>/dev/null || tier_skip "the system python3 has no venv module: apt-get install python3-venv"
fi

build_lock "$VENV"
if ready; then
  echo "real-Triton setup: cached ($VENV, built by the other setup)"
  echo "$VENV"
  exit 0
fi
t0=$(date +%s)
echo "real-Triton setup: installing nvidia-pytriton==$PYTRITON_VERSION into $VENV (about 30 s, 370 MB; log: $LOG)"
new_venv "$SYSTEM_PYTHON" "$VENV" >"$LOG" 2>&1 || tier_fail "$SYSTEM_PYTHON -m venv failed" "$LOG"
nice -n 10 "$VENV/bin/pip" install -q "nvidia-pytriton==$PYTRITON_VERSION" >>"$LOG" 2>&1 || tier_fail "pip install failed" "$LOG"
"$VENV/bin/python" -c "import pytriton.triton, numpy" >>"$LOG" 2>&1 || tier_fail "the installed PyTriton does not import" "$LOG"
echo "$want" >"$STAMP"
echo "real-Triton setup: venv ready in $(( $(date +%s) - t0 )) s"
echo "$VENV"
