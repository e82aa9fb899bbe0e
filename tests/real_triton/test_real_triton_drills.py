"""Fault drills: the exporter (poll 1 s, stuck_after 10 s) judged against a real Triton 2.51.

The tests run in file order on one server and one exporter: smoke, idle canaries, saturation,
frozen worker (SIGSTOP of the PyTriton Python process, HTTP alive), kill (SIGKILL of tritonserver),
restart on the same ports. Every wait polls a condition with a bounded deadline; each drill writes
its detection latency, verdict timeline and canary count to the report.
"""

from __future__ import annotations

import time
from collections import Counter

import httpx
from real_vllm.drill_report import Drill
from real_vllm.exporter_process import (
    ExporterProcess,
    Watcher,
    canary_delta,
    detection_seconds,
    restarts_total,
    wait_idle,
)
from real_vllm.load import engine_counter, start_load

from .drill_config import (
    CANARY_INTERVAL_S,
    CANARY_TIMEOUT_S,
    LIVENESS_BUDGET_S,
    METRICS_TIMEOUT_S,
    POLL_INTERVAL_S,
    STUCK_AFTER_S,
)
from .triton_server import INSTANCES, MODEL, TritonServer, infer_body

INFER = f"/v2/models/{MODEL}/infer"
# 8 clients in flight on 2 instances (max_batch_size 1): 6 queued as long as the load lasts, since
# each client sends its next request as soon as one returns. A 50-"token" request lasts ~1 s on any
# box (20 ms of wait a token, triton_server.TOY_TOKEN_SECONDS) and a few seconds when the niced
# server is starved, far below stuck_after, so completions keep coming while the queue is long:
# the saturation load lasts ~12 s (24 requests / 2 instances), a fault drill's up to ~20 s.
LOAD_TOKENS = 50
SATURATION_REQUESTS = 24
FAULT_REQUESTS = 40
CONCURRENCY = 8
IDLE_WINDOW_S = 15.0
DETECTION_SLACK_S = 1.0  # the exporter's own poll jitter on a loaded box, on top of stuck_after + 2 polls
# While the metrics port accepts and never answers, each poll lasts its timeout rather than one interval.
UNANSWERED_POLL_S = POLL_INTERVAL_S + METRICS_TIMEOUT_S
# prometheus-client's parser (engine_counter) names Triton's suffix-less counter samples `..._total`.
SUCCESS = "nv_inference_request_success_total"
PENDING = "nv_inference_pending_request_count"


def metrics_base(triton: TritonServer) -> str:
    return triton.metrics_url.removesuffix("/metrics")


def load(triton: TritonServer, requests: int):
    return start_load(triton.url, [infer_body(LOAD_TOKENS)] * requests, CONCURRENCY, path=INFER)


def wait_until(condition, timeout: float) -> float | None:
    """Seconds until `condition()` held (polled every 0.1 s), or None at the deadline."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if condition():
            return round(time.monotonic() - began, 2)
        time.sleep(0.1)
    return None


def wait_queued(triton: TritonServer, work, timeout: float = 60.0) -> float:
    """Wait until Triton itself shows requests queued (read directly, not through the exporter)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if work.done():
            raise AssertionError("the load finished before Triton was seen queueing it")
        queued = engine_counter(metrics_base(triton), PENDING)
        if queued > 0:
            return queued
        time.sleep(0.2)
    raise AssertionError(f"Triton showed no queued request within {timeout:.0f} s of the load")


def relaunch_if_crashed(triton: TritonServer, watcher: Watcher) -> str | None:
    """Launch Triton again when it died by itself (TritonServer.crash), so the drills after run; why it died."""
    crash = triton.crash()
    if crash is not None:
        triton.stop()
        triton.start()
        wait_idle(watcher)
    return crash


def test_smoke_server_has_v2_routes_metrics_port_and_no_v1_models(triton: TritonServer):
    """The tier's server is a real Triton: v2 health and infer, its own metrics port, no OpenAI route."""
    with httpx.Client(timeout=20) as client:
        for path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{MODEL}/ready"):
            assert client.get(triton.url + path).status_code == 200, path
        assert client.get(triton.url + "/v1/models").status_code == 404
        answer = client.post(triton.url + INFER, json=infer_body(3))
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [3]
        page = client.get(triton.metrics_url).text
    for family in (PENDING, "nv_inference_exec_count", "nv_inference_request_success", "nv_inference_request_failure",
                   "nv_inference_compute_infer_duration_us"):
        assert f"\n{family}{{" in page, family


def test_idle_server_gets_v2_infer_canaries_at_the_configured_rate_each_answered(
    triton: TritonServer, watcher: Watcher, drill: Drill
):
    wait_idle(watcher)
    success_before = engine_counter(metrics_base(triton), SUCCESS)
    before = watcher.latest()
    t0 = time.time()
    end = watcher.wait_for(lambda s: True, timeout=IDLE_WINDOW_S + 30, what="the end of the window", after=t0 + IDLE_WINDOW_S)
    success_after = engine_counter(metrics_base(triton), SUCCESS)
    after = watcher.wait_for(lambda s: True, timeout=30, what="a sample after the window", after=time.time())

    window = [s for s in watcher.since(t0) if s.t <= end.t]
    delta = canary_delta(before, after)
    sent = sum(delta.values())
    expected = IDLE_WINDOW_S / CANARY_INTERVAL_S
    drill.timeline = watcher.timeline(t0)
    drill.canaries = {"sent": sent, "by_result": delta, "expected": expected}
    drill.detected("one canary every", (after.t - before.t) / sent if sent else float("inf"))
    drill.facts = {
        "window_s": round(after.t - before.t, 1),
        "request_success_delta": success_after - success_before,
        "idle_fraction": round(sum(s.state == "idle" for s in window) / len(window), 2),
    }
    assert expected - 2 <= sent <= expected + 2, drill.canaries
    assert delta.get("ok", 0) == sent, f"an idle canary failed: {delta}"
    # Each canary is a real v2 infer Triton executed: its own success counter moved with them.
    assert abs(drill.facts["request_success_delta"] - delta.get("ok", 0)) <= 1, drill.facts
    assert {s.state for s in window} <= {"idle", "busy"}, drill.timeline
    assert drill.facts["idle_fraction"] >= 0.7, drill.timeline
    assert all(s.ready == 200 and s.live == 200 for s in window), drill.timeline


def test_saturation_stays_busy_and_gets_zero_canaries(triton: TritonServer, watcher: Watcher, drill: Drill):
    wait_idle(watcher)
    # Start right after an idle canary came back, so none is due while the load ramps up.
    base = watcher.latest()
    watcher.wait_for(
        lambda s: s.canaries_total > base.canaries_total,
        timeout=CANARY_INTERVAL_S + CANARY_TIMEOUT_S + 15,
        what="an idle canary before the load",
    )
    success_before = engine_counter(metrics_base(triton), SUCCESS)
    before = watcher.latest()
    t0 = time.time()
    work = load(triton, SATURATION_REQUESTS)
    first_busy = watcher.wait_for(lambda s: s.state == "busy", timeout=60, what="busy", after=t0)
    drill.detected("load to busy", detection_seconds(first_busy, t0))
    outcomes = work.wait(timeout=300)
    t_end = time.time()
    success_after = engine_counter(metrics_base(triton), SUCCESS)
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
        "max_stuck_seconds_seen": max((s.stuck_seconds or 0) for s in window),
        "request_success_delta": success_after - success_before,
        "canaries_around_load": sum(canary_delta(before, after).values()),
    }
    assert all(o.status == 200 for o in outcomes), [o.body for o in outcomes if o.status != 200]
    assert drill.facts["max_waiting_seen"] >= 1, f"the load never queued: no saturation to judge ({drill.facts})"
    # Busy the whole time the queue was seen, never stuck: requests complete well within stuck_after.
    # Idle is allowed only before the exporter sees the load, and after the queue drains (the last
    # INSTANCES requests run with nothing queued, which Triton's counters cannot tell from idle).
    assert set(states) <= {"idle", "busy"}, drill.timeline
    assert all(s.state == "busy" for s in during), drill.timeline
    assert drill.canaries["sent"] == 0, drill.canaries
    extra = success_after - success_before - SATURATION_REQUESTS
    assert 0 <= extra <= drill.facts["canaries_around_load"] <= 1 + INSTANCES, drill.facts


def test_frozen_worker_sigstop_is_stuck_within_stuck_after_plus_two_polls_then_recovers(
    triton: TritonServer, exporter: ExporterProcess, watcher: Watcher, drill: Drill
):
    wait_idle(watcher)
    restarts_before = watcher.latest().restarts
    restarts_total_before = restarts_total(exporter)
    t0 = time.time()
    work = load(triton, FAULT_REQUESTS)
    wait_queued(triton, work)
    worker = triton.worker()
    assert not work.done(), "the load ended before the SIGSTOP"
    t_stop = time.time()
    worker.suspend()  # SIGSTOP of the Python process running the infer functions; tritonserver answers on
    try:
        # The signal is delivered asynchronously: the state reads "running" for a moment after it.
        stopped_s = wait_until(lambda: worker.status() == "stopped", timeout=10)
        assert stopped_s is not None, f"the worker never showed as stopped: {worker.status()}"
        with httpx.Client(timeout=10) as client:
            health = {p: client.get(triton.url + p).status_code for p in ("/v2/health/live", f"/v2/models/{MODEL}/ready")}
        stuck = watcher.wait_for(
            lambda s: s.state == "stuck", timeout=STUCK_AFTER_S + 2 * POLL_INTERVAL_S + 30, what="stuck", after=t_stop
        )
        drill.detected("SIGSTOP to stuck", detection_seconds(stuck, t_stop))
        not_ready = watcher.wait_for(
            lambda s: s.state == "stuck" and s.ready != 200, timeout=15, what="ready 503 while stuck", after=t_stop
        )
        live_fail = watcher.wait_for(
            lambda s: s.live != 200, timeout=LIVENESS_BUDGET_S + 2 * POLL_INTERVAL_S + 30, what="live 503", after=t_stop
        )
    finally:
        t_cont = time.time()
        worker.resume()  # SIGCONT
    recovered = watcher.wait_for(
        lambda s: s.state in ("busy", "idle"), timeout=60, what="busy or idle after SIGCONT", after=t_cont
    )
    outcomes = work.wait(timeout=300)
    # Idle once the queue drained, or down when Triton's Python backend crashed after the resume
    # (TritonServer.crash: Triton's own fault, recorded in the report; the exporter must read it down).
    after = watcher.wait_for(lambda s: s.state in ("idle", "down"), timeout=60, what="idle after the load (or down)",
                             after=time.time())  # fmt: skip
    crash = triton.crash() if after.state == "down" else None

    hung = [s for s in watcher.since(t_stop) if s.t <= t_cont]
    drill.timeline = watcher.timeline(t0)
    drill.canaries = {"sent": sum(canary_delta(hung[0], hung[-1]).values()), "by_result": canary_delta(hung[0], after)}
    drill.facts = {
        "stuck_after": STUCK_AFTER_S,
        "stopped_state_after_s": stopped_s,
        "health_while_frozen": health,
        "stopped_after_load_start_s": round(t_stop - t0, 1),
        "ready_false_s": round(not_ready.t - t_stop, 1),
        "live_false_s": round(live_fail.t - t_stop, 1),
        "liveness_budget": LIVENESS_BUDGET_S,
        "stopped_for_s": round(t_cont - t_stop, 1),
        "recovered_s": round(recovered.t - t_cont, 1),
        "recovered_state": recovered.state,
        "restarts_delta": (after.restarts or 0) - (restarts_before or 0),
        "restarts_total_delta": restarts_total(exporter) - restarts_total_before,
        "statuses": sorted({o.status for o in outcomes}, key=str),
    }
    if crash is not None:
        drill.facts["tritonserver_crashed_after_resume"] = crash
        relaunch_if_crashed(triton, watcher)
    # HTTP stays alive while the worker is frozen: only the counters show it.
    assert set(health.values()) == {200}, health
    assert drill.detection["seconds"] <= STUCK_AFTER_S + 2 * POLL_INTERVAL_S + DETECTION_SLACK_S, drill.facts
    assert live_fail.t - t_stop >= LIVENESS_BUDGET_S - POLL_INTERVAL_S - 0.5, drill.facts
    assert any(s.state == "stuck" and s.live == 200 for s in hung), "live failed as soon as stuck"
    seen = next(i for i, s in enumerate(hung) if s.state in ("busy", "stuck"))
    assert all(s.state in ("busy", "stuck") for s in hung[seen:]), drill.timeline
    assert canary_delta(hung[0], hung[-1]) == {r: 0.0 for r in hung[-1].canaries}, "canary sent to a frozen busy server"
    assert drill.facts["restarts_delta"] == drill.facts["restarts_total_delta"] == 0, "SIGSTOP/SIGCONT is no restart"
    if crash is None:
        assert after.state == "idle" and after.live == 200, after
        assert all(o.status == 200 for o in outcomes), [o.body for o in outcomes if o.status != 200]


def test_frozen_tritonserver_metrics_accepted_never_answered_is_stuck_metrics_unanswered(
    triton: TritonServer, exporter: ExporterProcess, watcher: Watcher, drill: Drill
):
    """SIGSTOP of tritonserver itself with requests queued: every port accepts and never answers."""
    crash = relaunch_if_crashed(triton, watcher)  # the frozen worker's drill may end in Triton's own crash
    if crash is not None:
        drill.facts["tritonserver_crashed_before"] = crash
    wait_idle(watcher)
    restarts_total_before = restarts_total(exporter)
    t0 = time.time()
    work = load(triton, FAULT_REQUESTS)
    wait_queued(triton, work)
    # What counts is the exporter's last good read: it must have seen the queue before the freeze.
    watcher.wait_for(lambda s: s.state == "busy" and (s.waiting or 0) > 0, timeout=30,
                     what="busy with requests queued before the freeze", after=t0)  # fmt: skip
    server = triton.tritonserver()
    assert not work.done(), "the load ended before the SIGSTOP"
    t_stop = time.time()
    server.suspend()
    try:
        stopped_s = wait_until(lambda: server.status() == "stopped", timeout=10)
        stuck = watcher.wait_for(lambda s: s.state == "stuck", timeout=STUCK_AFTER_S + 2 * UNANSWERED_POLL_S + 30,
                                 what="stuck", after=t_stop)  # fmt: skip
        drill.detected("SIGSTOP tritonserver to stuck", detection_seconds(stuck, t_stop))
    finally:
        t_cont = time.time()
        server.resume()  # SIGCONT
    outcomes = work.wait(timeout=300)
    after = watcher.wait_for(lambda s: s.state in ("idle", "down"), timeout=60, what="idle after the load (or down)",
                             after=time.time())  # fmt: skip
    crash = triton.crash() if after.state == "down" else None

    frozen = [s for s in watcher.since(t_stop) if s.t <= t_cont]
    drill.timeline = watcher.timeline(t0)
    drill.canaries = {"sent": sum(canary_delta(frozen[0], frozen[-1]).values()), "by_result": canary_delta(frozen[0], after)}
    drill.facts |= {
        "stopped_state_after_s": stopped_s,
        "stuck_reason": stuck.reason,
        "stopped_for_s": round(t_cont - t_stop, 1),
        "states_while_frozen": sorted({s.state for s in frozen}),
        "restarts_total_delta": restarts_total(exporter) - restarts_total_before,
        "statuses": dict(Counter(str(o.status) for o in outcomes)),
    }
    if crash is not None:
        drill.facts["tritonserver_crashed_after_resume"] = crash
        relaunch_if_crashed(triton, watcher)
    assert stopped_s is not None, "tritonserver never showed as stopped"
    assert stuck.reason == "metrics_unanswered", stuck
    assert drill.detection["seconds"] <= STUCK_AFTER_S + 2 * UNANSWERED_POLL_S + DETECTION_SLACK_S, drill.facts
    # Never `down` while frozen: the server is there and owes the queued requests.
    assert set(drill.facts["states_while_frozen"]) <= {"busy", "stuck"}, drill.timeline
    assert drill.canaries["sent"] == 0, "canary sent to a frozen busy server"
    assert drill.facts["restarts_total_delta"] == 0, "SIGSTOP/SIGCONT is no restart"
    if crash is None:
        assert after.state == "idle", after


def test_kill_tritonserver_is_down_with_a_reason(triton: TritonServer, watcher: Watcher, drill: Drill):
    crash = relaunch_if_crashed(triton, watcher)  # the frozen worker's drill may end in Triton's own crash
    if crash is not None:
        drill.facts["tritonserver_crashed_before"] = crash
    wait_idle(watcher)
    t0 = time.time()
    work = load(triton, FAULT_REQUESTS)
    wait_queued(triton, work)
    server = triton.tritonserver()
    assert not work.done(), "the load ended before the SIGKILL"
    t_kill = time.time()
    server.kill()  # SIGKILL: in-flight requests fail at once, and the PyTriton process exits by itself
    down = watcher.wait_for(lambda s: s.state == "down", timeout=30, what="down", after=t_kill)
    drill.detected("SIGKILL to down", detection_seconds(down, t_kill))
    outcomes = work.wait(timeout=120)
    gone = triton.wait_gone(timeout=15)
    still_down = watcher.wait_for(lambda s: True, timeout=30, what="a later sample", after=time.time() + 3)

    drill.timeline = watcher.timeline(t0)
    samples = watcher.since(t0)
    drill.canaries = {"sent": sum(canary_delta(samples[0], samples[-1]).values()),
                      "by_result": canary_delta(samples[0], samples[-1])}
    drill.facts |= {
        "reason": down.reason,
        "in_flight_statuses": dict(Counter(str(o.status) for o in outcomes)),
        "killed_after_load_start_s": round(t_kill - t0, 1),
        "pytriton_exited_by_itself": gone,
    }
    triton.stop()  # whatever is left, by PID
    assert down.reason, "down without a reason"
    assert still_down.state == "down", drill.timeline
    assert any(o.status != 200 for o in outcomes), drill.facts


def test_restart_on_the_same_ports_counts_exactly_one_restart_then_idle_and_canary_ok(
    triton: TritonServer, exporter: ExporterProcess, watcher: Watcher, drill: Drill
):
    triton.stop()  # the kill drill left nothing running; stop is a no-op then
    before = watcher.wait_for(lambda s: s.state == "down", timeout=60, what="down before the restart", after=time.time())
    restarts_total_before = restarts_total(exporter)
    t_launch = time.time()
    startup_s = triton.start()
    t_ready = time.time()
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
