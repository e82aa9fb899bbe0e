"""Quick checks of the real-Triton tier's own tools; these run in the normal suite (no Triton needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from llm_vitals.exporter.settings import parse_settings

from .drill_config import TARGET, exporter_config

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "tools" / "real-triton-setup.sh"


def _run_setup(tmp_path: Path, arch: str, require: bool = False) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "uname").write_text(f"#!/bin/sh\necho {arch}\n")
    (bin_dir / "uname").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_VITALS_REQUIRE")}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", LLM_VITALS_TRITON_VENV=str(tmp_path / "venv"))
    if require:
        env["LLM_VITALS_REQUIRE_REAL_TRITON"] = "1"
    return subprocess.run(["bash", str(SETUP)], env=env, check=False, capture_output=True, text=True, timeout=60)


def test_setup_skips_with_one_line_when_not_x86_64(tmp_path):
    result = _run_setup(tmp_path, "aarch64")
    assert result.returncode == 77, result.stderr
    assert result.stdout.splitlines() == [
        "SKIPPED: real-Triton tier: needs x86-64 Linux (nvidia-pytriton ships manylinux x86-64 wheels only), this is aarch64"
    ]
    assert not (tmp_path / "venv").exists(), "a skip must not start installing anything"


def test_setup_skip_is_a_failure_when_real_triton_is_required(tmp_path):
    result = _run_setup(tmp_path, "aarch64", require=True)
    assert result.returncode == 1 and result.stdout == ""
    assert "[LLM_VITALS_REQUIRE_REAL_TRITON=1 makes this a failure]" in result.stderr


def test_drills_are_not_collected_without_the_opt_in():
    env = {k: v for k, v in os.environ.items() if k != "LLM_VITALS_REAL_TRITON"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/real_triton"],
        cwd=REPO, env=env, check=False, capture_output=True, text=True, timeout=120,
    )
    assert "test_real_triton_drills.py" not in result.stdout
    assert "test_real_triton_tools.py" in result.stdout


def test_the_drills_exporter_config_is_a_valid_triton_target():
    settings = parse_settings(yaml.safe_load(exporter_config(9999, "http://127.0.0.1:1", "http://127.0.0.1:2/metrics")))
    (target,) = settings.targets
    assert (target.name, target.engine, target.model) == (TARGET, "triton", "toy_lm")
    assert target.sends_canary and str(target.metrics_url) == "http://127.0.0.1:2/metrics"
    assert target.canary.request == {"inputs": [{"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}


def test_a_tritonserver_that_died_by_itself_is_named_with_its_crash_lines(tmp_path):
    """The frozen worker's drill relaunches a Triton that crashed (its Python backend's own fault) and says why."""
    from .triton_server import TritonServer

    log = tmp_path / "triton.log"
    log.write_text(
        'I1203 23:08:35.005321 1428 model_lifecycle.cc:839] "successfully loaded \'toy_lm\'"\n'
        "Signal (11) received.\n"
        " 6# TRITONBACKEND_ModelInstanceExecute in libtriton_python.so\n"
        "terminate called after throwing an instance of 'boost::interprocess::lock_exception'\n"
        "  what():  boost::interprocess::lock_exception\n"
        "Triton Inference Server exited with failure. Please wait.\n"
    )
    server = TritonServer(http_port=1, grpc_port=2, metrics_port=3, starts=[{"seconds": 1.0, "pid": 0, "log": str(log)}])
    assert server.crash() == (
        "Signal (11) received.; terminate called after throwing an instance of 'boost::interprocess::lock_exception'; "
        "what():  boost::interprocess::lock_exception; Triton Inference Server exited with failure. Please wait."
    )
