"""Quick checks of the real-llama.cpp tier's own tools; these run in the normal suite (no llama-server needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .freeze_thread import FreezeError, frozen_thread, thread_state
from .timing import exporter_config

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "tools" / "real-llamacpp-setup.sh"
REPORT_TOOL = REPO / "tools" / "real-llamacpp-report.py"


def test_freeze_stops_exactly_the_thread_then_lets_it_run_on():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with frozen_thread(sleeper.pid, max_seconds=30):
            assert thread_state(sleeper.pid, sleeper.pid) == "t"
        assert thread_state(sleeper.pid, sleeper.pid) in ("S", "R")
        assert sleeper.poll() is None, "the frozen process died"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_freeze_of_no_such_thread_is_a_clear_error():
    with pytest.raises(FreezeError, match="PTRACE_SEIZE"), frozen_thread(2**22 + 12345, max_seconds=5):
        pass


def test_setup_skips_with_one_line_without_a_compiler(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "sha256sum", "cut", "grep", "tr", "sort", "dirname", "cat"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        if found:
            (bin_dir / tool).symlink_to(found)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_VITALS_REQUIRE")}
    env.update(PATH=str(bin_dir), LLM_VITALS_CACHE_ROOT=str(tmp_path / "cache"))
    result = subprocess.run([str(bin_dir / "bash"), str(SETUP)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 77, result.stderr
    assert result.stdout.splitlines() == [
        "SKIPPED: real-llama.cpp tier: needs cmake to build llama-server (apt-get install cmake g++ make)"
    ]
    env["LLM_VITALS_REQUIRE_REAL_LLAMACPP"] = "1"
    required = subprocess.run([str(bin_dir / "bash"), str(SETUP)], env=env, capture_output=True, text=True, timeout=60)
    assert required.returncode == 1
    assert "makes this a failure" in required.stderr


def test_exporter_config_declares_a_llamacpp_target_the_exporter_accepts(tmp_path):
    from exporter.settings import load_settings

    path = tmp_path / "exporter.yaml"
    path.write_text(exporter_config(9999, "http://127.0.0.1:8080"))
    settings = load_settings(path)
    assert settings.targets[0].engine == "llamacpp"
    assert settings.metrics_timeout == 2.0


def test_report_tool_prints_a_row_per_drill(tmp_path):
    report = {
        "total_seconds": 90.0,
        "vllm": {"version": "llama.cpp 0c1e570", "slots": 2, "batch": 256, "starts": [{"seconds": 1.2, "pid": 1}]},
        "exporter": {"poll_interval": 1.0, "stuck_after": 6.0, "metrics_timeout": 2.0, "canary_interval": 3.0},
        "drills": [{"name": "frozen", "outcome": "passed", "seconds": 20.0,
                    "detection": {"what": "freeze to stuck", "seconds": 7.1}, "canaries": {"sent": 0, "by_result": {}},
                    "timeline": [[0, "busy"], [7.1, "stuck"], [9.0, "busy"]], "facts": {"stuck_reason": "no_progress"}}],
    }  # fmt: skip
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    out = subprocess.run([sys.executable, str(REPORT_TOOL), str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "== real-llama.cpp drills (llama.cpp 0c1e570; -np 2 -b 256" in out.stdout
    assert any(line.startswith("frozen") and "busy > stuck > busy" in line for line in out.stdout.splitlines())
