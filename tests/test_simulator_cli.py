"""`llm-vitals-sim` as a user runs it: --help, bad options, and a real fleet on free ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import httpx
from conftest import REPO, free_port

from llm_vitals.sim.cli import main


def once_up(process: subprocess.Popen[str], request: Callable[[], httpx.Response],
            timeout: float = 20.0) -> httpx.Response:
    """`request()`'s answer, retried while the simulator is still coming up (connection refused)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return request()
        except httpx.TransportError:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "the simulator did not come up"
            time.sleep(0.05)


def test_help_names_the_flags(capsys):
    try:
        main(["--help"])
    except SystemExit as exc:
        assert exc.code == 0
    out = capsys.readouterr().out
    for flag in ("--backends", "--proxy", "--control-port", "--max-num-seqs", "--max-num-batched-tokens",
                 "--tokens-per-second", "--startup-seconds", "--model", "--max-model-len"):
        assert flag in out


def test_bad_options_exit_2_with_a_clear_message(capsys):
    assert main(["--max-num-seqs", "0"]) == 2
    assert "--max-num-seqs" in capsys.readouterr().err
    assert main(["--backends", "0"]) == 2
    assert "--backends must be at least 1" in capsys.readouterr().err


def test_cli_runs_a_fleet_with_proxy_and_control_until_sigterm():
    port, proxy, control = free_port(), free_port(), free_port()
    command = [sys.executable, "-m", "llm_vitals.sim.cli", "--backends", "1", "--port", str(port), "--proxy", str(proxy),
               "--control-port", str(control), "--startup-seconds", "0.1"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert once_up(process, lambda: httpx.get(f"http://127.0.0.1:{proxy}/v1/models", timeout=2)).status_code == 200
        listing = httpx.get(f"http://127.0.0.1:{control}/backends", timeout=5).json()
        assert listing["backends"][0]["url"] == f"http://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=10)
    assert process.returncode == 0, err
    assert f"backend 0: http://127.0.0.1:{port}" in out and f"proxy:     http://127.0.0.1:{proxy}" in out


def test_single_backend_without_control_exits_0_when_its_engine_dies():
    port = free_port()
    command = [sys.executable, "-m", "llm_vitals.sim.cli", "--port", str(port), "--no-control"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        fault = f"http://127.0.0.1:{port}/admin/fault"
        assert once_up(process, lambda: httpx.post(fault, json={"fault": "die"}, timeout=2)).status_code == 200
        assert process.wait(timeout=10) == 0  # as vLLM's API server does when its EngineCore dies
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=5)
