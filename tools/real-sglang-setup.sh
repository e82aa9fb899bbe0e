#!/usr/bin/env bash
# Build, once, what the real-SGLang test tier needs, cached outside the clone
# (tools/cache-path.sh sglang 0.5.23): a venv of its own with SGLang 0.5.23 on CPU torch, the
# import-only stand-in for its CPU kernel library, and the tiny model served by the drills.
# Why each step is there: tests/real_sglang/README.md (the traps come from SGLang's CUDA-only pins).
#
# Exit status: 0 ready; 77 skipped (one line says why); 1 failed, or skipped while
# LLM_VITALS_REQUIRE_REAL_SGLANG=1 (CI), where a skip is a failure (tools/real-tier-lib.sh).
# Re-runs are fast: a stamp records what was built, so a cached setup takes well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."
TIER_NAME=SGLang TIER_VAR=SGLANG
source tools/real-tier-lib.sh

SGLANG_VERSION=0.5.23
# SGLang's wheel pins torch 2.14.1 (a CUDA build); the CPU wheel reachable here is 2.13.0+cpu, which
# runs SGLang's CPU path. PyPI has no "+cpu" torch: a local wheel folder (find-links) or the
# PyTorch CPU index must have it.
TORCH_PIN="torch==2.13.0+cpu"
TORCH_WHEEL_GLOB="torch-2.13.0+cpu-cp311-cp311-*x86_64.whl"
TORCHVISION_PIN="torchvision==0.28.0"
ROOT=${LLM_VITALS_SGLANG_CACHE:-$(cache_dir sglang "$SGLANG_VERSION")}
VENV=$ROOT/venv
MODEL=$ROOT/tiny-llama
LOG=$ROOT/install.log
SHIM=tests/real_sglang/sgl_kernel_shim/sgl_kernel
MODEL_SCRIPT=tests/real_vllm/make_tiny_model.py
VENV_STAMP=$VENV/.llm-vitals-installed
N="nice -n 19"

# SGLang's runtime dependencies, by hand: `pip install sglang` with its deps would pull a CUDA stack
# (torch 2.14.1, sglang-kernel, flashinfer, nvidia-*). Versions as the recipe measured them.
DEPS=(
  numpy "transformers==5.19.0" "tokenizers==0.23.2" safetensors huggingface_hub "sentencepiece==0.2.1"
  fastapi "uvicorn>=0.51" uvloop "pyzmq>=25.1.2" orjson msgspec "prometheus-client>=0.20.0" psutil
  setproctitle pybase64 python-multipart requests aiohttp pillow einops packaging pydantic interegular
  partial_json_parser "openai==2.8.0" tiktoken "blobfile==3.0.0" "llguidance>=1.7.6,<2.0.0" gguf scipy
  watchfiles xxhash zstandard IPython distro "python-dateutil<3" regex tqdm "anthropic>=0.20.0"
  "openai-harmony==0.0.4" "apache-tvm-ffi==0.1.11" "xgrammar==0.2.7" "mistral_common>=1.11.5"
  "compressed-tensors==0.18.0" ninja build dill soundfile
)

# The stamp names everything the venv is made of, the stand-in's files and the DEPS list above
# included: change one and the venv is rebuilt.
shim_sum=$(cat "$SHIM"/*.py | sha256sum | cut -c1-16)
venv_want="sglang==$SGLANG_VERSION --no-deps, $TORCH_PIN, $TORCHVISION_PIN ops emptied, sgl_kernel stand-in $shim_sum, deps $(sed -n '/^DEPS=(/,/^)/p' "$0" | sha256sum | cut -c1-16)"
model_want="$(sha256sum "$MODEL_SCRIPT" | cut -d' ' -f1) max_position_embeddings=32768"
venv_ready() { stamp_is "$VENV_STAMP" "$venv_want"; }
model_ready() { stamp_is "$MODEL/.llm-vitals-built" "$model_want"; }

if venv_ready && model_ready; then
  echo "real-SGLang setup: cached ($ROOT)"
  exit 0
fi

venv_ready || skip_unless_cpu_torch "the CPU torch wheel here is x86-64" "the sglang $SGLANG_VERSION wheel is cp311 here" \
  "$TORCH_PIN" "$TORCH_WHEEL_GLOB"

build_lock "$ROOT"

if ! venv_ready; then
  mkdir -p "$ROOT"
  t0=$(date +%s)
  echo "real-SGLang setup: installing sglang==$SGLANG_VERSION on $TORCH_PIN into $VENV (about 2 min, 2.9 GB; log: $LOG)"
  new_venv python3.11 "$VENV" >"$LOG" 2>&1 || tier_fail "python3.11 -m venv failed" "$LOG"
  PIP="$N $VENV/bin/pip install --progress-bar off"
  echo "$TORCH_PIN" >"$ROOT/torch-pin.txt"
  # CPU torch first, then pinned for every later install so nothing can swap in a CUDA build.
  $PIP "$TORCH_PIN" >>"$LOG" 2>&1 || tier_fail "pip install $TORCH_PIN failed" "$LOG"
  $PIP -c "$ROOT/torch-pin.txt" "${DEPS[@]}" >>"$LOG" 2>&1 || tier_fail "pip install of SGLang's dependencies failed" "$LOG"
  $PIP -c "$ROOT/torch-pin.txt" --no-deps "sglang==$SGLANG_VERSION" >>"$LOG" 2>&1 || tier_fail "pip install sglang failed" "$LOG"
  # SGLang imports torchvision.transforms at start-up; the only torchvision wheels are CUDA builds
  # whose _C.so cannot load next to CPU torch ("operator torchvision::nms does not exist"). Empty
  # the two modules that register its ops: the pure-Python transforms still work.
  $PIP --no-deps "$TORCHVISION_PIN" >>"$LOG" 2>&1 || tier_fail "pip install $TORCHVISION_PIN failed" "$LOG"
  SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  for f in _meta_registrations.py _autograd_registrations.py; do
    echo "# emptied by tools/real-sglang-setup.sh: the wheel's CUDA-built _C.so cannot load with CPU torch" >"$SP/torchvision/$f"
  done
  # sgl_kernel: SGLang's CPU path does `from sgl_kernel import ...`; its CPU build is published only
  # as source. The stand-in makes the imports succeed and raises if any name is ever called.
  rm -rf "$SP/sgl_kernel"
  cp -r "$SHIM" "$SP/sgl_kernel"
  SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -c "import sglang, sglang.launch_server, torch, psutil; assert torch.__version__ == '2.13.0+cpu', torch.__version__" >>"$LOG" 2>&1 \
    || tier_fail "the installed SGLang does not import" "$LOG"
  if "$VENV/bin/pip" list 2>/dev/null | grep -iE "^(nvidia|cuda)" >>"$LOG"; then
    tier_fail "CUDA packages got into the venv" "$LOG"
  fi
  echo "$venv_want" >"$VENV_STAMP"
  echo "real-SGLang setup: SGLang venv ready in $(( $(date +%s) - t0 )) s ($(du -sh "$VENV" | cut -f1))"
fi

# A context of 32768 lets one ignore_eos generation decode for minutes, and a long prompt be
# chunked several times.
model_ready || build_tiny_model "$VENV/bin/python" "$MODEL" "$model_want" "$LOG" 32768
