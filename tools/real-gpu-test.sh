#!/usr/bin/env bash
# `make test-gpu` (tests/real_gpu/README.md), on a machine with an NVIDIA GPU and nvcc: llama-server built
# with CUDA (tools/real-gpu-setup.sh, cached outside the clone), a 824M-parameter GGUF, the llama.cpp
# drills on the GPU with the exporter's NVML source reading that GPU all along, then the NVML source
# against the GPU (healthy) with its cost. Results and logs in .cache/real-gpu/.
# Without an NVIDIA GPU: one line, status 0. Not a CI step: CI has no GPU.
# LLM_VITALS_GPU_FLOW_ON_CPU=1 checks the flow on a machine without a GPU instead: the llama.cpp tier's
# CPU build and tiny model, a CPU neighbour, and the NVML source expected to say why it cannot read.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON_BIN:-.venv/bin/python}
OUT=${LLM_VITALS_GPU_OUT:-.cache/real-gpu}
started=$(date +%s)

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
flow=${LLM_VITALS_GPU_FLOW_ON_CPU:-}
if [ "${gpus:-0}" = 0 ] && [ "$flow" != 1 ]; then
  echo "SKIPPED: GPU tier: no NVIDIA GPU here (nvidia-smi lists none), nothing was run"
  exit 0
fi
rm -rf "$OUT"
mkdir -p "$OUT"

drills=1
if [ "$flow" = 1 ]; then
  echo "GPU tier: the flow on the CPU (no GPU used): the llama.cpp tier's CPU llama-server and tiny model"
  paths=$(bash tools/real-llamacpp-setup.sh | tail -1)
  BIN=$(sed -n 's/^BIN=\([^ ]*\) .*/\1/p' <<<"$paths")
  MODEL=$(sed -n 's/.* MODEL=\([^ ]*\).*/\1/p' <<<"$paths")
  [ -n "$BIN" ] || { echo "GPU tier: the llama.cpp tier's setup gave no binary: $paths" >&2; exit 1; }
  drill_args=(--cpu-flow)
  nvml_args=(--no-gpu)
else
  echo "GPU tier: $gpus GPU(s): $(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | head -1)"
  # The exporter's NVML source needs the [gpu] extra.
  "$PYTHON" -c "import pynvml" 2>/dev/null || "$PYTHON" -m pip install -q 'nvidia-ml-py>=12.535' \
    || echo "GPU tier: nvidia-ml-py could not be installed; the NVML steps will fail saying so"
  setup_log=$(mktemp)
  bash tools/real-gpu-setup.sh | tee "$setup_log" >&2
  rc=${PIPESTATUS[0]}
  paths=$(tail -1 "$setup_log")
  rm -f "$setup_log"
  if [ $rc = 77 ]; then
    drills=0   # no nvcc or no compiler: the setup said why in one line; the NVML step still runs
  elif [ $rc != 0 ]; then
    exit $rc
  fi
  BIN=$(sed -n 's/^BIN=\([^ ]*\) .*/\1/p' <<<"$paths")
  MODEL=$(sed -n 's/.* MODEL=\([^ ]*\) .*/\1/p' <<<"$paths")
  HOG=$(sed -n 's/.* HOG=\([^ ]*\)$/\1/p' <<<"$paths")
  drill_args=(--hog "$HOG")
  nvml_args=()
fi
setup_s=$(( $(date +%s) - started ))

drills_rc=0
if [ $drills = 1 ]; then
  # `timeout` bounds a wedged run; its SIGTERM still stops every process the drills started, by PID.
  timeout -k 30 420 env PYTHONPATH=tests "$PYTHON" tests/real_gpu/gpu_drills.py --bin "$BIN" --model "$MODEL" \
    --out "$OUT" "${drill_args[@]}" 2>&1 | tee "$OUT/drills.log"
  drills_rc=${PIPESTATUS[0]}
  [ $drills_rc = 124 ] && echo "GPU tier: the drills timed out after 420 s" >&2
fi
timeout -k 10 120 "$PYTHON" tests/real_gpu/nvml_check.py "$OUT" "${nvml_args[@]}" > "$OUT/nvml.log" 2>&1
nvml_rc=$?
echo
"$PYTHON" tests/real_gpu/report.py "$OUT"
echo "GPU tier: $(( $(date +%s) - started )) s in all (setup ${setup_s} s; drills status $drills_rc, NVML status $nvml_rc); $OUT"
[ $drills_rc = 0 ] && [ $nvml_rc = 0 ]
