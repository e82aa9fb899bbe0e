"""Fault drills: the exporter (poll 1 s, stuck_after 10 s) judged against a real Triton 2.51.

The drills are the kit's (tests/real_engine/drills.py), run with this tier's engine (engine.py), in
file order on one server and one exporter: smoke, idle canaries, saturation, frozen worker (SIGSTOP
of the PyTriton Python process, HTTP alive), frozen tritonserver (every port accepts, none answers),
kill (SIGKILL of tritonserver), restart on the same ports. Triton's Python backend sometimes crashes
by itself after a frozen worker is resumed (TritonServer.crash): the drill records it and launches
Triton again so the drills after it run.
"""

from __future__ import annotations

from real_engine import drills
from real_engine.engine import Kit
from real_engine.report import Drill


def test_smoke_server_has_v2_routes_metrics_port_and_no_v1_models(kit: Kit, drill: Drill):
    """A real Triton: v2 health and infer, its own metrics port with the families read, no OpenAI route."""
    drills.smoke(kit, drill)


def test_idle_server_gets_v2_infer_canaries_at_the_configured_rate_each_answered(kit: Kit, drill: Drill):
    """Each canary is a real v2 infer Triton executed: its own success counter moves with them."""
    drills.idle(kit, drill)


def test_saturation_stays_busy_and_gets_zero_canaries(kit: Kit, drill: Drill):
    """8 clients on 2 instances: 6 queued while the load lasts, which the exporter must have read."""
    drills.saturation(kit, drill)


def test_frozen_worker_sigstop_is_stuck_within_stuck_after_plus_two_polls_then_recovers(kit: Kit, drill: Drill):
    """SIGSTOP of the PyTriton worker: HTTP and the metrics port stay alive, only the counters show it."""
    drills.hang(kit, drill)


def test_frozen_tritonserver_metrics_accepted_never_answered_is_stuck_metrics_unanswered(kit: Kit, drill: Drill):
    """SIGSTOP of tritonserver itself with requests queued: `stuck` / `metrics_unanswered`, never `down`."""
    drills.unanswered(kit, drill)


def test_kill_tritonserver_is_down_with_a_reason(kit: Kit, drill: Drill):
    """SIGKILL of tritonserver: in-flight requests fail at once, every port refuses."""
    drills.kill(kit, drill)


def test_restart_on_the_same_ports_counts_exactly_one_restart_then_idle_and_canary_ok(kit: Kit, drill: Drill):
    """A new Triton on the same three ports (no start-time metric): the counter reset is the restart, once."""
    drills.restart(kit, drill)
