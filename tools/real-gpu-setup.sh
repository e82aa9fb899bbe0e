#!/usr/bin/env bash
# Build, once, what the GPU tier needs (tests/real_gpu/README.md), cached OUTSIDE the clone (tools/cache-path.sh):
#  - llama.cpp's `llama-server` built WITH CUDA from the source the llama.cpp tier uses (the
#    llama-cpp-python 0.3.36 sdist's llama.cpp 0c1e570), for this GPU's CUDA architecture (sm_90 for
#    an H100/H200, the first one run; the GPU's compute capability otherwise, or LLM_VITALS_CUDA_ARCH).
#    Keyed on the version and the CUDA architecture; the CPU part is built for a fixed baseline
#    (x86-64-v3: AVX2/FMA, every GPU host's CPU) rather than for this CPU, so the key needs no CPU flags.
#    The recipe's flags (tests/fixtures/gpu/README.md): flash attention's CUDA kernels off (a far
#    shorter build: 257 s on 16 cores; attention then runs on the CPU, fine for drills), no NCCL,
#    no web UI, no OpenSSL, static.
#  - a random-weight llama GGUF of 824M parameters (F16, 1.6 GB), written by tests/real_gpu/make_gguf.py.
#  - the noisy neighbour: tests/real_gpu/gpu_hog.cu built with nvcc.
# The build and the GGUF run side by side. Offline: LLM_VITALS_LLAMACPP_SRC names a llama.cpp source
# tree or tarball (it must keep tools/ui/'s CMake files even with the UI off), and pip's own
# PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR give the GGUF writer its `gguf` and `numpy` wheels.
#
# Exit status: 0 ready (the last line is BIN=... MODEL=... HOG=...); 77 skipped (one line says why); 1 failed.
set -euo pipefail
cd "$(dirname "$0")/.."

SDIST_VERSION=0.3.36                 # llama-cpp-python; vendors llama.cpp 0c1e570 (the llama.cpp tier's)
GGUF_PIN="gguf==0.19.0"
MODEL_SCRIPTS="tests/real_gpu/make_gguf.py tests/real_llamacpp/make_tiny_gguf.py"
JOBS=${LLM_VITALS_BUILD_JOBS:-$(nproc)}

skip() { echo "SKIPPED: GPU tier: $1"; exit 77; }

NVCC=$(command -v nvcc || true)
if [ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; fi
[ -n "$NVCC" ] || skip "no nvcc (the CUDA toolkit) to build llama-server with CUDA"
for tool in cmake g++ make; do
  command -v "$tool" >/dev/null || skip "needs $tool to build llama-server (apt-get install cmake g++ make)"
done

# The CUDA architecture: the GPU's compute capability ("9.0" -> 90), else sm_90.
ARCH=${LLM_VITALS_CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .' || true)}
[[ "$ARCH" =~ ^[0-9]+$ ]] || ARCH=90
case $(uname -m) in
  x86_64) BASELINE="x86-64-v3"
          ISA_FLAGS="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF" ;;
  *)      BASELINE="$(uname -m)-generic"   # ggml's portable defaults (a Grace Hopper's aarch64, say)
          ISA_FLAGS="" ;;
esac
CUDA_FLAGS="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCH-real -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF"
BIN_DIR=$(tools/cache-path.sh llamacpp-cuda "$SDIST_VERSION-sm$ARCH-$BASELINE")
MODEL_DIR=$(tools/cache-path.sh llamacpp-gguf-822m "$(cat $MODEL_SCRIPTS | sha256sum | cut -c1-12)")
BIN=$BIN_DIR/llama-server
HOG=$BIN_DIR/gpu_hog
MODEL=$MODEL_DIR/llama-822m.gguf
bin_want="llama-cpp-python==$SDIST_VERSION ${LLM_VITALS_LLAMACPP_SRC:-sdist} $CUDA_FLAGS GGML_NATIVE=OFF $ISA_FLAGS $(sha256sum tests/real_gpu/gpu_hog.cu | cut -c1-12)"
model_want="$GGUF_PIN $(cat $MODEL_SCRIPTS | sha256sum | cut -d' ' -f1)"

stamp_is() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }
bin_ready() { [ -x "$BIN" ] && [ -x "$HOG" ] && stamp_is "$BIN_DIR/.llm-vitals-built" "$bin_want"; }
model_ready() { [ -f "$MODEL" ] && stamp_is "$MODEL_DIR/.llm-vitals-built" "$model_want"; }

mkdir -p "$BIN_DIR" "$MODEL_DIR"

build_model() {
  local t0 venv log
  t0=$(date +%s); venv=$MODEL_DIR/venv; log=$MODEL_DIR/build.log
  {
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install -q "$GGUF_PIN" numpy
    PYTHONPATH=tests "$venv/bin/python" tests/real_gpu/make_gguf.py "$MODEL.tmp"
  } >"$log" 2>&1 || { echo "GPU setup: writing the GGUF failed; last lines of $log:" >&2; tail -20 "$log" >&2; return 1; }
  mv "$MODEL.tmp" "$MODEL"
  rm -rf "$venv"
  echo "$model_want" >"$MODEL_DIR/.llm-vitals-built"
  echo "GPU setup: 824M-parameter GGUF written in $(( $(date +%s) - t0 )) s ($MODEL)"
}

build_bin() {
  local t0 work log src
  t0=$(date +%s); work=$BIN_DIR/work; log=$BIN_DIR/build.log
  rm -rf "$work"; mkdir -p "$work"
  echo "GPU setup: building llama-server with CUDA (sm_$ARCH, $BASELINE, -j$JOBS; 257 s on 16 cores; log: $log)"
  {
    if [ -n "${LLM_VITALS_LLAMACPP_SRC:-}" ] && [ -d "$LLM_VITALS_LLAMACPP_SRC" ]; then
      src=$LLM_VITALS_LLAMACPP_SRC
    elif [ -n "${LLM_VITALS_LLAMACPP_SRC:-}" ]; then
      mkdir -p "$work/src" && tar xf "$LLM_VITALS_LLAMACPP_SRC" -C "$work/src"
      src=$(dirname "$(find "$work/src" -maxdepth 3 -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' | head -1)")
    else
      # The sdist through pip, the ordinary client, as tools/real-llamacpp-setup.sh does.
      python3 -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$SDIST_VERSION" -d "$work/sdist"
      tar xzf "$work/sdist/llama_cpp_python-$SDIST_VERSION.tar.gz" -C "$work"
      src=$work/llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp
    fi
    cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" $CUDA_FLAGS \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF $ISA_FLAGS
    cmake --build "$work/build" --target llama-server -j"$JOBS"
    "$NVCC" -O2 -arch=sm_"$ARCH" -o "$work/gpu_hog" tests/real_gpu/gpu_hog.cu
  } >"$log" 2>&1 || { echo "GPU setup: the build failed; last lines of $log:" >&2; tail -25 "$log" >&2; return 1; }
  cp "$work/build/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
  cp "$work/gpu_hog" "$HOG.tmp" && mv "$HOG.tmp" "$HOG"
  rm -rf "$work"
  "$BIN" --version >>"$log" 2>&1 || { echo "GPU setup: the built llama-server does not run; see $log" >&2; return 1; }
  echo "$bin_want" >"$BIN_DIR/.llm-vitals-built"
  echo "GPU setup: llama-server built in $(( $(date +%s) - t0 )) s ($BIN)"
}

# One builder at a time per cache directory.
exec 9>"$BIN_DIR.lock"
flock 9
model_pid=
if ! model_ready; then build_model & model_pid=$!; fi
bin_rc=0
bin_ready || build_bin || bin_rc=1
model_rc=0
[ -z "$model_pid" ] || wait "$model_pid" || model_rc=1
[ $bin_rc = 0 ] && [ $model_rc = 0 ] || exit 1
echo "GPU setup: ready ($BIN_DIR, $MODEL_DIR)"
echo "BIN=$BIN MODEL=$MODEL HOG=$HOG"
