"""Fault drills: the exporter (poll 1 s, stuck_after 10 s, `engine: sglang`) judged against a real SGLang.

The tests run in file order on one server and one exporter: idle canaries, saturation, a long
chunked prefill, a stopped detokenizer, a stopped scheduler, a killed scheduler, a restart on the
same port. Every wait polls for a condition with a bounded deadline. Each drill writes its detection
latency, verdict timeline and canary count to the report, and saves the real pages it saw under
`.cache/real-sglang-logs/pages/` (tests/fixtures/sglang/ keeps copies of such pages).
"""

from __future__ import annotations

import time
from collections import Counter

import httpx
from real_vllm.drill_report import Drill
from real_vllm.exporter_process import (
    CANARY_INTERVAL_S,
    CANARY_TIMEOUT_S,
    HTTP_TIMEOUT_S,
    POLL_INTERVAL_S,
    ExporterProcess,
    Watcher,
)

# The vLLM drills' helpers over exporter samples are engine-neutral.
from real_vllm.test_real_vllm_drills import canary_delta, detection_seconds, restarts_total, wait_idle

from .load import counter, generations, long_prompt, page, send, wait_engine_running
from .sglang_server import (
    CHUNKED_PREFILL_SIZE,
    DETOKENIZER,
    LIVENESS_BUDGET_S,
    LOG_DIR,
    MAX_RUNNING_REQUESTS,
    SCHEDULER,
    SERVED_MODEL,
    STUCK_AFTER_S,
    SglangServer,
)

PAGES = LOG_DIR / "pages"
IDLE_WINDOW_S = 15.0
# With --max-running-requests 2 the requests beyond two wait in SGLang's queue: ~10-20 s of load here.
SATURATION_REQUESTS = 4
SATURATION_TOKENS = 1000
QUEUED_LONGER_THAN = "1.0"  # a bucket bound of SGLang's queue_time_seconds histogram
# The fault drills keep the engine busy for up to a few minutes: 2 running, 1 queued.
FAULT_REQUESTS = 3
FAULT_TOKENS = 20000
# Sixteen chunks (the recipe, with 4096-token chunks on a quiet box: 12862 tokens in 3.8 s).
PREFILL_TOKENS = 16 * CHUNKED_PREFILL_SIZE - 100  # 8092
# SGLANG_HEALTH_CHECK_TIMEOUT (default 20 s): /health's own deadline for a frozen scheduler.
HEALTH_TIMEOUT_S = 20.0
DETECTION_SLACK_S = 1.0
FINISHED = "sglang:num_requests_total"


def save_page(name: str, text: str) -> None:
    """Keep a real page this drill saw (the fixtures are copied from these)."""
    PAGES.mkdir(parents=True, exist_ok=True)
    (PAGES / f"sglang-0.5.23-cpu-metrics-{name}.txt").write_text(text)


def probe(url: str, path: str, timeout: float) -> tuple[int | None, float]:
    """(status or None, seconds) of one GET."""
    began = time.monotonic()
    try:
        status = httpx.get(url + path, timeout=timeout).status_code
    except httpx.HTTPError:
        status = None
    return status, round(time.monotonic() - began, 1)


def test_engine_serves_the_tiny_model_and_its_metrics(sglang: SglangServer):
    """Smoke: the tier's server is a real SGLang with the families the adapter reads."""
    models = httpx.get(f"{sglang.url}/v1/models", timeout=20).json()
    assert [m["id"] for m in models["data"]] == [SERVED_MODEL]
    text = page(sglang.url)
    for family in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:realtime_tokens_total",
                   "sglang:cuda_graph_passes_total", "sglang:num_used_tokens", "sglang:http_requests_active"):
        assert family in text, family
    answer = httpx.post(
        f"{sglang.url}/v1/completions",
        json={"model": SERVED_MODEL, "prompt": "def", "max_tokens": 4, "ignore_eos": True},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 4


def test_idle_server_gets_canaries_at_the_configured_rate_each_answered(
    sglang: SglangServer, watcher: Watcher, drill: Drill
):
    wait_idle(watcher)
    finished_before = counter(sglang.url, FINISHED)
    before = watcher.latest()
    t0 = time.time()
    end = watcher.wait_for(lambda s: True, timeout=IDLE_WINDOW_S + 30, what="the end of the window", after=t0 + IDLE_WINDOW_S)
    finished_after = counter(sglang.url, FINISHED)
    after = watcher.wait_for(lambda s: True, timeout=30, what="a sample after the window", after=time.time())
    save_page("idle", page(sglang.url))

    window = [s for s in watcher.since(t0) if s.t <= end.t]
    delta = canary_delta(before, after)
    sent = sum(delta.values())
    expected = IDLE_WINDOW_S / CANARY_INTERVAL_S
    drill.timeline = watcher.timeline(t0)
    drill.canaries = {"sent": sent, "by_result": delta, "expected": expected}
    drill.detected("one canary every", (after.t - before.t) / sent if sent else float("inf"))
    drill.facts = {
        "window_s": round(after.t - before.t, 1),
        "num_requests_total_delta": finished_after - finished_before,
        "idle_fraction": round(sum(s.state == "idle" for s in window) / len(window), 2),
    }
    assert expected - 2 <= sent <= expected + 2, drill.canaries
    assert delta.get("ok", 0) == sent, f"an idle canary failed: {delta}"
    # Each canary is a real request SGLang answered: its own finished counter moved with them.
    assert abs(drill.facts["num_requests_total_delta"] - delta.get("ok", 0)) <= 1, drill.facts
    assert {s.state for s in window} <= {"idle", "busy"}, drill.timeline
    assert drill.facts["idle_fraction"] >= 0.7, drill.timeline
    assert all(s.ready == 200 and s.live == 200 for s in window), drill.timeline


def test_saturation_stays_busy_and_gets_zero_canaries(sglang: SglangServer, watcher: Watcher, drill: Drill):
    wait_idle(watcher)
    # Start right after an idle canary came back, so none is due while the load ramps up.
    base = watcher.latest()
    watcher.wait_for(
        lambda s: s.canaries_total > base.canaries_total,
        timeout=CANARY_INTERVAL_S + CANARY_TIMEOUT_S + 15,
        what="an idle canary before the load",
    )
    finished_before = counter(sglang.url, FINISHED)
    queued_before = _queued_longer_than(sglang.url)
    before = watcher.latest()
    t0 = time.time()
    load = send(sglang.url, generations(SATURATION_REQUESTS, SATURATION_TOKENS), SATURATION_REQUESTS)
    first_busy = watcher.wait_for(lambda s: s.state == "busy", timeout=30, what="busy", after=t0)
    drill.detected("load to busy", detection_seconds(first_busy, t0))
    wait_engine_running(sglang.url, load, at_least=MAX_RUNNING_REQUESTS + 1)
    save_page("busy", page(sglang.url))
    outcomes = load.wait(timeout=300)
    t_end = time.time()
    finished_after = counter(sglang.url, FINISHED)
    queued_after = _queued_longer_than(sglang.url)
    after = watcher.wait_for(lambda s: True, timeout=30, what="a sample after the load", after=time.time())

    window = [s for s in watcher.since(t0) if s.t <= t_end]
    states = [s.state for s in window]
    busy_at = [i for i, state in enumerate(states) if state == "busy"]
    during = window[busy_at[0] : busy_at[-1] + 1]
    drill.timeline = watcher.timeline(t0)
    drill.canaries = {"sent": sum(canary_delta(window[0], during[-1]).values()), "by_result": canary_delta(before, after)}
    drill.facts = {
        "load_seconds": round(t_end - t0, 1),
        "statuses": sorted({o.status for o in outcomes}, key=str),
        "max_waiting_seen": max((s.waiting or 0) for s in window),
        f"queued_over_{QUEUED_LONGER_THAN}s": queued_after - queued_before,
        "num_requests_total_delta": finished_after - finished_before,
        "canaries_around_load": sum(canary_delta(before, after).values()),
    }
    assert all(o.status == 200 for o in outcomes), [o.body for o in outcomes if o.status != 200]
    # Saturation shown by SGLang's own queue-time histogram (a sampled gauge can be missed).
    assert drill.facts[f"queued_over_{QUEUED_LONGER_THAN}s"] >= 1, f"the load never queued ({drill.facts})"
    assert set(states) <= {"idle", "busy"}, drill.timeline
    assert all(s.state == "busy" for s in during), drill.timeline
    assert drill.canaries["sent"] == 0, drill.canaries
    extra = finished_after - finished_before - SATURATION_REQUESTS
    assert 0 <= extra <= drill.facts["canaries_around_load"] <= 1, drill.facts


def test_prefill_of_a_long_prompt_is_busy_never_idle_and_gets_no_canary(
    sglang: SglangServer, watcher: Watcher, drill: Drill
):
    """While SGLang chunks a long prompt, running and queued read 0: the other signs must say busy."""
    wait_idle(watcher)
    base = watcher.latest()
    watcher.wait_for(
        lambda s: s.canaries_total > base.canaries_total,
        timeout=CANARY_INTERVAL_S + CANARY_TIMEOUT_S + 15,
        what="an idle canary before the prompt",
    )
    before = watcher.latest()
    chunks_before = counter(sglang.url, "sglang:realtime_tokens_total", {"mode": "prefill_compute"})
    t0 = time.time()
    load = send(sglang.url, [long_prompt(PREFILL_TOKENS)], 1)
    mid_pages: list[dict] = []
    while not load.done():
        read_at = time.time()
        text = page(sglang.url)
        used = _sample(text, "sglang:num_used_tokens")
        running = _sample(text, "sglang:num_running_reqs") + _sample(text, "sglang:num_queue_reqs")
        active = _sample(text, "sglang:http_requests_active", endpoint="/generate")
        mid_pages.append({"t": read_at, "used": used, "running_plus_queued": running, "active": active})
        if used > 0 and running == 0 and not any(p.get("saved") for p in mid_pages):
            save_page("prefill", text)
            mid_pages[-1]["saved"] = True
        time.sleep(0.5)
    outcomes = load.wait(timeout=300)
    t_end = time.time()
    after = watcher.wait_for(lambda s: True, timeout=30, what="a sample after the prompt", after=time.time())

    # The prompt's time on the server: up to the last direct read that still saw it in flight. Later
    # samples may rightly read idle (SGLang answered; our thread has not seen the answer yet).
    t_work_end = max((p["t"] for p in mid_pages if p["active"] >= 1), default=t0)
    window = [s for s in watcher.since(t0) if s.t <= t_work_end]
    drill.timeline = watcher.timeline(t0)
    in_window = canary_delta(before, window[-1]) if window else {}
    drill.canaries = {"sent": sum(in_window.values()), "by_result": canary_delta(before, after)}
    seen = next((i for i, s in enumerate(window) if s.state == "busy"), None)
    drill.facts = {
        "prompt_tokens": PREFILL_TOKENS,
        "prefill_seconds": round(t_end - t0, 1),
        "in_flight_seen_s": round(t_work_end - t0, 1),
        "chunks_tokens": counter(sglang.url, "sglang:realtime_tokens_total", {"mode": "prefill_compute"}) - chunks_before,
        "pages_with_running_0_and_used_tokens": sum(p["used"] > 0 and p["running_plus_queued"] == 0 for p in mid_pages),
        "max_stuck_seconds_seen": max((s.stuck_seconds or 0) for s in window) if window else None,
        "statuses": sorted({o.status for o in outcomes}, key=str),
    }
    assert all(o.status == 200 for o in outcomes), [o.body for o in outcomes]
    # The trap this drill exists for: SGLang itself shows running 0 and queued 0 while it works.
    assert drill.facts["pages_with_running_0_and_used_tokens"] >= 1, mid_pages
    assert seen is not None, f"never busy during a {drill.facts['prefill_seconds']} s prefill: {drill.timeline}"
    assert all(s.state == "busy" for s in window[seen:]), drill.timeline
    assert "stuck" not in {s.state for s in window}, drill.timeline
    assert drill.canaries["sent"] == 0, f"a canary was sent during the prefill: {drill.canaries}"


def test_detokenizer_stopped_keeps_the_engine_busy_and_health_green(
    sglang: SglangServer, watcher: Watcher, drill: Drill
):
    """A stopped detokenizer: the scheduler keeps stepping, so counters move; only clients stop getting text.

    Kept as a fact, not a fault the exporter can see: SGLang's own /health says 200 too (the recipe).
    """
    wait_idle(watcher)
    t0 = time.time()
    load = send(sglang.url, generations(FAULT_REQUESTS, FAULT_TOKENS), FAULT_REQUESTS)
    wait_engine_running(sglang.url, load)
    # The exporter's verdict lags SGLang by up to a poll: stop the detokenizer once it reads busy.
    watcher.wait_for(lambda s: s.state == "busy", timeout=30, what="busy", after=t0)
    detok = sglang.find(DETOKENIZER)
    t_stop = time.time()
    detok.suspend()
    try:
        stopped_for = 10.0
        watcher.wait_for(lambda s: True, timeout=stopped_for + 30, what="a sample", after=t_stop + stopped_for)
        save_page("detokenizer-sigstop", page(sglang.url))
        health = probe(sglang.url, "/health", timeout=HEALTH_TIMEOUT_S + 5)
    finally:
        t_cont = time.time()
        detok.resume()
    stopped = [s for s in watcher.since(t_stop) if s.t <= t_cont]
    sglang_abort(sglang, load)
    drill.timeline = watcher.timeline(t0)
    drill.facts = {"stopped_for_s": round(t_cont - t_stop, 1), "health_while_stopped": health,
                   "states_while_stopped": sorted({s.state for s in stopped})}
    assert {s.state for s in stopped} <= {"busy"}, drill.timeline


def test_hang_sigstop_scheduler_is_stuck_then_live_fails_then_recovers(
    sglang: SglangServer, exporter: ExporterProcess, watcher: Watcher, drill: Drill
):
    wait_idle(watcher)
    restarts_before = watcher.latest().restarts
    restarts_total_before = restarts_total(exporter)
    t0 = time.time()
    load = send(sglang.url, generations(FAULT_REQUESTS, FAULT_TOKENS), FAULT_REQUESTS)
    wait_engine_running(sglang.url, load, at_least=MAX_RUNNING_REQUESTS + 1)
    scheduler = sglang.find(SCHEDULER)
    t_stop = time.time()
    scheduler.suspend()  # SIGSTOP: /metrics keeps answering with frozen counters
    try:
        stuck = watcher.wait_for(
            lambda s: s.state == "stuck", timeout=STUCK_AFTER_S + 2 * POLL_INTERVAL_S + 30, what="stuck", after=t_stop
        )
        drill.detected("SIGSTOP to stuck", detection_seconds(stuck, t_stop))
        save_page("scheduler-sigstop", page(sglang.url))
        not_ready = watcher.wait_for(
            lambda s: s.state == "stuck" and s.ready != 200, timeout=15, what="ready 503 while stuck", after=t_stop
        )
        live_fail = watcher.wait_for(
            lambda s: s.live != 200, timeout=LIVENESS_BUDGET_S + 2 * POLL_INTERVAL_S + 30, what="live 503", after=t_stop
        )
        # SGLang's own /health: 503 once its 20 s deadline passes with the scheduler frozen.
        health = probe(sglang.url, "/health", timeout=HEALTH_TIMEOUT_S + 10)
    finally:
        t_cont = time.time()
        scheduler.resume()  # SIGCONT
    recovered = watcher.wait_for(
        lambda s: s.state in ("busy", "idle"), timeout=60, what="busy or idle after SIGCONT", after=t_cont
    )
    sglang_abort(sglang, load)
    after = wait_idle(watcher, timeout=90)

    hung = [s for s in watcher.since(t_stop) if s.t <= t_cont]
    drill.timeline = watcher.timeline(t0)
    drill.canaries = {"sent": sum(canary_delta(hung[0], hung[-1]).values()), "by_result": canary_delta(hung[0], after)}
    drill.facts = {
        "stuck_after": STUCK_AFTER_S,
        "stuck_detected_s": drill.detection["seconds"],
        "ready_false_s": round(not_ready.t - t_stop, 1),
        "live_false_s": round(live_fail.t - t_stop, 1),
        "liveness_budget": LIVENESS_BUDGET_S,
        "sglang_health_while_stopped": health,
        "stopped_for_s": round(t_cont - t_stop, 1),
        "recovered_s": round(recovered.t - t_cont, 1),
        "recovered_state": recovered.state,
        "restarts_delta": (after.restarts or 0) - (restarts_before or 0),
        "restarts_total_delta": restarts_total(exporter) - restarts_total_before,
    }
    assert drill.detection["seconds"] <= STUCK_AFTER_S + 2 * POLL_INTERVAL_S + DETECTION_SLACK_S, drill.facts
    assert live_fail.t - t_stop >= LIVENESS_BUDGET_S - POLL_INTERVAL_S - 0.5, drill.facts
    assert any(s.state == "stuck" and s.live == 200 for s in hung), "live failed as soon as stuck"
    seen = next(i for i, s in enumerate(hung) if s.state in ("busy", "stuck"))
    assert all(s.state in ("busy", "stuck") for s in hung[seen:]), drill.timeline
    assert canary_delta(hung[0], hung[-1]) == {r: 0.0 for r in hung[-1].canaries}, "canary sent to a hung busy server"
    assert health[0] == 503 and health[1] >= HEALTH_TIMEOUT_S - 1, f"SGLang's /health while frozen: {health}"
    assert drill.facts["restarts_delta"] == drill.facts["restarts_total_delta"] == 0, "SIGSTOP/SIGCONT is no restart"
    assert after.live == 200


def test_kill_scheduler_is_down_with_a_reason(sglang: SglangServer, watcher: Watcher, drill: Drill):
    wait_idle(watcher)
    t0 = time.time()
    load = send(sglang.url, generations(FAULT_REQUESTS, FAULT_TOKENS), FAULT_REQUESTS)
    wait_engine_running(sglang.url, load)
    scheduler = sglang.find(SCHEDULER)
    t_kill = time.time()
    scheduler.kill()  # SIGKILL
    # For ~0.5 s the launcher still serves /metrics from the dead scheduler's files: keep that page.
    try:
        save_page("after-sigkill-scheduler", httpx.get(f"{sglang.url}/metrics", timeout=1.0).text)
    except httpx.HTTPError:
        pass
    down = watcher.wait_for(lambda s: s.state == "down", timeout=60, what="down", after=t_kill)
    drill.detected("SIGKILL to down", detection_seconds(down, t_kill))
    # The launcher notices, waits 5 s "before crash diagnostics" and kills its whole tree.
    launcher_status = sglang.wait_exit(timeout=60)
    outcomes = load.wait(timeout=60)
    still_down = watcher.wait_for(lambda s: True, timeout=30, what="a later sample", after=time.time() + 3)

    drill.timeline = watcher.timeline(t0)
    samples = watcher.since(t0)
    drill.canaries = {"sent": sum(canary_delta(samples[0], samples[-1]).values()),
                      "by_result": canary_delta(samples[0], samples[-1])}
    drill.facts = {
        "reason": down.reason,
        "launcher_exit_status": launcher_status,
        "in_flight_statuses": dict(Counter(str(o.status) for o in outcomes)),
        "leftover_pids": [p.pid for p in sglang.leftovers()],
    }
    sglang.stop()  # whatever is left, by PID
    assert down.reason, "down without a reason"
    assert still_down.state == "down", drill.timeline
    assert launcher_status is not None, "the launcher outlived its scheduler by a minute"
    assert all(o.status != 200 for o in outcomes), drill.facts


def test_restart_on_the_same_port_counts_one_restart_then_idle_and_canary_ok(
    sglang: SglangServer, exporter: ExporterProcess, watcher: Watcher, drill: Drill
):
    if sglang.returncode is None:  # the kill drill did not take it down: stop it cleanly first
        sglang.stop()
    before = watcher.wait_for(lambda s: s.state == "down", timeout=60, what="down before the restart", after=time.time())
    restarts_total_before = restarts_total(exporter)
    t_launch = time.time()
    startup_s = sglang.start()
    t_ready = time.time()
    save_page("restarted-idle", page(sglang.url))
    counted = watcher.wait_for(
        lambda s: (s.restarts or 0) > (before.restarts or 0), timeout=60, what="a restart counted", after=t_launch
    )
    drill.detected("ready to restart counted", max(0.0, counted.t - t_ready))
    idle = watcher.wait_for(lambda s: s.state == "idle", timeout=60, what="idle after the restart", after=t_ready)
    ok = watcher.wait_for(
        lambda s: s.canaries.get("ok", 0) > before.canaries.get("ok", 0),
        timeout=CANARY_INTERVAL_S + CANARY_TIMEOUT_S + 30,
        what="a successful canary after the restart",
        after=t_ready,
    )
    later = watcher.wait_for(lambda s: True, timeout=30, what="a later sample", after=time.time() + 3 * POLL_INTERVAL_S)

    drill.timeline = watcher.timeline(t_launch)
    drill.canaries = {"sent": sum(canary_delta(before, later).values()), "by_result": canary_delta(before, later)}
    drill.facts = {
        "startup_seconds": startup_s,
        "restarts_before": before.restarts,
        "restarts_after": later.restarts,
        "idle_after_ready_s": round(idle.t - t_ready, 1),
        "canary_ok_after_ready_s": round(ok.t - t_ready, 1),
    }
    drill.facts["restarts_total_delta"] = restarts_total(exporter) - restarts_total_before
    assert (later.restarts or 0) - (before.restarts or 0) == 1, drill.facts
    assert drill.facts["restarts_total_delta"] == 1, "llm_vitals_restarts_total disagrees with the API"
    assert later.state == "idle", drill.timeline
    assert canary_delta(before, later).get("error", 0) == 0


def sglang_abort(sglang: SglangServer, load) -> None:
    """End the drill's long requests at once: SGLang's /abort_request with abort_all."""
    httpx.post(f"{sglang.url}/abort_request", json={"rid": "", "abort_all": True}, timeout=HTTP_TIMEOUT_S)
    load.wait(timeout=120)


def _queued_longer_than(url: str) -> float:
    family = "sglang:queue_time_seconds"
    return counter(url, f"{family}_count") - counter(url, f"{family}_bucket", {"le": QUEUED_LONGER_THAN})


def _sample(text: str, name: str, **labels: str) -> float:
    """Sum of one sample over its label sets (those carrying `labels`) in a page already read."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and labels.items() <= s.labels.items())
