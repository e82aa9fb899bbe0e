#!/usr/bin/env bash
# Install, once, what the real-Triton test tier needs: a venv with nvidia-pytriton 0.7.0, which bundles
# the tritonserver 2.51 binary, cached outside the clone (tools/cache-path.sh triton 2.51).
#
# Trap (fixtures/triton RECIPE): the bundled Python-backend stub links the *system* libpython, so the
# venv must be made from /usr/bin/python3; a venv of another 3.11 build fails at model load with
# "'_thread.RLock' object has no attribute '_recursion_count'".
#
# Exit status: 0 ready (the venv's path is on the last line); 77 skipped (one line says why);
# 1 failed, or skipped while LLM_VITALS_REQUIRE_REAL_TRITON=1 (CI), where a skip is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTRITON_VERSION=0.7.0
SYSTEM_PYTHON=${LLM_VITALS_TRITON_PYTHON:-/usr/bin/python3}
VENV=${LLM_VITALS_TRITON_VENV:-$(bash tools/cache-path.sh triton 2.51)}
STAMP=$VENV/.llm-vitals-installed
want="nvidia-pytriton==$PYTRITON_VERSION from $SYSTEM_PYTHON"

skip() {
  local msg="SKIPPED: real-Triton tier: $1"
  if [ "${LLM_VITALS_REQUIRE_REAL_TRITON:-}" = 1 ]; then
    echo "$msg [LLM_VITALS_REQUIRE_REAL_TRITON=1 makes this a failure]" >&2
    exit 1
  fi
  echo "$msg"
  exit 77
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  echo "real-Triton setup: cached ($VENV)"
  echo "$VENV"
  exit 0
fi

[ "$(uname -m)" = x86_64 ] || skip "needs x86-64 Linux (nvidia-pytriton ships manylinux x86-64 wheels only), this is $(uname -m)"
[ -x "$SYSTEM_PYTHON" ] || skip "needs the system python3 at $SYSTEM_PYTHON (the bundled backend stub links its libpython)"
if ! "$SYSTEM_PYTHON" -c "import venv, ensurepip" 2>/dev/null; then
  # Debian splits venv/ensurepip out of python3: install it when we may (root with apt), as a fresh CI machine needs.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "real-Triton setup: installing python3-venv (the system python3 has no ensurepip)"
    apt-get -o DPkg::Lock::Timeout=600 install -y -q python3-venv >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && apt-get -o DPkg::Lock::Timeout=600 install -y -q python3-venv >/dev/null 2>&1; } || true
  fi
  "$SYSTEM_PYTHON" -c "import venv, ensurepip" 2>/dev/null || skip "the system python3 has no venv module: apt-get install python3-venv"
fi

mkdir -p "$(dirname "$VENV")"
LOG=$VENV.install.log
t0=$(date +%s)
echo "real-Triton setup: installing nvidia-pytriton==$PYTRITON_VERSION into $VENV (about 30 s, 370 MB; log: $LOG)"
rm -rf "$VENV"
"$SYSTEM_PYTHON" -m venv "$VENV"
if ! "$VENV/bin/pip" install -q "nvidia-pytriton==$PYTRITON_VERSION" >"$LOG" 2>&1; then
  echo "real-Triton setup: pip install failed; last lines of $LOG:" >&2
  tail -15 "$LOG" >&2
  exit 1
fi
"$VENV/bin/python" -c "import pytriton.triton, numpy" >>"$LOG" 2>&1 || {
  echo "real-Triton setup: the installed PyTriton does not import; see $LOG" >&2
  exit 1
}
echo "$want" >"$STAMP"
echo "real-Triton setup: venv ready in $(( $(date +%s) - t0 )) s"
echo "$VENV"
