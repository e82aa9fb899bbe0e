"""Quick checks of the real-SGLang tier's own tools; these run in the normal suite (no SGLang needed).

The setup script's skip paths are driven with stand-in `uname`/`python3.11` executables on PATH and a
cache folder of the test's own, so they behave the same on any machine and never touch the real cache.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .sglang_server import SglangServer

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "tools" / "real-sglang-setup.sh"


def _stand_in(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)


def _run_setup(tmp_path: Path, arch: str, require: bool = False) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    _stand_in(bin_dir, "uname", f"echo {arch}")
    _stand_in(bin_dir, "python3.11", "exit 1")  # present, but knows of no pip find-links
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "LLM_VITALS_REQUIRE"))}
    env.update(
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        LLM_VITALS_SGLANG_CACHE=str(tmp_path / "cache"),
        PIP_FIND_LINKS=str(tmp_path / "no-wheels"),
    )
    if require:
        env["LLM_VITALS_REQUIRE_REAL_SGLANG"] = "1"
    return subprocess.run(["bash", str(SETUP)], env=env, check=False, capture_output=True, text=True, timeout=60)


def test_setup_skips_with_one_line_when_not_x86_64(tmp_path):
    result = _run_setup(tmp_path, "aarch64")
    assert result.returncode == 77, result.stderr
    assert result.stdout.splitlines() == [
        "SKIPPED: real-SGLang tier: needs x86-64, this machine is aarch64 (the CPU torch wheel here is x86-64)"
    ]
    assert not (tmp_path / "cache").exists(), "a skip must not start building anything"


def test_setup_skips_with_one_line_without_the_cpu_torch_wheel(tmp_path):
    result = _run_setup(tmp_path, "x86_64")
    assert result.returncode == 77, result.stderr
    (line,) = result.stdout.splitlines()
    assert line.startswith("SKIPPED: real-SGLang tier: the CPU torch wheel (torch==2.13.0+cpu) is not reachable")


def test_a_skip_is_a_failure_when_the_tier_is_required(tmp_path):
    result = _run_setup(tmp_path, "aarch64", require=True)
    assert result.returncode == 1
    assert "LLM_VITALS_REQUIRE_REAL_SGLANG=1 makes this a failure" in result.stderr


def test_the_server_command_uses_the_stand_in_friendly_flags_on_a_loopback_port():
    argv = SglangServer(port=4321).command()
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
