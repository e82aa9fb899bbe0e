#!/usr/bin/env bash
# Where a built real part lives: outside the clone (CI clones afresh, so a cache under it is always
# empty), keyed on the part's version and, for anything compiled for this CPU, on the CPU's flags.
# usage: tools/cache-path.sh NAME VERSION [--cpu]    prints the directory (not created)
#   LLM_VITALS_CACHE_ROOT overrides the root (default: $XDG_CACHE_HOME/llm-vitals or ~/.cache/llm-vitals).
# --cpu adds a key of this CPU's flags: a native build (-march=native, oneDNN/inductor kernels) made
# on a machine with AMX or AVX-512 dies with SIGILL on one without, and machines differ between sessions.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 NAME VERSION [--cpu]" >&2; exit 2; }
root=${LLM_VITALS_CACHE_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/llm-vitals}
dir="$root/$1-$2"
if [ "${3:-}" = "--cpu" ]; then
  key=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | sort -u | sha256sum | cut -c1-12)
  dir="$dir-cpu$key"
fi
echo "$dir"
