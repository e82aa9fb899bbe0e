"""Quick checks of the real-SGLang tier's own tools; these run in the normal suite (no SGLang needed).

The kit's checks (load, report, setup scripts' skips) are in tests/real_engine/.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .sglang_server import SglangServer

REPO = Path(__file__).resolve().parents[2]


def test_the_server_command_uses_the_stand_in_friendly_flags_on_a_loopback_port():
    argv = SglangServer(port=4321, log_dir=REPO / ".cache").command()
    joined = " ".join(argv)
    assert "-m sglang.launch_server" in joined and "--host 127.0.0.1 --port 4321" in joined
    # The default attention backend on x86 CPU (intel_amx) needs the real CPU kernels.
    assert "--attention-backend torch_native" in joined and "--enable-metrics" in joined
    assert "nice" not in argv, "the start runs at normal priority; the processes are lowered once ready"


def test_the_kernel_stand_in_raises_on_any_call(tmp_path):
    shim = REPO / "tests" / "real_sglang" / "sgl_kernel_shim"
    code = (
        "import sgl_kernel, sgl_kernel.kvcacheio as k\n"
        "try:\n    k.copy_all_layer_kv_cache_cpu()\nexcept NotImplementedError as e:\n    print(e)\n"
    )
    result = subprocess.run(["python3", "-c", code], env={**os.environ, "PYTHONPATH": str(shim)},
                            capture_output=True, text=True, timeout=30, check=True)
    assert result.stdout.strip() == "sgl_kernel shim: sgl_kernel.kvcacheio.copy_all_layer_kv_cache_cpu is not implemented"
