"""Fault drills: the exporter (poll 1 s, stuck_after 6 s, metrics_timeout 2 s) judged against a real llama-server.

The drills are the kit's (tests/real_engine/drills.py), run with this tier's engine (engine.py), in
file order on one server and one exporter: smoke, idle canaries, saturation, the engine loop frozen
with ptrace (HTTP alive), the same through a flaky proxy (a second exporter), the whole process
SIGSTOPped, kill, restart on the same port; then, on a server and an exporter of its own, HTTP threads held
by the clients at the shipped timings (issue 38). Loads are long generations that run until the drill
cancels them; the pages each drill saw are kept in `.cache/real-llamacpp/logs/pages/`.
"""

from __future__ import annotations

from real_engine import drills
from real_engine.engine import Kit
from real_engine.harness import ExporterProcess, Watcher
from real_engine.launcher import free_port
from real_engine.report import Drill

from . import starved
from .llamacpp_server import LlamaServer


def test_smoke_server_serves_the_tiny_model_and_its_metrics(kit: Kit, drill: Drill):
    """llama-server lists the GGUF's alias, has the families read, the restart header, and completes 8 tokens."""
    drills.smoke(kit, drill)


def test_idle_server_gets_canaries_at_the_configured_rate_each_answered(kit: Kit, drill: Drill):
    """Each canary runs at least one decode call: llama.cpp's own `n_decode_total` moves with them."""
    drills.idle(kit, drill)


def test_saturation_stays_busy_and_gets_zero_canaries(kit: Kit, drill: Drill):
    """8 long generations on 2 slots, held 15 s: decodes move throughout, the token counters only at request end."""
    drills.saturation(kit, drill)


def test_frozen_engine_loop_with_http_alive_is_stuck_then_recovers(kit: Kit, drill: Drill):
    """The engine loop (main thread) ptrace-stopped: /health stays 200, /metrics frozen or unanswered."""
    drills.hang(kit, drill)


def test_flaky_reads_one_in_three_timing_out_still_stuck_within_stuck_after_and_two_polls(kit: Kit, drill: Drill):
    """The frozen loop again, through a proxy that holds every third /metrics read past the timeout (issue 23): stuck, never down."""
    drills.flaky_reads(kit, drill)


def test_sigstop_metrics_accepted_never_answered_is_stuck_metrics_unanswered(kit: Kit, drill: Drill):
    """The whole process SIGSTOPped: /metrics accepted and never answered, `stuck`, never `down`."""
    drills.unanswered(kit, drill)


def test_kill_is_down_with_a_reason(kit: Kit, drill: Drill):
    """SIGKILL: connection refused at once (`down` / `connect`), exit -9, in-flight requests lose their connection."""
    drills.kill(kit, drill)


def test_restart_on_the_same_port_counts_exactly_one_restart_then_idle_and_canary_ok(kit: Kit, drill: Drill):
    """A new llama-server: every counter resets and the Process-Start-Time-Unix header changes; one restart."""
    drills.restart(kit, drill)


def test_starved_http_threads_at_the_shipped_timings_never_stuck_then_sigstop_is_stuck(engine, built, drill: Drill):
    """Issue 38: `--threads-http 2` under 6 clients, judged at the shipped timings (stuck_after, down_after, poll,
    metrics_timeout), read busy, never stuck nor down, for 3 minutes; then SIGSTOPped under the same load: stuck
    (`metrics_unanswered`) within stuck_after and two unanswered polls. A server and an exporter of its own."""
    settings = starved.shipped_exporter()
    server = LlamaServer(port=free_port(), log_dir=engine.log_dir, http_threads=starved.HTTP_THREADS)
    exporter = ExporterProcess(settings, server.url, engine.log_dir)
    try:
        engine.start(server)
        exporter.start()
        with Watcher(exporter) as watcher:
            drill.facts, stuck = starved.run(server, exporter, watcher)
            drill.timeline = watcher.timeline(drill.facts.pop("t0"))
        drill.detected("SIGSTOP to stuck", drill.facts["stuck_detected_s"])
    finally:
        exporter.stop()
        server.stop()
    assert set(drill.facts["polled_while_starved"]) == {"busy"}, drill.facts
    assert drill.facts["restarts_total_delta"] == 0, drill.facts
    assert stuck.reason == "metrics_unanswered", stuck
    assert drill.facts["stuck_floor_s"] <= drill.facts["stuck_detected_s"] <= drill.facts["stuck_bound_s"], drill.facts
