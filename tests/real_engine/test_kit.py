"""Quick checks of the kit the real-engine tiers run on; these run in the normal suite (no engine needed).

The engines' descriptions are checked against what exists without them: their families against
real pages kept in tests/fixtures/, their exporter configs against the exporter's own parser, their
drill names against their test files. The launcher, the load, the report and the watcher's
timeline are checked on stand-ins: a small Python HTTP server, a socket that never answers.
"""

from __future__ import annotations

import ast
import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from real_llamacpp.engine import ENGINE as LLAMACPP
from real_sglang.engine import ENGINE as SGLANG
from real_triton.engine import ENGINE as TRITON
from real_vllm.engine import ENGINE as VLLM

from llm_vitals.exporter.settings import parse_settings
from real_engine import drills
from real_engine.engine import Engine, has_family, sigstopped, wait_until
from real_engine.harness import Sample, Watcher
from real_engine.launcher import ServerProcess, free_port
from real_engine.load import Load, Outcome, wait_page
from real_engine.report import Report

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
REPORT_TOOL = REPO / "tools" / "real-engine-report.py"
ENGINES = [VLLM, SGLANG, TRITON, LLAMACPP]
IDLE_PAGES = {
    "vllm": "vllm/vllm-0.32.0-cpu-metrics-idle.txt",
    "sglang": "sglang/sglang-0.5.23-cpu-metrics-idle.txt",
    "triton": "triton/triton-2.51.0-cpu-metrics-idle.txt",
    "llamacpp": "llamacpp/llamacpp-0c1e570-cpu-metrics-idle.txt",
}
by_key = pytest.mark.parametrize("engine", ENGINES, ids=[e.key for e in ENGINES])


@by_key
def test_the_families_the_smoke_drill_asks_for_stand_on_the_engines_real_idle_page(engine: Engine):
    page = (FIXTURES / IDLE_PAGES[engine.key]).read_text()
    assert engine.families
    assert [f for f in engine.families if not has_family(page, f)] == []


@pytest.mark.parametrize(
    ("page", "family", "stands"),
    [("a 1\n", "a", True), ('a{x="1"} 1\n', "a", True), ("# HELP a what\n# TYPE a gauge\n", "a", False),
     ("ab 1\n", "a", False), ("x 1\na_count 2\n", "a_count", True)],
)
def test_a_family_stands_only_as_a_sample_line(page, family, stands):
    assert has_family(page, family) is stands


@by_key
def test_the_exporter_accepts_the_config_each_engine_runs_with(engine: Engine):
    server = engine.launcher()
    settings = parse_settings(yaml.safe_load(engine.exporter.config(free_port(), server.url, **engine.target_keys(server))))
    (target,) = settings.targets
    want = engine.exporter
    assert (target.name, target.engine, target.stuck_after, target.liveness) == (want.target, want.engine, want.stuck_after,
                                                                                 want.liveness)
    assert settings.poll_interval == want.poll_interval and settings.metrics_timeout == want.metrics_timeout
    assert (target.canary.interval, target.canary.timeout) == (want.canary_interval, want.canary_timeout)
    assert target.sends_canary


def test_the_triton_target_reads_its_own_metrics_port_and_sends_a_v2_infer_canary():
    server = TRITON.launcher()
    settings = parse_settings(yaml.safe_load(TRITON.exporter.config(free_port(), server.url, **TRITON.target_keys(server))))
    (target,) = settings.targets
    assert (target.model, str(target.metrics_url)) == ("toy_lm", server.metrics_url)
    assert target.canary.request == {"inputs": [{"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}


@by_key
def test_every_drill_test_of_a_tier_is_filed_under_one_of_its_engines_drill_names(engine: Engine):
    """Else the report would file it under its whole test name, and the table would not line up."""
    path = REPO / "tests" / f"real_{engine.key}" / f"test_real_{engine.key}_drills.py"
    tests = [n.name.removeprefix("test_") for n in ast.parse(path.read_text()).body
             if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    filed = {t: next((d for d in engine.drills if t.startswith(d)), None) for t in tests}
    assert None not in filed.values(), filed
    assert sorted(filed.values()) == sorted(engine.drills), "a drill name with no test, or two tests under one name"


def _sample(t: float, state: str, ready: int = 200, live: int = 200) -> Sample:
    return Sample(t, state, state, 0, 0, None, 0, 0, ready, live, {"ok": 0.0})


def test_timeline_keeps_only_changes():
    watcher = Watcher(exporter=None)  # never started: only its samples are read
    watcher.samples = [
        _sample(100.0, "idle"),
        _sample(100.5, "busy"),
        _sample(101.0, "busy"),
        _sample(101.5, "busy"),
        _sample(107.0, "stuck", ready=503),
        _sample(112.0, "stuck", ready=503, live=503),
    ]
    assert [row[:2] + row[5:] for row in watcher.timeline(100.0)] == [
        [0.0, "idle", 200, 200],
        [0.5, "busy", 200, 200],
        [7.0, "stuck", 503, 200],
        [12.0, "stuck", 503, 503],
    ]
    assert watcher.period(100.0) == 0.5


def test_report_tool_prints_the_settings_the_starts_and_a_row_per_drill(tmp_path):
    report = Report(path=tmp_path / "report.json", engine="llamacpp", name="llama.cpp")
    report.server = {"version": "llama.cpp 0c1e570", "slots": 2, "batch": 256, "starts": [{"seconds": 1.25, "pid": 1}]}
    report.exporter = LLAMACPP.exporter.facts()
    hang = report.drill("frozen")
    hang.outcome, hang.seconds = "passed", 38.0
    hang.detected("freeze to stuck", 6.86)
    hang.canaries = {"sent": 0.0, "by_result": {"ok": 0.0}}
    hang.timeline = [[0.5, "idle"], [1.0, "busy"], [3.0, "busy"], [8.5, "stuck"], [15.0, "busy"]]
    hang.facts = {"stuck_reason": "no_progress"}
    report.drill("idle").outcome = "failed"
    report.write()

    result = subprocess.run([sys.executable, str(REPORT_TOOL), str(report.path)], check=False, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("== real-llama.cpp drills (llama.cpp 0c1e570; slots=2, batch=256; exporter stuck_after=6.0, ")
    assert "metrics_timeout=2.0" in lines[0] and "liveness_budget=12.0" in lines[0]
    assert lines[1] == "llama.cpp starts (to ready): 1.2 s (pid 1)"
    rows = {line.split()[0]: line for line in lines if line.split()}
    assert "freeze to stuck" in rows["frozen"] and "6.9" in rows["frozen"]
    assert "idle > busy > stuck > busy" in rows["frozen"]
    assert "failed" in rows["idle"]
    assert "  frozen: stuck_reason=no_progress" in lines
    assert json.loads(report.path.read_text())["llamacpp"]["slots"] == 2


def test_report_tool_says_when_there_is_no_report(tmp_path):
    result = subprocess.run([sys.executable, str(REPORT_TOOL), str(tmp_path / "missing.json")], check=False, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 1
    assert "cannot read" in result.stderr


class _StandIn(ThreadingHTTPServer):
    """Answers every POST with `status` after `delay` seconds, and counts the bodies it got; `in_flight` at most."""

    def __init__(self, status: int, delay: float = 0.0):
        self.status, self.delay, self.bodies, self.in_flight, self.most = status, delay, [], 0, 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.bodies.append(body)
                    server.in_flight += 1
                    server.most = max(server.most, server.in_flight)
                time.sleep(server.delay)
                with server.lock:
                    server.in_flight -= 1
                self.send_response(server.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def test_a_batch_sends_every_body_once_with_at_most_its_concurrency_in_flight():
    server = _StandIn(200, delay=0.05)
    try:
        outcomes = Load.batch(server.url, "/x", [{"n": n} for n in range(10)], concurrency=3).wait(timeout=30)
    finally:
        server.shutdown()
    assert sorted(b["n"] for b in server.bodies) == list(range(10))
    assert [o.status for o in outcomes] == [200] * 10
    assert server.most == 3


def test_sustained_load_keeps_sending_until_stopped_then_lets_the_requests_in_flight_end():
    server = _StandIn(200, delay=0.05)
    try:
        load = Load.sustained(server.url, "/x", lambda n: {"n": n}, concurrency=3, max_seconds=60)
        deadline = time.monotonic() + 10
        while len(server.bodies) < 12 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not load.done()
        load.stop()
        outcomes = load.wait(timeout=10)
    finally:
        server.shutdown()
    assert len(outcomes) == len(server.bodies) >= 12
    assert {o.status for o in outcomes} == {200}
    # Every body came from body_for, each number once.
    assert sorted(b["n"] for b in server.bodies) == list(range(len(server.bodies)))


def _sustained_until_done(status: int, max_seconds: float) -> tuple[list, list]:
    """Two clients against a stand-in that answers `status`: their outcomes and the bodies it got."""
    server = _StandIn(status)
    try:
        load = Load.sustained(server.url, "/x", lambda n: {"n": n}, concurrency=2, max_seconds=max_seconds)
        return load.wait(timeout=10), server.bodies
    finally:
        server.shutdown()


def test_sustained_load_client_stops_at_its_first_failure():
    outcomes, _bodies = _sustained_until_done(500, max_seconds=60)
    assert [o.status for o in outcomes] == [500, 500]


def test_sustained_load_sends_nothing_after_max_seconds():
    outcomes, bodies = _sustained_until_done(200, max_seconds=0)
    assert outcomes == [] and bodies == []


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
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    try:
        with pytest.raises(AssertionError, match="the drill failed"), Load.batch(url, "/x", [{}] * 3, concurrency=3) as load:
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


def test_a_page_read_that_times_out_is_tried_again_until_one_answers():
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
    url = f"http://127.0.0.1:{server.getsockname()[1]}/metrics"
    try:
        assert wait_page(url, lambda p: "processing 2" in p, timeout=20, what="an answer", read_timeout=0.5) == page.decode()
        with pytest.raises(AssertionError, match="timed out after 1 s waiting for an answer"):
            wait_page(url, lambda p: True, timeout=1, what="an answer", read_timeout=0.3)
    finally:
        for conn in held:
            conn.close()
        server.close()


SPAWNING_SERVER = """
import http.server, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


class _SpawningServer(ServerProcess):
    """A stand-in engine: serves HTTP, and has a child of its own (as an engine's scheduler is)."""

    def command(self) -> list[str]:
        return [sys.executable, "-c", SPAWNING_SERVER, str(self.port)]

    def ready(self, client: httpx.Client) -> bool:
        return client.get(self.url).status_code == 200 and len(self.leftovers()) == 2


def test_a_server_is_ready_found_frozen_and_stopped_with_every_process_it_spawned_by_pid(tmp_path):
    server = _SpawningServer(port=free_port(), log_dir=tmp_path, name="stand-in", niceness=None, ready_every_s=0.1)
    try:
        assert server.start() < 60
        (child,) = [p for p in server.leftovers() if p.pid != server.pid]
        assert server.starts == [{"seconds": server.starts[0]["seconds"], "pid": server.pid,
                                  "log": str(tmp_path / f"stand-in-{server.port}-1.log")}]
        with sigstopped(child) as fault:
            assert child.status() == psutil.STATUS_STOPPED and fault.what == "SIGSTOP"
        assert child.status() != psutil.STATUS_STOPPED
        name = child.name()
        child.kill()
        assert wait_until(lambda: child not in server.leftovers(), timeout=10) is not None  # a zombie counts as gone
        assert server.gone_titles() == [name]
    finally:
        server.stop()
    assert server.leftovers() == [] and server.returncode is not None


@pytest.mark.parametrize(("seconds", "waited"), [
    ([], 0),
    ([2.7, 2.7, 2.8, 2.9], 0),  # slots for all: nobody waited
    ([2.7, 2.7, 5.4, 5.5, 8.1, 8.2], 4),  # 6 at once on 2 slots: 4 waited a turn or two
    ([1.0, 1.9, 2.0], 1),
])
def test_clients_waited_counts_requests_that_took_twice_the_fastest(seconds, waited) -> None:
    assert drills.clients_waited([Outcome(200, s) for s in seconds] + [Outcome(None, 0.1)]) == waited
