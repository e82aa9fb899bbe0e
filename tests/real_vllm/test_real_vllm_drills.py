"""Fault drills: the exporter (poll 1 s, stuck_after 6 s) judged against a real vLLM engine.

The drills are the kit's (tests/real_engine/drills.py), run with this tier's engine (engine.py), in
file order on one server and one exporter: smoke, saturation, long prompts, hang, the hang through a
flaky proxy (a second exporter), the API server stopped whole, a slow /metrics through a proxy (a
second exporter), a pause on purpose (issue 38) and a hang right after it, kill, restart (on
the same port), idle, and this engine's own: kill of the Worker while the API server answers.
"""

from __future__ import annotations

import time
from collections import Counter

import httpx
from real_engine import drills
from real_engine.engine import Kit
from real_engine.harness import HTTP_TIMEOUT_S, canaries, detection_seconds
from real_engine.load import Load
from real_engine.report import Drill

from .engine import COMPLETIONS, FAULT_LOAD_MAX_S, GENERATION_TOKENS, generation
from .vllm_server import SERVED_MODEL, VllmServer


def test_smoke_engine_serves_the_tiny_model_and_its_metrics(kit: Kit, drill: Drill):
    """`vllm serve` lists the tiny model, has the families the exporter reads, and completes 4 tokens."""
    drills.smoke(kit, drill)


def test_saturation_stays_busy_and_gets_zero_canaries(kit: Kit, drill: Drill):
    """12 generations on --max-num-seqs 2: vLLM's own queue-time histogram shows them queued."""
    drills.saturation(kit, drill)


def test_long_prompts_near_max_model_len_are_busy_never_stuck(kit: Kit, drill: Drill):
    """8 clients of 1000-token prompts for 12 s (twice stuck_after); between requests idle is fine."""
    drills.long_prompts(kit, drill)


def test_hang_sigstop_enginecore_is_stuck_then_live_fails_then_recovers(kit: Kit, drill: Drill):
    """SIGSTOP of `VLLM::EngineCore` with work pending on its frozen page: /metrics keeps answering, frozen."""
    drills.hang(kit, drill)


def test_flaky_reads_one_in_three_timing_out_still_stuck_within_stuck_after_and_two_polls(kit: Kit, drill: Drill):
    """The hang again, through a proxy that holds every third /metrics read past the timeout (issue 23): stuck, never down."""
    drills.flaky_reads(kit, drill)


def test_frozen_whole_api_server_sigstopped_under_load_is_restartable_and_unlive_never_down(kit: Kit, drill: Drill):
    """SIGSTOP of the API server under load (issue 29): /metrics and /health accepted and never answered.
    `stuck` / `metrics_unanswered` within down_after + 2 polls, /live failing within down_after + the
    liveness budget + 2 polls; never `down`. SIGCONT: busy or idle again, no restart counted."""
    drills.frozen_whole(kit, drill)


def test_slow_metrics_through_the_proxy_is_never_unready_nor_restartable(kit: Kit, drill: Drill):
    """Every /metrics read 11 s and more through a proxy, at the default 10 s timeout, under load, for 90 s
    (issue 29's 3 minutes, shortened for the tier's time budget): busy and ready throughout, never restartable."""
    drills.slow_metrics(kit, drill)


PAUSE_CLIENTS = 6


def test_pause_keep_under_load_is_paused_never_restartable_pages_past_pause_budget_then_a_hang_is_restartable(
        kit: Kit, drill: Drill):
    """Issue 38 (VLLM_SERVER_DEV_MODE=1): `POST /pause?mode=keep` under 6 clients for 3 x stuck_after and past the
    scaled pause_budget: paused, never restartable, no canary, paused_too_long (LLMServerPausedTooLong's
    condition), no restart; busy after `/resume`; then a SIGSTOP of EngineCore under the same load: stuck, and
    /live failing within stuck_after + the liveness budget + 3 polls."""
    server, watcher, settings = kit.server, kit.watcher, kit.engine.exporter
    assert settings.pause_budget is not None
    kit.wait_idle()
    restarts_before = kit.exporter.restarts_total()
    body = generation(GENERATION_TOKENS)
    t0 = time.time()
    with Load.sustained(server.url, COMPLETIONS, lambda _n: body, PAUSE_CLIENTS, max_seconds=FAULT_LOAD_MAX_S) as load, \
            httpx.Client(timeout=HTTP_TIMEOUT_S) as client:
        kit.wait_working(load)
        watcher.wait_for(lambda s: s.state == "busy" and s.reason == "progress", timeout=60, what="busy", after=t0)
        answer = client.post(f"{server.url}/pause", params={"mode": "keep"})
        t_pause = time.time()
        assert (answer.status_code, answer.json()) == (200, {"status": "paused"}), answer.text
        paused = watcher.wait_for(lambda s: s.state == "paused", timeout=settings.stuck_after + 30, what="paused",
                                  after=t_pause)
        too_long = watcher.wait_for(lambda s: bool(s.paused_too_long), timeout=paused.t - t_pause + settings.pause_budget + 30,
                                    what="paused_too_long", after=paused.t + settings.pause_budget)
        held_until = watcher.wait_for(lambda s: True, timeout=60, what="3 x stuck_after paused",
                                      after=max(too_long.t, t_pause + 3 * settings.stuck_after)).t
        is_paused = client.get(f"{server.url}/is_paused").json()
        answer = client.post(f"{server.url}/resume")
        t_resume = time.time()
        assert (answer.status_code, answer.json()) == (200, {"status": "resumed"}), answer.text
        busy = watcher.wait_for(lambda s: s.state == "busy" and s.reason == "progress", timeout=30, what="busy after /resume",
                                after=t_resume)
        held = [s for s in watcher.since(t_pause) if s.t <= held_until]
        # The engine's own freeze: it SIGSTOPs EngineCore only once its frozen page shows work pending (in
        # CI the six clients' requests, released together by /resume, once all ended just before the
        # SIGSTOP: the frozen page read 0 running, 0 waiting, rightly idle, then unresponsive).
        with kit.engine.freeze_engine(kit, load) as fault:
            stuck = watcher.wait_for(lambda s: s.state == "stuck", timeout=settings.stuck_after + 30, what="stuck",
                                     after=fault.t)
            live_fail = watcher.wait_for(lambda s: s.live != 200, timeout=settings.liveness + 30, what="live 503",
                                         after=fault.t)
            load.stop()
        outcomes = load.wait(timeout=120)
    after = kit.wait_idle()
    bound = settings.stuck_after + settings.liveness + 3 * settings.poll_interval + drills.DETECTION_SLACK_S
    drill.timeline = watcher.timeline(t0)
    drill.canaries = canaries(held[0], held[-1])
    drill.detected("/pause to paused", detection_seconds(paused, t_pause))
    drill.facts = {
        "clients": PAUSE_CLIENTS,
        "stuck_after": settings.stuck_after,
        "pause_budget": settings.pause_budget,
        "paused_for_s": round(t_resume - t_pause, 1),
        "states_while_paused": dict(Counter(str(s.state) for s in held)),
        "is_paused_answer": is_paused,
        "paused_too_long_s": round(too_long.t - t_pause, 1),
        "busy_after_resume_s": round(busy.t - t_resume, 1),
        **fault.facts,
        "sigstop_to_stuck_s": round(stuck.t - fault.t, 1),
        "sigstop_to_live_503_s": round(live_fail.t - fault.t, 1),
        "restartable_bound_s": bound,
        "restarts_total_delta": kit.exporter.restarts_total() - restarts_before,
        "statuses": dict(Counter(str(o.status) for o in outcomes)),
    }
    assert held_until - t_pause >= 3 * settings.stuck_after, drill.facts
    # Idle only where the engine's own page read nothing pending: a pause that lands as the clients'
    # requests end and the next go in reads 0 running, 0 waiting (a paused vLLM takes no step, so its
    # page keeps its last step's counts; CI once read it for 11 s). The route is asked a poll before each canary, so
    # at most the one canary whose ask went out just before the pause can go.
    idle_reads = [s for s in held if s.state == "idle"]
    assert set(drill.facts["states_while_paused"]) <= {"busy", "paused", "idle"}, drill.timeline
    assert all(s.running == 0 and s.waiting == 0 for s in idle_reads), drill.timeline
    assert all(s.live == 200 for s in held), drill.timeline
    assert is_paused == {"is_paused": True}, drill.facts
    assert drill.canaries["sent"] <= (1 if idle_reads else 0), drill.canaries
    assert stuck.reason == "no_progress", stuck
    assert drill.facts["sigstop_to_live_503_s"] <= bound, drill.facts
    assert drill.facts["restarts_total_delta"] == 0 and after.restarts == paused.restarts, drill.facts
    assert all(o.status == 200 for o in outcomes), drill.facts["statuses"]


def test_kill_enginecore_is_down_with_a_reason(kit: Kit, drill: Drill):
    """SIGKILL of `VLLM::EngineCore`: in-flight requests get 500, the API server exits 0, the Worker by itself."""
    drills.kill(kit, drill)


def test_restart_on_the_same_port_counts_one_restart_then_idle_and_canary_ok(kit: Kit, drill: Drill):
    """A new `vllm serve` (kept alive on engine death, for kill_worker), its preflight, one restart counted."""
    drills.restart(kit, drill)


def test_idle_server_gets_canaries_at_the_configured_rate_each_answered(kit: Kit, drill: Drill):
    """Every canary moves vLLM's own `request_success_total`."""
    drills.idle(kit, drill)


def test_kill_worker_while_the_api_server_answers_is_down_health_503(kit: Kit, drill: Drill):
    """SIGKILL of `VLLM::Worker` under load (the process that runs the model; issue 11's SIGILL killed it
    at a request in flight): vLLM's own drill.

    The API server was started with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 (the restart drill): it keeps
    answering, /health with 503 and /v1/models and /metrics with 200 and the gauges frozen. Without
    that setting it exits within ~1 s and /health's 503 lasts ~0.5 s, too short for a 1 s poll.
    Under load on purpose: the exporter reads /health only when work is pending and nothing moves.
    Killed while idle (measured once) the exporter said `unresponsive` / `canary_failed` instead,
    after three failed canaries, since /metrics then shows nothing pending.
    """
    server, watcher, settings = kit.server, kit.watcher, kit.engine.exporter
    assert isinstance(server, VllmServer)
    assert server.starts and server.starts[-1]["keep_alive_on_engine_death"], "the restart drill did not run"
    t0, t_kill, load = drills.kill_under_load(kit, lambda srv: srv.find("VLLM::Worker"))
    with load:
        down = watcher.wait_for(lambda s: s.state == "down", timeout=settings.stuck_after + 2 * settings.poll_interval + 30,
                                what="down", after=t_kill)
        drill.detected("SIGKILL Worker to down", detection_seconds(down, t_kill))
        outcomes = load.wait(timeout=120)
    later = kit.later(3 * settings.poll_interval)
    with httpx.Client(timeout=HTTP_TIMEOUT_S) as client:
        statuses = {path: client.get(f"{server.url}{path}").status_code for path in ("/health", "/v1/models", "/metrics")}
        body = {"model": SERVED_MODEL, "prompt": "def", "max_tokens": 2}
        statuses["completion"] = client.post(f"{server.url}/v1/completions", json=body).status_code

    samples = watcher.since(t0)
    drill.timeline = watcher.timeline(t0)
    drill.canaries = canaries(samples[0], samples[-1])
    drill.facts = {
        "reason": down.reason,
        "killed_after_load_start_s": round(t_kill - t0, 1),
        "in_flight_statuses": dict(Counter(str(o.status) for o in outcomes)),
        "state_later": later.state,
        "reason_later": later.reason,
        "ready_later": later.ready,
        "live_later": later.live,
        "vllm_statuses_later": statuses,
        "api_server_running": server.returncode is None,
        "vllm_said": server.death_line(),
        "checked_s_after_kill": round(time.time() - t_kill, 1),
    }
    assert down.reason == "health_503", drill.facts
    assert later.state == "down" and later.reason == "health_503", drill.timeline
    assert drill.facts["api_server_running"], "the API server exited: VLLM_KEEP_ALIVE_ON_ENGINE_DEATH had no effect"
    assert statuses == {"/health": 503, "/v1/models": 200, "/metrics": 200, "completion": 500}, statuses
    assert "Worker proc" in drill.facts["vllm_said"], drill.facts  # vLLM logs its exit code as -9 or None
