#!/usr/bin/env bash
# Build, once, what the real-llama.cpp tier needs, cached OUTSIDE the clone (tools/cache-path.sh):
#  - llama.cpp's native `llama-server`, built from the llama.cpp source that the llama-cpp-python
#    sdist vendors (commit 0c1e570 in 0.3.36). Built portable, not for this CPU (the recipe's
#    GGML_NATIVE=ON): GGML_NATIVE=OFF and, on x86-64, only SSE4.2 (x86-64-v2, every x86-64 server CPU
#    since 2009), so one cached binary runs on every machine CI lands on and the cache is keyed on the
#    architecture only. A native build keyed on the CPU's flags would be rebuilt cold (6 min on a quiet
#    2-core box, 34-45 min on a loaded one) whenever the machine changes; the 3.4M-parameter model
#    needs no AVX to make a token in milliseconds.
#  - a tiny random-weight llama GGUF written by tests/real_llamacpp/make_tiny_gguf.py (no download),
#    in a directory keyed on that script's hash (no CPU key: the file is the same everywhere).
#
# Exit status: 0 ready (the last line is BIN=... MODEL=...); 77 skipped (one line says why);
# 1 failed, or skipped while LLM_VITALS_REQUIRE_REAL_LLAMACPP=1 (CI), where a skip is a failure
# (tools/real-tier-lib.sh). Re-runs are fast: stamps record what was built.
set -euo pipefail
cd "$(dirname "$0")/.."
TIER_NAME=llama.cpp TIER_VAR=LLAMACPP
source tools/real-tier-lib.sh

SDIST_VERSION=0.3.36                 # llama-cpp-python; vendors llama.cpp 0c1e570
GGUF_PIN="gguf==0.19.0"
MODEL_SCRIPT=tests/real_llamacpp/make_tiny_gguf.py
ARCH=$(uname -m)
case $ARCH in
  # x86-64-v2: SSE4.2 and nothing newer (AVX, AVX2, FMA, F16C, BMI2 and AVX-512 are ggml's other switches).
  x86_64) BASELINE="x86-64-v2"
          ISA_FLAGS="-DGGML_SSE42=ON -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_AVX_VNNI=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF -DGGML_AVX512=OFF" ;;
  *)      BASELINE="$ARCH-generic"   # ggml's portable defaults for this architecture
          ISA_FLAGS="" ;;
esac
BIN_DIR=$(cache_dir llamacpp "$SDIST_VERSION-$BASELINE")
MODEL_DIR=$(cache_dir llamacpp-tiny-gguf "$(sha256sum "$MODEL_SCRIPT" | cut -c1-12)")
BIN=$BIN_DIR/llama-server
MODEL=$MODEL_DIR/tiny-llama.gguf
bin_want="llama-cpp-python==$SDIST_VERSION vendor/llama.cpp llama-server GGML_NATIVE=OFF $BASELINE $ISA_FLAGS"
model_want="$GGUF_PIN $(sha256sum "$MODEL_SCRIPT" | cut -d' ' -f1)"

bin_ready() { [ -x "$BIN" ] && stamp_is "$BIN_DIR/.llm-vitals-built" "$bin_want"; }
model_ready() { [ -f "$MODEL" ] && stamp_is "$MODEL_DIR/.llm-vitals-built" "$model_want"; }
ready() { echo "BIN=$BIN MODEL=$MODEL"; exit 0; }

if bin_ready && model_ready; then
  echo "real-llama.cpp setup: cached ($BIN_DIR, $MODEL_DIR)"
  ready
fi
# LLM_VITALS_CACHED_ONLY=1 (bench/bench_cost_of_watching.py): say where the parts are, never build them.
if [ "${LLM_VITALS_CACHED_ONLY:-}" = 1 ]; then
  echo "real-llama.cpp setup: not built ($BIN_DIR, $MODEL_DIR); run \`make test-llamacpp\` once"
  exit 77
fi

if [ "$ARCH" = x86_64 ] && ! grep -qw sse4_2 /proc/cpuinfo; then
  tier_skip "this x86-64 CPU has no SSE4.2, the build's baseline (x86-64-v2)"
fi
for tool in cmake g++ make; do
  command -v "$tool" >/dev/null || tier_skip "needs $tool to build llama-server (apt-get install cmake g++ make)"
done
command -v python3 >/dev/null || tier_skip "needs python3"

mkdir -p "$BIN_DIR" "$MODEL_DIR"
build_lock "$BIN_DIR"

if ! bin_ready; then
  t0=$(date +%s)
  work=$BIN_DIR/work
  log=$BIN_DIR/build.log
  rm -rf "$work"
  mkdir -p "$work"
  echo "real-llama.cpp setup: building llama-server ($BASELINE) from the llama-cpp-python $SDIST_VERSION sdist (about 6-10 min on 2 cores; log: $log)"
  {
    # The sdist (76 MB) through pip, the ordinary client; no other download (web UI and OpenSSL off).
    # --no-binary for this one package only: `:all:` would also build pip's metadata step's build
    # backends (scikit-build-core, poetry-core...) from source, minutes for nothing.
    nice -n 19 python3 -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$SDIST_VERSION" -d "$work/sdist"
    nice -n 19 tar xzf "$work/sdist/llama_cpp_python-$SDIST_VERSION.tar.gz" -C "$work"
    src=$work/llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp
    nice -n 19 cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF $ISA_FLAGS
    nice -n 19 cmake --build "$work/build" --target llama-server -j2
  } >"$log" 2>&1 || tier_fail "the build failed" "$log"
  # Portable means no AVX of any width: a vector register wider than SSE's in the binary would die by
  # SIGILL on a CPU without it (the check takes ~2 s; skipped without binutils' objdump).
  if [ "$ARCH" = x86_64 ] && command -v objdump >/dev/null; then
    wide=$(objdump -d --no-show-raw-insn "$work/build/bin/llama-server" | grep -cE '%[yz]mm' || true)
    [ "$wide" = 0 ] || { echo "real-llama.cpp setup: the build is not $BASELINE: $wide instructions use ymm/zmm registers" >&2; exit 1; }
  fi
  cp "$work/build/bin/llama-server" "$BIN.tmp"
  mv "$BIN.tmp" "$BIN"
  rm -rf "$work"   # 300 MB of source and objects; the static binary is all the tier needs
  "$BIN" --version >>"$log" 2>&1 || { echo "real-llama.cpp setup: the built llama-server does not run; see $log" >&2; exit 1; }
  echo "$bin_want" >"$BIN_DIR/.llm-vitals-built"
  echo "real-llama.cpp setup: llama-server built in $(( $(date +%s) - t0 )) s ($BIN)"
fi

if ! model_ready; then
  t0=$(date +%s)
  venv=$MODEL_DIR/venv
  log=$MODEL_DIR/build.log
  {
    new_venv python3 "$venv"
    "$venv/bin/pip" install -q "$GGUF_PIN" numpy
    "$venv/bin/python" "$MODEL_SCRIPT" "$MODEL.tmp"
  } >"$log" 2>&1 || tier_fail "writing the tiny GGUF failed" "$log"
  mv "$MODEL.tmp" "$MODEL"
  rm -rf "$venv"
  echo "$model_want" >"$MODEL_DIR/.llm-vitals-built"
  echo "real-llama.cpp setup: tiny GGUF written in $(( $(date +%s) - t0 )) s ($MODEL)"
fi
ready
