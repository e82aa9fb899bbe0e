"""Quick checks of the real-llama.cpp tier's own tools; these run in the normal suite (no llama-server needed)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from .freeze_thread import FreezeError, frozen_thread, thread_state
from .load import long_generations, metrics
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
    for tool in ("bash", "sha256sum", "cut", "grep", "tr", "sort", "dirname", "cat", "uname"):
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
    from llm_vitals.exporter.settings import load_settings

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


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


def test_a_load_left_by_an_assertion_is_cancelled_its_connections_closed():
    """A failing drill must not leave its load running into the next one."""
    server = _listener()
    accepted: list[socket.socket] = []

    def accept() -> None:
        for _ in range(3):
            conn, _ = server.accept()
            accepted.append(conn)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    port = server.getsockname()[1]
    try:
        with pytest.raises(AssertionError, match="the drill failed"), long_generations(f"http://127.0.0.1:{port}", 3) as load:
            acceptor.join(timeout=10)
            assert len(accepted) == 3 and not load.done()
            raise AssertionError("the drill failed")
        assert load.done(), "a request of the load still runs"
        for conn in accepted:
            conn.settimeout(10)
            while conn.recv(65536):  # the request, then end of stream: the client closed its side
                pass
        assert [o.status for o in load.outcomes] == [None] * 3
    finally:
        for conn in accepted:
            conn.close()
        server.close()


def test_a_metrics_read_that_times_out_is_tried_again_until_one_answers():
    """Under saturation llama-server once took over 10 s to answer: one slow read is no failure."""
    server = _listener()
    page = b"# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n"
    held: list[socket.socket] = []

    def serve() -> None:
        first, _ = server.accept()  # accepted, never answered
        held.append(first)
        conn, _ = server.accept()
        conn.recv(65536)
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(page)
        conn.sendall(head + page)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        read = metrics(f"http://127.0.0.1:{server.getsockname()[1]}", within=20, timeout=0.5)
        assert read == {"llamacpp:requests_processing": 2.0}
        with pytest.raises(AssertionError, match="timed out after 1 s waiting for an answer from /metrics"):
            metrics(f"http://127.0.0.1:{server.getsockname()[1]}", within=1, timeout=0.3)
    finally:
        for conn in held:
            conn.close()
        server.close()
