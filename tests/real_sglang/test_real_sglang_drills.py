"""Fault drills: the exporter (poll 1 s, stuck_after 10 s, `engine: sglang`) judged against a real SGLang.

The drills are the kit's (tests/real_engine/drills.py), run with this tier's engine (engine.py), in
file order on one server and one exporter: smoke, idle canaries, saturation, a long chunked prefill,
this engine's own stopped detokenizer, a pause on purpose (`/pause_generation`, issue 38), a stopped
scheduler, a killed scheduler, a restart on the same port. The real pages a run sees are kept in
`.cache/real-sglang/logs/pages/` (tests/fixtures/sglang/ keeps copies of such pages).
"""

from __future__ import annotations

import time
from collections import Counter

import httpx
from real_engine import drills
from real_engine.engine import Kit, Probe, sigstopped
from real_engine.harness import HTTP_TIMEOUT_S, canaries, detection_seconds
from real_engine.report import Drill

from .engine import ENGINE, HEALTH_TIMEOUT_S
from .sglang_server import DETOKENIZER


def test_smoke_engine_serves_the_tiny_model_and_its_metrics(kit: Kit, drill: Drill):
    """SGLang lists the tiny model, has the families the adapter reads, and completes 4 tokens."""
    drills.smoke(kit, drill)


def test_idle_server_gets_canaries_at_the_configured_rate_each_answered(kit: Kit, drill: Drill):
    """Every canary moves SGLang's own `num_requests_total`."""
    drills.idle(kit, drill)


def test_saturation_stays_busy_and_gets_zero_canaries(kit: Kit, drill: Drill):
    """4 generations on --max-running-requests 2: SGLang's queue-time histogram shows them queued."""
    drills.saturation(kit, drill)


def test_prefill_of_a_long_prompt_is_busy_never_idle_and_gets_no_canary(kit: Kit, drill: Drill):
    """While SGLang chunks an 8k-token prompt, running and queued read 0: the other signs must say busy."""
    drills.long_prompts(kit, drill)


def test_detokenizer_stopped_keeps_the_engine_busy_and_health_green(kit: Kit, drill: Drill):
    """A stopped detokenizer: the scheduler keeps stepping, so counters move; only clients stop getting text.

    SGLang's own drill, kept as a fact, not a fault the exporter can see: SGLang's own /health says
    200 too (the recipe).
    """
    watcher = kit.watcher
    kit.wait_idle()
    t0 = time.time()
    with ENGINE.fault_load(kit.server) as load:
        kit.wait_working(load)
        # The exporter's verdict lags SGLang by up to a poll: stop the detokenizer once it reads busy.
        watcher.wait_for(lambda s: s.state == "busy", timeout=30, what="busy", after=t0)
        with sigstopped(kit.server.find(DETOKENIZER)) as fault:
            stopped_for = 10.0
            watcher.wait_for(lambda s: True, timeout=stopped_for + 30, what="a sample", after=fault.t + stopped_for)
            kit.save_page("detokenizer-sigstop")
            health = kit.probe(Probe(("/health",), 200, timeout=HEALTH_TIMEOUT_S + 5))
            t_cont = time.time()
        stopped = [s for s in watcher.since(fault.t) if s.t <= t_cont]
        ENGINE.finish_load(kit, load)
    drill.timeline = watcher.timeline(t0)
    drill.facts = {"stopped_for_s": round(t_cont - fault.t, 1), "health_while_stopped": health,
                   "states_while_stopped": sorted({str(s.state) for s in stopped})}
    assert {s.state for s in stopped} <= {"busy"}, drill.timeline


def test_pause_generation_in_place_under_load_is_paused_never_restartable_then_busy(kit: Kit, drill: Drill):
    """Issue 38: `POST /pause_generation` (mode in_place, a weight sync that keeps the running requests) under
    load for 3 x stuck_after: the scheduler stops before it batches and its page freezes as a hung one's; `GET
    /ready` answers 503, so the exporter reads `paused`, never restartable, no canary, no restart; busy again
    after `/continue_generation`."""
    watcher, settings, url = kit.watcher, ENGINE.exporter, kit.server.url
    kit.wait_idle()
    restarts_before = kit.exporter.restarts_total()
    t0 = time.time()
    with ENGINE.fault_load(kit.server) as load, httpx.Client(timeout=HTTP_TIMEOUT_S) as client:
        kit.wait_working(load)
        watcher.wait_for(lambda s: s.state == "busy", timeout=30, what="busy", after=t0)
        answer = client.post(f"{url}/pause_generation", json={"mode": "in_place"})
        t_pause = time.time()
        assert answer.status_code == 200, answer.text
        paused = watcher.wait_for(lambda s: s.state == "paused", timeout=settings.stuck_after + 30, what="paused",
                                  after=t_pause)
        until = watcher.wait_for(lambda s: True, timeout=60, what="3 x stuck_after paused",
                                 after=t_pause + 3 * settings.stuck_after).t
        ready = client.get(f"{url}/ready").status_code
        answer = client.post(f"{url}/continue_generation", json={})
        t_continue = time.time()
        assert answer.status_code == 200, answer.text
        busy = watcher.wait_for(lambda s: s.state == "busy" and s.reason == "progress", timeout=30,
                                what="busy after /continue_generation", after=t_continue)
        ENGINE.finish_load(kit, load)
    held = [s for s in watcher.since(t_pause) if s.t <= until]
    drill.timeline = watcher.timeline(t0)
    drill.canaries = canaries(held[0], held[-1])
    drill.detected("/pause_generation to paused", detection_seconds(paused, t_pause))
    drill.facts = {"paused_for_s": round(t_continue - t_pause, 1), "ready_while_paused": ready,
                   "states_while_paused": dict(Counter(str(s.state) for s in held)),
                   "busy_after_continue_s": round(busy.t - t_continue, 1),
                   "restarts_total_delta": kit.exporter.restarts_total() - restarts_before}
    assert ready == 503, drill.facts
    assert set(drill.facts["states_while_paused"]) <= {"busy", "paused"}, drill.timeline
    assert all(s.live == 200 for s in held), drill.timeline
    assert drill.canaries["sent"] == 0 and drill.facts["restarts_total_delta"] == 0, drill.facts


def test_hang_sigstop_scheduler_is_stuck_then_live_fails_then_recovers(kit: Kit, drill: Drill):
    """SIGSTOP of `sglang::scheduler` (2 running, 1 queued): /metrics answers in ~10 ms, frozen; /health 503 after 20 s."""
    drills.hang(kit, drill)


def test_kill_scheduler_is_down_with_a_reason(kit: Kit, drill: Drill):
    """SIGKILL of `sglang::scheduler`: the launcher kills its whole tree ~6 s later; in-flight requests get no answer."""
    drills.kill(kit, drill)


def test_restart_on_the_same_port_counts_one_restart_then_idle_and_canary_ok(kit: Kit, drill: Drill):
    """A new SGLang (no start-time metric): the counter reset is the restart, counted once."""
    drills.restart(kit, drill)
