"""Fault drills: the exporter (poll 1 s, stuck_after 6 s, engine: llamacpp) judged against a real llama-server.

The tests run in file order on one server and one exporter: smoke, idle canaries, saturation,
engine loop frozen with ptrace (HTTP alive), whole process SIGSTOPped, kill, restart on the same
port. Every wait polls for a condition with a bounded deadline; loads are long generations that
run until the drill cancels them. Each drill writes its detection latency, verdict timeline and
canary count to the report, and the pages it saw to the log directory.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from real_vllm.drill_report import Drill
from real_vllm.exporter_process import ExporterProcess, Sample, Watcher

from .freeze_thread import frozen_thread, thread_state
from .llamacpp_server import ALIAS, LOG_DIR, SLOTS, LlamaServer
from .load import LONG_GENERATION_TOKENS, Load, busy, idle, long_generations, metrics, wait_metrics
from .timing import CANARY_INTERVAL_S, CANARY_TIMEOUT_S, METRICS_TIMEOUT_S, POLL_INTERVAL_S, STUCK_AFTER_S

IDLE_WINDOW_S = 15.0
SATURATION_WINDOW_S = 15.0
# Scheduling slack for the exporter's own poll jitter on a loaded box, on top of stuck_after + 2 polls.
DETECTION_SLACK_S = 1.0
# While /metrics is accepted and never answered, each poll lasts its timeout rather than one interval.
UNANSWERED_POLL_S = POLL_INTERVAL_S + METRICS_TIMEOUT_S
DECODES = "llamacpp:n_decode_total"


def save_page(server: LlamaServer, state: str) -> None:
    """Keep the /metrics body and headers of this moment in the log directory (fixture candidates)."""
    pages = LOG_DIR / "pages"
    pages.mkdir(parents=True, exist_ok=True)
    try:
        answer = httpx.get(f"{server.url}/metrics", timeout=METRICS_TIMEOUT_S)
        head = f"HTTP {answer.status_code}\n" + "".join(f"{k}: {v}\n" for k, v in answer.headers.items())
        (pages / f"metrics-{state}.txt").write_text(answer.text)
    except httpx.HTTPError as exc:
        head = f"no answer: {exc!r}\n"
    (pages / f"headers-{state}.txt").write_text(head + f"process state: {server.state()}\n")


def wait_idle(watcher: Watcher, timeout: float = 120.0) -> Sample:
    """The first idle sample taken from now on."""
    return watcher.wait_for(lambda s: s.state == "idle", timeout=timeout, what="state idle", after=time.time())


def canary_delta(before: Sample, after: Sample) -> dict[str, float]:
    results = set(before.canaries) | set(after.canaries)
    return {r: after.canaries.get(r, 0.0) - before.canaries.get(r, 0.0) for r in sorted(results)}


def restarts_total(exporter: ExporterProcess) -> float:
    with httpx.Client(timeout=20) as client:
        return exporter.counter(client, "llm_vitals_restarts_total").get("", 0.0)


def detection_seconds(sample: Sample, t_event: float) -> float:
    """Seconds from the event to the verdict: the exporter's own `since` when it is after the event."""
    if sample.since is not None and sample.since >= t_event:
        return sample.since - t_event
    return sample.t - t_event


# Every slot busy and the rest deferred: on an idle box the tiny model makes ~1,000 tokens/s, so
# 8 x 8,000 tokens last over a minute; each drill cancels its load when it is done.
LOAD_REQUESTS = SLOTS + 6


@contextmanager
def saturating_load(server: LlamaServer) -> Iterator[Load]:
    """LOAD_REQUESTS long generations: every slot busy and requests deferred, seen on /metrics.

    Cancelled when the block is left, however it is left: a drill that fails must not leave its
    load running into the next one (a fresh-clone run once failed every later drill that way).
    """
    with long_generations(server.url, LOAD_REQUESTS) as load:
        wait_metrics(server.url, lambda p: busy(p, SLOTS, 1), timeout=60, what="all slots busy and one deferred")
        yield load


def end_load(server: LlamaServer, load: Load) -> None:
    load.cancel()
    wait_metrics(server.url, idle, timeout=180, what="the server idle after the load was cancelled")


def test_smoke_server_serves_the_tiny_model_and_its_metrics(server: LlamaServer, drill: Drill):
    models = httpx.get(f"{server.url}/v1/models", timeout=20).json()
    assert [m["id"] for m in models["data"]] == [ALIAS]
    answer = httpx.get(f"{server.url}/metrics", timeout=20)
    for family in ("llamacpp:requests_processing", "llamacpp:requests_deferred", DECODES, "llamacpp:tokens_predicted_total"):
        assert f"\n{family} " in answer.text, family
    assert answer.headers.get("Process-Start-Time-Unix", "").isdigit(), answer.headers
    done = httpx.post(f"{server.url}/completion", json={"prompt": "Hello", "n_predict": 8, "ignore_eos": True}, timeout=60)
    assert done.status_code == 200, done.text
    drill.facts = {
        "tokens_per_second_one_slot": round(done.json()["timings"]["predicted_per_second"], 1),
        "loading_answer": server.starts[0]["loading_answer"],
        "start_seconds": server.starts[0]["seconds"],
    }
    save_page(server, "idle")


def test_idle_server_gets_canaries_at_the_configured_rate_each_answered(
    server: LlamaServer, watcher: Watcher, drill: Drill
):
    wait_idle(watcher)
    decodes_before = metrics(server.url)[DECODES]
    before = watcher.latest()
    t0 = time.time()
    end = watcher.wait_for(lambda s: True, timeout=IDLE_WINDOW_S + 30, what="the end of the window", after=t0 + IDLE_WINDOW_S)
    after = watcher.wait_for(lambda s: True, timeout=30, what="a sample after the window", after=time.time())
    decodes_after = metrics(server.url)[DECODES]

    window = [s for s in watcher.since(t0) if s.t <= end.t]
    delta = canary_delta(before, after)
    sent = sum(delta.values())
    expected = IDLE_WINDOW_S / CANARY_INTERVAL_S
    drill.timeline = watcher.timeline(t0)
    drill.canaries = {"sent": sent, "by_result": delta, "expected": expected}
    drill.detected("one canary every", (after.t - before.t) / sent if sent else float("inf"))
    drill.facts = {
        "window_s": round(after.t - before.t, 1),
        "n_decode_delta": decodes_after - decodes_before,
        "idle_fraction": round(sum(s.state == "idle" for s in window) / len(window), 2),
    }
    assert expected - 2 <= sent <= expected + 2, drill.canaries
    assert delta.get("ok", 0) == sent, f"an idle canary failed: {delta}"
    # Each canary is a real request the engine ran: at least one decode call each.
    assert drill.facts["n_decode_delta"] >= delta.get("ok", 0), drill.facts
    assert {s.state for s in window} <= {"idle", "busy"}, drill.timeline
    assert drill.facts["idle_fraction"] >= 0.7, drill.timeline
    assert all(s.ready == 200 and s.live == 200 for s in window), drill.timeline


def test_saturation_stays_busy_and_gets_zero_canaries(server: LlamaServer, watcher: Watcher, drill: Drill):
    wait_idle(watcher)
    before = watcher.latest()
    t0 = time.time()
    with long_generations(server.url, LOAD_REQUESTS) as load:
        first_busy = watcher.wait_for(lambda s: s.state == "busy", timeout=30, what="busy", after=t0)
        drill.detected("load to busy", detection_seconds(first_busy, t0))
        page = wait_metrics(server.url, lambda p: busy(p, SLOTS, 1), timeout=60, what="all slots busy and one deferred")
        save_page(server, "busy")
        end = watcher.wait_for(lambda s: True, timeout=SATURATION_WINDOW_S + 30, what="the end of the window",
                               after=first_busy.t + SATURATION_WINDOW_S)  # fmt: skip
        busy_end = metrics(server.url)
        t_end = time.time()
        end_load(server, load)
    after = wait_idle(watcher, timeout=60)

    window = [s for s in watcher.since(first_busy.t) if s.t <= end.t]
    drill.timeline = watcher.timeline(t0)
    drill.canaries = {"sent": sum(canary_delta(window[0], window[-1]).values()), "by_result": canary_delta(before, after)}
    drill.facts = {
        "processing_deferred_seen": [page["llamacpp:requests_processing"], page["llamacpp:requests_deferred"]],
        "n_decode_during": busy_end[DECODES] - page[DECODES],
        "tokens_predicted_during": busy_end["llamacpp:tokens_predicted_total"] - page["llamacpp:tokens_predicted_total"],
        "busy_window_s": round(t_end - first_busy.t, 1),
        "max_waiting_seen": max((s.waiting or 0) for s in window),
    }
    assert all(s.state == "busy" for s in window), drill.timeline
    assert drill.canaries["sent"] == 0, drill.canaries
    # The live progress signal moved the whole time; the token counters move only at request end.
    assert drill.facts["n_decode_during"] > 0, drill.facts
    # ignore_eos: a request that ended in the window added exactly its LONG_GENERATION_TOKENS.
    assert drill.facts["tokens_predicted_during"] % LONG_GENERATION_TOKENS == 0, drill.facts


def test_frozen_engine_loop_with_http_alive_is_stuck_then_recovers(
    server: LlamaServer, exporter: ExporterProcess, watcher: Watcher, drill: Drill
):
    wait_idle(watcher)
    restarts_before = restarts_total(exporter)
    t0 = time.time()
    with saturating_load(server) as load:
        watcher.wait_for(lambda s: s.state == "busy" and s.reason == "progress", timeout=60,
                         what="busy with progress before the freeze", after=t0)  # fmt: skip
        # ptrace-stop the main thread (the engine loop); the HTTP threads keep running.
        with frozen_thread(server.pid, max_seconds=120) as t_freeze:
            frozen_as = thread_state(server.pid, server.pid)
            health = httpx.get(f"{server.url}/health", timeout=METRICS_TIMEOUT_S).status_code
            stuck = watcher.wait_for(lambda s: s.state == "stuck", timeout=STUCK_AFTER_S + 2 * UNANSWERED_POLL_S + 30,
                                     what="stuck", after=t_freeze)  # fmt: skip
            drill.detected("freeze to stuck", detection_seconds(stuck, t_freeze))
            save_page(server, "engine-thread-frozen")
            t_release = time.time()
        recovered = watcher.wait_for(lambda s: s.state == "busy", timeout=60, what="busy after the release",
                                     after=t_release)  # fmt: skip
        end_load(server, load)
    after = wait_idle(watcher, timeout=60)

    frozen = [s for s in watcher.since(t_freeze) if s.t <= t_release]
    drill.timeline = watcher.timeline(t0)
    drill.canaries = {"sent": sum(canary_delta(frozen[0], frozen[-1]).values()), "by_result": canary_delta(frozen[0], after)}
    drill.facts = {
        "thread_state": frozen_as,
        "health_while_frozen": health,
        "stuck_reason": stuck.reason,
        "stuck_detected_s": drill.detection["seconds"],
        "recovered_s": round(recovered.t - t_release, 1),
        "restarts_delta": restarts_total(exporter) - restarts_before,
    }
    assert frozen_as == "t", f"the engine thread was not ptrace-stopped ({frozen_as})"
    assert health == 200, "llama-server's /health stays 200 with its engine loop frozen"
    # Frozen inside a decode, /metrics answers with frozen counters (no_progress); frozen between
    # decodes, /metrics is accepted and never answered (metrics_unanswered). Both are stuck.
    assert stuck.reason in ("no_progress", "metrics_unanswered"), stuck
    bound = STUCK_AFTER_S + 2 * (POLL_INTERVAL_S if stuck.reason == "no_progress" else UNANSWERED_POLL_S)
    assert drill.detection["seconds"] <= bound + DETECTION_SLACK_S, drill.facts
    seen = next(i for i, s in enumerate(frozen) if s.state in ("busy", "stuck"))
    assert all(s.state in ("busy", "stuck") for s in frozen[seen:]), drill.timeline
    assert drill.canaries["sent"] == 0, "canary sent to a hung busy server"
    assert drill.facts["restarts_delta"] == 0, "a freeze is no restart"


def test_sigstop_metrics_accepted_never_answered_is_stuck_metrics_unanswered(
    server: LlamaServer, exporter: ExporterProcess, watcher: Watcher, drill: Drill
):
    wait_idle(watcher)
    restarts_before = restarts_total(exporter)
    t0 = time.time()
    with saturating_load(server) as load:
        watcher.wait_for(lambda s: s.state == "busy" and s.reason == "progress", timeout=60,
                         what="busy with progress before the SIGSTOP", after=t0)  # fmt: skip
        t_stop = time.time()
        server.signal(signal.SIGSTOP)
        try:
            stuck = watcher.wait_for(lambda s: s.state == "stuck", timeout=STUCK_AFTER_S + 2 * UNANSWERED_POLL_S + 30,
                                     what="stuck", after=t_stop)  # fmt: skip
            drill.detected("SIGSTOP to stuck", detection_seconds(stuck, t_stop))
            stopped_as = server.state()
        finally:
            t_cont = time.time()
            server.signal(signal.SIGCONT)
        recovered = watcher.wait_for(lambda s: s.state == "busy", timeout=60, what="busy after SIGCONT", after=t_cont)
        end_load(server, load)
    after = wait_idle(watcher, timeout=60)

    stopped = [s for s in watcher.since(t_stop) if s.t <= t_cont]
    drill.timeline = watcher.timeline(t0)
    drill.canaries = {"sent": sum(canary_delta(stopped[0], stopped[-1]).values()), "by_result": canary_delta(stopped[0], after)}
    drill.facts = {
        "process_state": stopped_as,
        "stuck_reason": stuck.reason,
        "stuck_detected_s": drill.detection["seconds"],
        "recovered_s": round(recovered.t - t_cont, 1),
        "restarts_delta": restarts_total(exporter) - restarts_before,
    }
    assert stopped_as == "T", stopped_as
    assert stuck.reason == "metrics_unanswered", stuck
    assert drill.detection["seconds"] <= STUCK_AFTER_S + 2 * UNANSWERED_POLL_S + DETECTION_SLACK_S, drill.facts
    # Never `down`: the server is there, it just does not answer.
    assert {s.state for s in stopped} <= {"busy", "stuck"}, drill.timeline
    assert drill.canaries["sent"] == 0
    assert drill.facts["restarts_delta"] == 0, "SIGSTOP/SIGCONT is no restart"


def test_kill_is_down_with_a_reason(server: LlamaServer, watcher: Watcher, drill: Drill):
    wait_idle(watcher)
    t0 = time.time()
    with saturating_load(server) as load:
        save_page(server, "busy-before-kill")
        t_kill = time.time()
        server.signal(signal.SIGKILL)
        down = watcher.wait_for(lambda s: s.state == "down", timeout=30, what="down", after=t_kill)
        drill.detected("SIGKILL to down", detection_seconds(down, t_kill))
        status = server.wait_exit(timeout=30)
        outcomes = load.cancel()  # the requests' own outcomes: each lost its connection to the kill
    still_down = watcher.wait_for(lambda s: True, timeout=30, what="a later sample", after=time.time() + 3)
    drill.timeline = watcher.timeline(t0)
    drill.facts = {"reason": down.reason, "exit_status": status, "in_flight": [o.status for o in outcomes]}
    assert down.reason == "connect", down
    assert still_down.state == "down", drill.timeline
    assert status == -signal.SIGKILL
    assert all(o.status is None for o in outcomes), outcomes  # in-flight requests lose their connection


def test_restart_on_the_same_port_counts_exactly_one_restart_then_idle_and_canary_ok(
    server: LlamaServer, exporter: ExporterProcess, watcher: Watcher, drill: Drill
):
    if server.running:
        server.stop()
    before = watcher.wait_for(lambda s: s.state == "down", timeout=60, what="down before the restart", after=time.time())
    restarts_total_before = restarts_total(exporter)
    t_launch = time.time()
    startup_s = server.start()
    t_ready = time.time()
    save_page(server, "restarted-idle")
    counted = watcher.wait_for(lambda s: (s.restarts or 0) > (before.restarts or 0), timeout=60,
                               what="a restart counted", after=t_launch)  # fmt: skip
    drill.detected("ready to restart counted", max(0.0, counted.t - t_ready))
    ok = watcher.wait_for(lambda s: s.canaries.get("ok", 0) > before.canaries.get("ok", 0),
                          timeout=CANARY_INTERVAL_S + CANARY_TIMEOUT_S + 30, what="a good canary after the restart",
                          after=t_ready)  # fmt: skip
    # The canary may still show as one request processing: the new lifetime settles on idle.
    later = watcher.wait_for(lambda s: s.state == "idle", timeout=60, what="idle after the restart", after=ok.t)
    drill.timeline = watcher.timeline(t_launch)
    drill.canaries = {"sent": sum(canary_delta(before, later).values()), "by_result": canary_delta(before, later)}
    drill.facts = {
        "startup_seconds": startup_s,
        "loading_answer": server.starts[-1]["loading_answer"],
        "restarts_before": before.restarts,
        "restarts_after": later.restarts,
        "canary_ok_after_ready_s": round(ok.t - t_ready, 1),
        "restarts_total_delta": restarts_total(exporter) - restarts_total_before,
    }
    assert (later.restarts or 0) - (before.restarts or 0) == 1, drill.facts
    assert drill.facts["restarts_total_delta"] == 1, "llm_vitals_restarts_total disagrees with the API"
    assert canary_delta(before, later).get("error", 0) == 0
