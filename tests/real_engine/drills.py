"""The drills, written once: each judges the real exporter against whatever engine its `Kit` holds.

A tier's test file calls the drills that apply to its engine, in its order, on one server and one
exporter; the engine's description (tests/real_<engine>/engine.py) says what to expect of it. Every
wait polls for a condition with a bounded deadline; the deadlines are generous because the 2-core box
is saturated during load (a /metrics read once took 9 s). Each drill writes its detection latency,
verdict timeline, canary count and facts to the report before it asserts, so a failure is explained.

Verdicts are judged from the exporter's own record of every poll (`polled_states`) where a drill's
window is short: a watcher starved for seconds on a loaded box once saw none of a 4.7 s load.
"""

from __future__ import annotations

import copy as copy_module
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

import httpx
import psutil
from flaky_proxy import FlakyProxy

from .engine import QUEUED_LONGER_THAN, Engine, Fault, Kit, has_family, wait_until
from .harness import ExporterProcess, ExporterSettings, Sample, Watcher, canaries, canary_delta, detection_seconds
from .launcher import ServerProcess
from .load import Load, Outcome
from .report import Drill

IDLE_WINDOW_S = 15.0
IDLE_FRACTION = 0.7  # of the idle window's samples: a canary in flight may show as one running request
# Scheduling slack for the exporter's own poll jitter on a loaded box, on top of stuck_after + 2 polls.
DETECTION_SLACK_S = 1.0
SATURATION_WAIT_S = 300.0
# The flaky-reads drill: its own exporter reads through tests/flaky_proxy.py, which holds every third
# /metrics read past that exporter's timeout. 2 s is llama.cpp's own; vLLM's API server answers its
# page in well under that while the engine is frozen. The held read ends 2 s after the timeout, so the
# proxy never answers a read the exporter still waits on.
FLAKY_EVERY = 3
FLAKY_METRICS_TIMEOUT_S = 2.0
FLAKY_HELD_S = FLAKY_METRICS_TIMEOUT_S + 2.0
FLAKY_HELD_WHILE_STUCK = 2  # held reads the stuck episode must outlast
FLAKY_DOWN_AFTER_S = 30.0  # the exporter's default
# The slow-metrics drill (issue 29): its own exporter reads through tests/flaky_proxy.py, which holds
# every /metrics read SLOW_HELD_S before forwarding it, at the exporter's default 10 s timeout: the
# page comes in 11 s plus the server's own time, the 9-12 s a saturated vLLM's /metrics took. Its
# other routes (the second probe) pass at once. The window is 3 minutes; 90 s keeps the tier
# within its time budget and still spans down_after and the liveness budget several times, with a
# read at the timeout missed every other poll.
SLOW_METRICS_TIMEOUT_S = 10.0
SLOW_HELD_S = 11.0
SLOW_WINDOW_S = 90.0


def smoke(kit: Kit, drill: Drill) -> None:
    """The tier's server is the real engine, serving the tiny model, with the families the exporter reads."""
    engine, server = kit.engine, kit.server
    page = kit.page()
    missing = [family for family in engine.families if not has_family(page, family)]
    assert not missing, f"not on {server.metrics_url}: {missing}"
    models = httpx.get(f"{server.url}/v1/models", timeout=20)
    if engine.openai_model is None:
        assert models.status_code == 404, models.text
    else:
        assert [m["id"] for m in models.json()["data"]] == [engine.openai_model], models.text
    drill.facts = {"start_seconds": server.starts[0]["seconds"], **start_extras(server.starts[0])}
    drill.facts |= engine.smoke(kit)
    kit.save_page("idle")


def idle(kit: Kit, drill: Drill) -> None:
    """An idle server gets canaries at the configured rate, each answered, each a request the engine ran."""
    engine, watcher = kit.engine, kit.watcher
    kit.wait_idle()
    answered_before = kit.counter(engine.answered.sample)
    before = watcher.latest()
    t0 = time.time()
    end = watcher.wait_for(lambda s: True, timeout=IDLE_WINDOW_S + 30, what="the end of the window", after=t0 + IDLE_WINDOW_S)
    after = watcher.wait_for(lambda s: True, timeout=30, what="a sample after the window", after=time.time())
    answered_after = kit.counter(engine.answered.sample)

    window = [s for s in watcher.since(t0) if s.t <= end.t]
    delta = canary_delta(before, after)
    sent = sum(delta.values())
    ok = delta.get("ok", 0)
    expected = IDLE_WINDOW_S / engine.exporter.canary_interval
    drill.timeline = watcher.timeline(t0)
    drill.canaries = {"sent": sent, "by_result": delta, "expected": expected}
    drill.detected("one canary every", (after.t - before.t) / sent if sent else float("inf"))
    answered = answered_after - answered_before
    drill.facts = {
        "window_s": round(after.t - before.t, 1),
        engine.answered.fact: answered,
        "idle_fraction": round(sum(s.state == "idle" for s in window) / len(window), 2),
    }
    assert expected - 2 <= sent <= expected + 2, drill.canaries
    assert ok == sent, f"an idle canary failed: {delta}"
    # Each canary is a real request the engine ran: its own counter moved with them.
    if engine.answered.exact:
        assert abs(answered - ok) <= 1, drill.facts
    else:
        assert answered >= ok, drill.facts
    assert {s.state for s in window} <= {"idle", "busy"}, drill.timeline
    assert drill.facts["idle_fraction"] >= IDLE_FRACTION, drill.timeline
    assert all(s.ready == 200 and s.live == 200 for s in window), drill.timeline


def saturation(kit: Kit, drill: Drill) -> None:
    """A load that queues on the engine: busy from the exporter's first busy poll on, and zero canaries.

    A load that ends by itself is judged from its first busy poll to its last (idle may come back
    as it drains); a held load (`saturation_hold_s`) is busy to the end of its window, then cancelled.
    """
    engine, watcher = kit.engine, kit.watcher
    held = engine.saturation_hold_s is not None
    kit.wait_idle()
    kit.wait_fresh_idle_canary()
    answered_before = kit.counter(engine.answered.sample)
    queued_before = kit.queued_longer_than() if engine.queue_histogram else 0.0
    before = watcher.latest()
    t0 = time.time()
    pages: dict[str, str] = {}
    with engine.saturation_load(kit.server) as load:
        if engine.saturation_on_page:
            pages["busy"] = kit.wait_working(load)
            kit.save_page("busy")
        if engine.saturation_hold_s is not None:
            first = watcher.wait_for(lambda s: s.state == "busy", timeout=30, what="busy", after=t0)
            watcher.wait_for(lambda s: True, timeout=engine.saturation_hold_s + 30, what="the end of the window",
                             after=first.t + engine.saturation_hold_s)
            pages["end"] = kit.wait_page(lambda page: True, "an answer from /metrics")
            t_end = time.time()
            outcomes = engine.finish_load(kit, load)
        else:
            outcomes = load.wait(timeout=SATURATION_WAIT_S)
            t_end = time.time()
    answered_after = kit.counter(engine.answered.sample)
    queued_after = kit.queued_longer_than() if engine.queue_histogram else 0.0
    after = watcher.wait_for(lambda s: True, timeout=30, what="a sample after the load", after=time.time())

    polls = kit.exporter.polled_states(t0, t_end)
    states = [state for _, state in polls]
    busy_at = [i for i, state in enumerate(states) if state == "busy"]
    window = [s for s in watcher.since(t0) if s.t <= t_end]
    drill.timeline = watcher.timeline(t0)
    drill.facts = {
        "load_seconds": round(t_end - t0, 1),
        "statuses": sorted({o.status for o in outcomes}, key=str),  # None: no answer at all
        "polled_states": [[round(t - t0, 1), state] for t, state in polls],
        "max_waiting_seen": max((s.waiting or 0 for s in window), default=0),
        "max_stuck_seconds_seen": max((s.stuck_seconds or 0 for s in window), default=0),
        **engine.saturation_facts(pages),
    }
    if engine.queue_histogram:
        drill.facts[f"queued_over_{QUEUED_LONGER_THAN}s"] = queued_after - queued_before
    if not held:
        drill.facts[engine.answered.fact] = answered_after - answered_before
        drill.facts["canaries_around_load"] = sum(canary_delta(before, after).values())
    assert busy_at, f"the exporter never polled busy during the load ({drill.facts})"
    drill.detected("load to busy", polls[busy_at[0]][0] - t0)
    run = states[busy_at[0] :] if held else states[busy_at[0] : busy_at[-1] + 1]
    busy_from, busy_to = polls[busy_at[0]][0], polls[busy_at[0] + len(run) - 1][0]
    during = [s for s in watcher.since(t0) if busy_from <= s.t <= busy_to]
    # None when the starved watcher took no sample while busy; the engine's own count below still
    # bounds the canaries then.
    drill.canaries = {"sent": sum(canary_delta(before, during[-1]).values()) if during else None,
                      "by_result": canary_delta(before, after)}

    if not held:
        assert all(o.status == 200 for o in outcomes), [o.body for o in outcomes if o.status != 200]
    # Saturation is shown by the engine's own queue-time histogram where it has one, not by samples
    # of `waiting`: a clean CI run once sampled the exporter only twice in a 13 s load and saw 0.
    if engine.queue_histogram:
        # Queued in the engine (its own histogram), or before it: on a quiet 2-core box vLLM's API server,
        # not its engine, was the bottleneck and handed the engine one request at a time, so the engine
        # counted no queue while the clients waited (a clean-clone CI run, 0 queued, every poll busy).
        queued = drill.facts[f"queued_over_{QUEUED_LONGER_THAN}s"]
        drill.facts["clients_waited"] = clients_waited(outcomes)
        assert max(queued, drill.facts["clients_waited"]) >= engine.min_queued, \
            f"the load barely queued: no saturation to judge ({drill.facts})"
    assert drill.facts["max_waiting_seen"] >= engine.min_waiting_seen, f"the load never queued ({drill.facts})"
    # Idle before the exporter sees the load (and after it drains), one run of busy in between, nothing else.
    assert set(states) <= {"idle", "busy"}, drill.facts["polled_states"]
    assert all(state == "busy" for state in run), drill.facts["polled_states"]
    assert drill.canaries["sent"] in (0, None), drill.canaries
    if not held:
        # The engine ran only the load's own requests, plus the idle canaries the exporter may send
        # (and counts) as the load drains.
        extra = drill.facts[engine.answered.fact] - engine.saturation_requests
        assert 0 <= extra <= drill.facts["canaries_around_load"] <= engine.canaries_after_load, drill.facts
    engine.check_saturation(drill.facts)


def long_prompts(kit: Kit, drill: Drill) -> None:
    """Long prompts keep the engine busy in long steps: busy (never idle where the engine says so), never stuck."""
    engine, watcher = kit.engine, kit.watcher
    kit.wait_idle()
    kit.wait_fresh_idle_canary()
    before = watcher.latest()
    t0 = time.time()
    readings: list[dict] = []
    with engine.long_prompt_load(kit.server) as load:
        while engine.long_prompt_reads and not load.done():
            read_at = time.time()
            page = kit.page()
            readings.append({"t": read_at, **engine.long_prompt_reading(page)})
            if readings[-1]["trap"] and sum(r["trap"] for r in readings) == 1:
                kit.save_page("long-prompt")
            time.sleep(0.5)
        outcomes = load.wait(timeout=(engine.long_prompt_seconds or 0) + SATURATION_WAIT_S)
    t_end = time.time()
    after = kit.wait_idle(timeout=60)

    # The prompts' time on the server: up to the last direct read that still saw one in flight.
    # Later samples may rightly read idle (the engine answered; our thread has not seen it yet).
    t_work_end = max((r["t"] for r in readings if r["in_flight"]), default=t0) if engine.long_prompt_reads else t_end
    polls = kit.exporter.polled_states(t0, t_work_end)
    states = [state for _, state in polls]
    busy_at = [i for i, state in enumerate(states) if state == "busy"]
    window = [s for s in watcher.since(t0) if s.t <= t_work_end]
    drill.timeline = watcher.timeline(t0)
    drill.canaries = {"sent": sum(canary_delta(before, window[-1]).values()) if window else 0,
                      "by_result": canary_delta(before, after)}
    drill.facts = {
        "prompt_tokens": engine.long_prompt_tokens,
        "requests": len(outcomes),
        "load_seconds": round(t_end - t0, 1),
        "in_flight_seen_s": round(t_work_end - t0, 1),
        "polled_states": dict(Counter(states)),
        "max_stuck_seconds_seen": max((s.stuck_seconds or 0 for s in window), default=0),
        "statuses": sorted({o.status for o in outcomes}, key=str),
    }
    engine.check_long_prompts(drill.facts, readings)
    assert busy_at, f"the exporter never polled busy during the load ({drill.facts}; {drill.timeline})"
    drill.detected("load to busy", polls[busy_at[0]][0] - t0)
    assert all(o.status == 200 for o in outcomes), [o.body for o in outcomes if o.status != 200]
    if engine.long_prompt_seconds:
        assert drill.facts["load_seconds"] >= engine.long_prompt_seconds, "the load was shorter than planned"
    assert set(states) <= {"idle", "busy"}, drill.facts
    if engine.long_prompt_busy_throughout:
        assert all(state == "busy" for state in states[busy_at[0] :]), drill.facts
    assert "stuck" not in {s.state for s in window}, drill.timeline
    assert drill.facts["max_stuck_seconds_seen"] < engine.exporter.stuck_after, drill.facts
    if engine.long_prompt_no_canary:
        assert drill.canaries["sent"] == 0, f"a canary was sent during the long prompt: {drill.canaries}"


def hang(kit: Kit, drill: Drill) -> None:
    """The engine frozen with work pending while its HTTP answers: stuck in time, not ready, live only after
    its budget, no canary, no restart; and it recovers when the freeze ends."""
    engine, watcher, settings = kit.engine, kit.watcher, kit.engine.exporter

    def while_stuck(fault: Fault) -> dict:
        kit.save_page("engine-frozen")
        return {
            "not_ready": watcher.wait_for(lambda s: s.state == "stuck" and s.ready != 200, timeout=15,
                                          what="ready 503 while stuck", after=fault.t),
            "live_fail": watcher.wait_for(lambda s: s.live != 200, timeout=settings.liveness + 2 * settings.poll_interval + 30,
                                          what="live 503", after=fault.t),
            "probed": kit.probe(engine.frozen_probe) if engine.frozen_probe else {},
        }

    run = frozen_under_load(kit, drill, engine.freeze_engine, while_stuck, owed_first=engine.hang_when_owed)
    not_ready, live_fail, probed = run.seen["not_ready"], run.seen["live_fail"], run.seen["probed"]
    hung = run.window(kit)
    drill.facts |= {
        "stuck_after": settings.stuck_after,
        "ready_false_s": round(not_ready.t - run.fault.t, 1),
        "live_false_s": round(live_fail.t - run.fault.t, 1),
        "liveness_budget": settings.liveness,
        "routes_while_frozen": probed,
        "restarts_delta": (run.after.restarts or 0) - (run.restarts_before or 0),
    }
    note_crashes(kit, drill, run.crashed_before, run.crash)
    assert run.stuck.reason in engine.hang_reasons, run.stuck
    assert drill.facts["stuck_detected_s"] <= stuck_bound(kit, run.stuck.reason), drill.facts
    # Liveness fails only once stuck for longer than its budget (counted from the last progress,
    # which is at most one poll before the freeze), and never before.
    assert live_fail.t - run.fault.t >= settings.liveness - settings.poll_interval - 0.5, drill.facts
    assert any(s.state == "stuck" and s.live == 200 for s in hung), "live failed as soon as stuck"
    # The exporter may not have polled since the load began: idle is allowed only before its first
    # busy/stuck verdict, never after.
    seen = next(i for i, s in enumerate(hung) if s.state in ("busy", "stuck"))
    assert all(s.state in ("busy", "stuck") for s in hung[seen:]), drill.timeline
    assert not any(s.state == "stuck" and s.ready == 200 for s in hung if s.t > not_ready.t), drill.timeline
    assert drill.canaries["sent"] == 0, "canary sent to a hung busy server"
    if engine.frozen_probe:
        want = engine.frozen_probe
        assert all(status == want.status and seconds >= want.after_s for status, seconds in probed.values()), probed
    assert drill.facts["restarts_delta"] == drill.facts["restarts_total_delta"] == 0, "a freeze is no restart"
    if run.crash is None:
        assert run.after.state == "idle" and run.after.live == 200, run.after
        if engine.fault_outcomes_ok:
            assert all(o.status == 200 for o in run.outcomes), [o.body for o in run.outcomes if o.status != 200]


def unanswered(kit: Kit, drill: Drill) -> None:
    """The whole server frozen with work owed: every read accepted and never answered is `stuck` /
    `metrics_unanswered` (never `down`: the server is there and owes the work), no canary, no restart."""
    run = frozen_under_load(kit, drill, kit.engine.freeze_server, owed_first=True)
    drill.facts["states_while_frozen"] = sorted({str(s.state) for s in run.window(kit)})
    note_crashes(kit, drill, run.crashed_before, run.crash)
    assert run.stuck.reason == "metrics_unanswered", run.stuck
    assert drill.facts["stuck_detected_s"] <= stuck_bound(kit, run.stuck.reason), drill.facts
    assert set(drill.facts["states_while_frozen"]) <= {"busy", "stuck"}, drill.timeline
    assert drill.canaries["sent"] == 0, "canary sent to a frozen busy server"
    assert drill.facts["restarts_total_delta"] == 0, "SIGSTOP/SIGCONT is no restart"
    if run.crash is None:
        assert run.after.state == "idle", run.after


def flaky_reads(kit: Kit, drill: Drill) -> None:
    """The hang, judged by an exporter that misses one read in three (issue 23, part 1): a proxy holds every
    third /metrics read past its timeout. The engine frozen with work pending is `stuck` within stuck_after and
    two polls (a held poll lasts its timeout), never `down`, and stays stuck through the held reads.

    The tier's own exporter reads the engine directly and keeps doing so; this drill's exporter is a second
    one, started here, at the proxy. Each read's failure is counted (poll_errors_total) and is no evidence.
    """
    engine, server = kit.engine, kit.server
    keys = engine.target_keys(server)
    assert "metrics_url" not in keys, f"{engine.name}'s /metrics is on a port of its own: the proxy stands before server.url only"
    # The product's down_after, not the tiers' 3 s (a kill drill's): a held poll alone leaves no good read
    # for its timeout and one interval, 3 s; down must take failures that persist, and these do not.
    settings = replace(engine.exporter, metrics_timeout=FLAKY_METRICS_TIMEOUT_S, down_after=FLAKY_DOWN_AFTER_S)
    flaky_engine = replace_settings(engine, settings)
    with FlakyProxy(server.url, every=FLAKY_EVERY, delay=FLAKY_HELD_S).in_thread() as proxy:
        exporter = ExporterProcess(settings, proxy.url, engine.log_dir, target_keys=keys)
        exporter.start()
        try:
            with Watcher(exporter) as watcher:
                flaky = Kit(flaky_engine, server, exporter, watcher)
                errors_before = exporter.poll_errors()

                def while_stuck(fault: Fault) -> dict:
                    held_at_stuck = proxy.held
                    held_s = wait_until(lambda: proxy.held >= held_at_stuck + FLAKY_HELD_WHILE_STUCK,
                                        timeout=FLAKY_HELD_WHILE_STUCK * FLAKY_EVERY * settings.unanswered_poll_s + 30)
                    return {"held_at_stuck": held_at_stuck, "held_s": held_s, "until": time.time()}

                # Frozen once this exporter has seen the work owed and moving: a freeze it never saw under way
                # is the hang drill's; here the question is what the missed reads do to evidence it had.
                run = frozen_under_load(flaky, drill, engine.freeze_engine, while_stuck, owed_first=True)
                seen = run.seen
                while_frozen = [state for _, state in exporter.polled_states(run.fault.t, run.t_thaw)]
                # From the first stuck sample on (the verdict already stood then) to the end of the wait above.
                while_held = [state for _, state in exporter.polled_states(run.stuck.t, seen["until"])]
                errors = {reason: count - errors_before.get(reason, 0.0) for reason, count in exporter.poll_errors().items()}
        finally:
            exporter.stop()
    bound = settings.stuck_after + 2 * settings.unanswered_poll_s + DETECTION_SLACK_S
    drill.facts |= {
        "stuck_after": settings.stuck_after,
        "metrics_timeout": settings.metrics_timeout,
        "proxy": {"every": FLAKY_EVERY, "held_s": FLAKY_HELD_S, "reads": proxy.reads, "held": proxy.held},
        "stuck_bound_s": bound,
        "held_while_stuck": proxy.held - seen["held_at_stuck"] if seen["held_s"] is not None else 0,
        "polled_while_frozen": dict(Counter(while_frozen)),
        "polled_while_held_stuck": dict(Counter(while_held)),
        "poll_errors_delta": {reason: n for reason, n in errors.items() if n},
    }
    note_crashes(kit, drill, run.crashed_before, run.crash)
    assert seen["held_s"] is not None, f"the proxy held no {FLAKY_HELD_WHILE_STUCK} reads while stuck: {drill.facts}"
    assert run.stuck.reason in (*engine.hang_reasons, "metrics_unanswered"), run.stuck
    assert drill.facts["stuck_detected_s"] <= bound, drill.facts
    # A missed read is neither progress nor proof of death: never down, never idle, while the engine owes the work.
    assert set(while_frozen) <= {"busy", "stuck"}, drill.facts["polled_while_frozen"]
    assert set(while_held) == {"stuck"}, drill.facts["polled_while_held_stuck"]
    # The held reads were failed reads, counted as such.
    assert sum(drill.facts["poll_errors_delta"].values()) >= FLAKY_HELD_WHILE_STUCK, drill.facts
    assert drill.canaries["sent"] == 0, "canary sent to a hung busy server"
    assert drill.facts["restarts_total_delta"] == 0, "a freeze is no restart"


def frozen_whole(kit: Kit, drill: Drill) -> None:
    """The whole server stopped under load (issue 29: SIGSTOP of the process that answers HTTP; a deadlocked
    event loop or a blocked stdout pipe look the same): every read accepted and never answered, and the second
    probe too. Restartable (`stuck`, `metrics_unanswered`) and /live failing within down_after + the liveness
    budget + 2 polls (a poll of a frozen server lasts its read's timeout and the probe's), never `down` (which
    nothing restarts), whether or not the engine's own page would have said so; recovered once SIGCONTed."""
    engine, settings = kit.engine, kit.engine.exporter
    poll = settings.unanswered_poll_s

    def while_stuck(fault: Fault) -> dict:
        return {"live_fail": kit.watcher.wait_for(lambda s: s.live != 200, timeout=settings.liveness + 2 * poll + 30,
                                                  what="live 503", after=fault.t)}

    late_before = kit.exporter.poll_errors().get("exporter_late", 0)
    run = frozen_under_load(kit, drill, engine.freeze_server, while_stuck, owed_first=True)
    live_fail = run.seen["live_fail"]
    while_frozen = [state for _, state in kit.exporter.polled_states(run.fault.t, run.t_thaw)]
    # A read (or its second probe) the exporter's own loop was too late for is evidence of nothing:
    # each adds one poll to the bound (seen once on a loaded box: stuck at 50.7 s against 46 s, one
    # late read). More than two is a starved exporter, not a slow rule.
    late = int(kit.exporter.poll_errors().get("exporter_late", 0) - late_before)
    stuck_bound_s = settings.down_after + (2 + late) * poll + DETECTION_SLACK_S
    restartable_bound_s = settings.down_after + settings.liveness + (2 + late) * poll + DETECTION_SLACK_S
    drill.facts |= {
        "exporter_late_reads": late,
        "down_after": settings.down_after,
        "liveness_budget": settings.liveness,
        "unanswered_poll_s": poll,
        "stuck_bound_s": stuck_bound_s,
        "live_false_s": round(live_fail.t - run.fault.t, 1),
        "restartable_bound_s": restartable_bound_s,
        "polled_while_frozen": dict(Counter(while_frozen)),
        "ready_while_stuck": sorted({s.ready for s in run.window(kit) if s.state == "stuck"}, key=str),
    }
    note_crashes(kit, drill, run.crashed_before, run.crash)
    assert run.stuck.reason == "metrics_unanswered", run.stuck
    assert late <= 2, f"the exporter was too late for {late} reads: starved, the drill judges nothing"
    assert drill.facts["stuck_detected_s"] <= stuck_bound_s, drill.facts
    assert drill.facts["live_false_s"] <= restartable_bound_s, drill.facts
    # Frozen, not gone: never `down`, and never idle while it owes the work.
    assert set(while_frozen) <= {"busy", "stuck"}, drill.facts["polled_while_frozen"]
    assert drill.facts["ready_while_stuck"] in ([], [503]), drill.facts
    assert drill.canaries["sent"] == 0, "canary sent to a frozen busy server"
    assert drill.facts["restarts_total_delta"] == 0, "SIGSTOP/SIGCONT is no restart"
    if run.crash is None:
        assert run.after.state == "idle" and run.after.live == 200, run.after


def slow_metrics(kit: Kit, drill: Drill) -> None:
    """A saturated server's slow /metrics page (issue 29): an exporter that reads it through a proxy adding
    SLOW_HELD_S to every /metrics read, at its default 10 s timeout, while the fault load runs, for SLOW_WINDOW_S.
    The reads at the timeout are missed, the server answers the second probe, the next read waits three times
    as long and gets the page: never unready, never live failing, never stuck, unresponsive or down.

    The tier's own exporter reads the engine directly and keeps doing so; this drill's exporter is a second one,
    started here, at the proxy.
    """
    engine, server = kit.engine, kit.server
    keys = engine.target_keys(server)
    assert "metrics_url" not in keys, f"{engine.name}'s /metrics is on a port of its own: the proxy stands before server.url only"
    settings = replace(engine.exporter, metrics_timeout=SLOW_METRICS_TIMEOUT_S)
    kit.wait_idle()
    with FlakyProxy(server.url, every=1, delay=SLOW_HELD_S).in_thread() as proxy:
        exporter = ExporterProcess(settings, proxy.url, engine.log_dir, target_keys=keys)
        exporter.start(deadline_s=3 * SLOW_METRICS_TIMEOUT_S + 60)
        try:
            with Watcher(exporter) as watcher:
                t0 = time.time()
                errors_before = exporter.poll_errors()
                with engine.fault_load(server) as load:
                    kit.wait_working(load)
                    first = watcher.wait_for(lambda s: s.state == "busy", timeout=3 * (3 * SLOW_METRICS_TIMEOUT_S + 2),
                                             what="busy through the slow proxy", after=t0)
                    end = watcher.wait_for(lambda s: True, timeout=SLOW_WINDOW_S + 60, what="the end of the window",
                                           after=first.t + SLOW_WINDOW_S)
                    assert not load.done(), "the load ended before the window did"
                    outcomes = engine.finish_load(kit, load)
                polls = exporter.polled_states(first.t, end.t)
                window = [s for s in watcher.since(first.t) if s.t <= end.t]
                errors = {reason: count - errors_before.get(reason, 0.0) for reason, count in exporter.poll_errors().items()}
                drill.timeline = watcher.timeline(t0)
                drill.canaries = canaries(window[0], window[-1]) if window else {}
        finally:
            exporter.stop()
    states = [state for _, state in polls]
    drill.detected("load to busy through the slow proxy", first.t - t0)
    drill.facts = {
        "metrics_timeout": settings.metrics_timeout,
        "proxy": {"held_s": SLOW_HELD_S, "reads": proxy.reads, "held": proxy.held},
        "window_s": round(end.t - first.t, 1),
        "polled_states": dict(Counter(states)),
        "poll_errors_delta": {reason: n for reason, n in errors.items() if n},
        "ready_statuses": dict(Counter(str(s.ready) for s in window)),
        "live_statuses": dict(Counter(str(s.live) for s in window)),
        "statuses": dict(Counter(str(o.status) for o in outcomes)),
    }
    assert len(polls) >= 3, drill.facts
    # The reads at the timeout were missed (the proxy saw to that), and that was all they were.
    assert drill.facts["poll_errors_delta"].get("timeout", 0) >= 1, drill.facts
    assert set(states) <= {"busy", "idle"}, drill.facts["polled_states"]
    assert {s.state for s in window} <= {"busy", "idle"}, drill.timeline
    # Never unready for the slow page. (An idle read between requests is ready on the evidence of
    # its last progress or canary, a matter of canary freshness, not of this drill: it is shown.)
    assert all(s.ready == 200 for s in window if s.state == "busy"), drill.timeline
    assert all(s.live == 200 for s in window), drill.timeline


def replace_settings(engine: Engine, settings: ExporterSettings) -> Engine:
    """A copy of `engine` judged with other exporter settings (its hooks read them: vLLM's waits a poll)."""
    copy = copy_module.copy(engine)
    copy.exporter = settings
    return copy


@dataclass
class FrozenRun:
    """What a freeze under load saw: the fault, the verdicts around it, the load's outcomes, how it settled."""

    t0: float  # when the load began
    fault: Fault
    stuck: Sample
    t_thaw: float
    recovered: Sample
    outcomes: list[Outcome]
    after: Sample  # idle, or down with the engine's own crash as the reason
    crash: str | None
    crashed_before: str | None
    restarts_before: float | None  # the API's count
    seen: dict  # what `while_stuck` returned

    def window(self, kit: Kit) -> list[Sample]:
        """The samples taken while the fault held."""
        return [s for s in kit.watcher.since(self.fault.t) if s.t <= self.t_thaw]


def frozen_under_load(kit: Kit, drill: Drill, freeze: Callable[[Kit, Load], AbstractContextManager[Fault]],
                      while_stuck: Callable[[Fault], dict] | None = None, owed_first: bool = False) -> FrozenRun:
    """From idle, the engine's fault load; once its own page shows it, `freeze`, until the exporter says stuck
    and `while_stuck` has looked; then the freeze ends, the load is finished and the verdict settles.

    The drill's timeline, canaries and common facts are filed; the drill adds its own and asserts.
    `owed_first`: the exporter's last good read must have seen work owed and moving before the freeze
    (a server that stops answering is judged on it).
    """
    engine, watcher, settings = kit.engine, kit.watcher, kit.engine.exporter
    crashed_before = kit.relaunch_if_crashed()
    kit.wait_idle()
    restarts_before = watcher.latest().restarts
    restarts_total_before = kit.exporter.restarts_total()
    t0 = time.time()
    with engine.fault_load(kit.server) as load:
        kit.wait_working(load)
        if owed_first:
            # Work owed is running or waiting: on a quiet box vLLM's engine may run its two and hold no queue.
            watcher.wait_for(lambda s: s.state == "busy" and s.reason == "progress" and (s.running or 0) + (s.waiting or 0) > 0,
                             timeout=60, what="busy with progress and work owed before the freeze", after=t0)
        assert not load.done(), "the load ended before the freeze"
        with freeze(kit, load) as fault:
            stuck = watcher.wait_for(lambda s: s.state == "stuck", timeout=settings.stuck_after + 2 * settings.unanswered_poll_s + 30,
                                     what="stuck", after=fault.t)
            drill.detected(f"{fault.what} to stuck", detection_seconds(stuck, fault.t))
            seen = while_stuck(fault) if while_stuck else {}
            load.stop()  # the requests held by the freeze finish after it; no new ones
            t_thaw = time.time()
        recovered = watcher.wait_for(lambda s: s.state in engine.recovered_states, timeout=60,
                                     what=f"{' or '.join(engine.recovered_states)} after the freeze", after=t_thaw)
        outcomes = engine.finish_load(kit, load)
    after, crash = settle(kit)

    run = FrozenRun(t0, fault, stuck, t_thaw, recovered, outcomes, after, crash, crashed_before, restarts_before, seen)
    frozen = run.window(kit)
    drill.timeline = watcher.timeline(t0)
    drill.canaries = {"sent": sum(canary_delta(frozen[0], frozen[-1]).values()), "by_result": canary_delta(frozen[0], after)}
    drill.facts = {
        **fault.facts,
        "stopped_after_load_start_s": round(fault.t - t0, 1),
        "stuck_reason": stuck.reason,
        "stuck_detected_s": drill.detection["seconds"] if drill.detection else None,
        "stopped_for_s": round(t_thaw - fault.t, 1),
        "recovered_s": round(recovered.t - t_thaw, 1),
        "recovered_state": recovered.state,
        "restarts_total_delta": kit.exporter.restarts_total() - restarts_total_before,
        "statuses": dict(Counter(str(o.status) for o in outcomes)),  # None: no answer at all
    }
    return run


def kill(kit: Kit, drill: Drill) -> None:
    """SIGKILL of the engine under load: `down` with a reason, and still down; the in-flight requests fail."""
    engine, watcher, server = kit.engine, kit.watcher, kit.server
    crashed_before = kit.relaunch_if_crashed()
    t0, t_kill, load = kill_under_load(kit, engine.kill_target)
    with load:
        # For a moment the server may still answer from the dead engine's state: keep that page.
        kit.save_page("after-kill", timeout=1.0)
        # A refused read is `down` at once; an engine whose port still accepts for a while (its
        # children exiting) is `down` once no read was good for down_after: the bound covers both.
        down = watcher.wait_for(lambda s: s.state == "down", timeout=engine.exporter.down_after + engine.down_within_s,
                                what="down", after=t_kill)
        drill.detected("SIGKILL to down", detection_seconds(down, t_kill))
        exit_status = server.wait_exit(timeout=engine.down_within_s) if engine.kill_exits else server.returncode
        outcomes = load.wait(timeout=120)
    gone_s = wait_until(lambda: not server.leftovers(), timeout=20, every=0.5)
    still_down = kit.later(3)

    samples = watcher.since(t0)
    drill.timeline = watcher.timeline(t0)
    drill.canaries = canaries(samples[0], samples[-1])
    drill.facts = {
        "reason": down.reason,
        "exit_status": exit_status,
        "in_flight_statuses": dict(Counter(str(o.status) for o in outcomes)),
        "killed_after_load_start_s": round(t_kill - t0, 1),
        "processes_gone_by_themselves_s": gone_s,
    }
    note_crashes(kit, drill, crashed_before, None)
    server.stop()  # whatever is left, by PID
    assert down.reason, "down without a reason"
    if engine.kill_reason:
        assert down.reason == engine.kill_reason, down
    assert still_down.state == "down", drill.timeline
    if engine.kill_exits:
        assert exit_status is not None, f"{engine.name}'s main process outlived the kill by {engine.down_within_s:.0f} s"
        if engine.kill_exit_status is not None:
            assert exit_status == engine.kill_exit_status, drill.facts
    failed = [failed_status(o, engine.kill_failed) for o in outcomes]
    drill.facts["in_flight_failed"] = sum(failed)
    if engine.kill_fails_all:
        assert all(failed), drill.facts
    else:
        # None failed only where the engine had already finished every request the clients still awaited:
        # on a quiet 2-core box vLLM's API server lagged its engine so far that all 27 came back 200
        # after the kill. Then the kill hit no work; its failures are not asserted, only recorded.
        assert any(failed) or all(o.status == 200 for o in outcomes), drill.facts


def restart(kit: Kit, drill: Drill) -> None:
    """A restart on the same port(s): exactly one restart counted (API and metric alike), then idle and a good canary."""
    engine, watcher, server = kit.engine, kit.watcher, kit.server
    server.stop()  # the kill drill left it down; a no-op then
    before = watcher.wait_for(lambda s: s.state == "down", timeout=60, what="down before the restart", after=time.time())
    restarts_total_before = kit.exporter.restarts_total()
    t_launch = time.time()
    startup_s = engine.restart(server)
    t_ready = time.time()
    kit.save_page("restarted-idle")
    counted = watcher.wait_for(lambda s: (s.restarts or 0) > (before.restarts or 0), timeout=60,
                               what="a restart counted", after=t_launch)
    drill.detected("ready to restart counted", max(0.0, counted.t - t_ready))
    idle = watcher.wait_for(lambda s: s.state == "idle", timeout=60, what="idle after the restart", after=t_ready)
    ok = watcher.wait_for(
        lambda s: s.canaries.get("ok", 0) > before.canaries.get("ok", 0),
        timeout=engine.exporter.canary_interval + engine.exporter.canary_timeout + 30,
        what="a successful canary after the restart",
        after=t_ready,
    )
    if engine.restart_waits_for_idle:  # the canary may still show as one request processing
        later = watcher.wait_for(lambda s: s.state == "idle", timeout=60, what="idle after the canary", after=ok.t)
    else:
        later = kit.later(3 * engine.exporter.poll_interval)

    drill.timeline = watcher.timeline(t_launch)
    drill.canaries = canaries(before, later)
    drill.facts = {
        "startup_seconds": startup_s,
        **start_extras(server.starts[-1]),
        "restarts_before": before.restarts,
        "restarts_after": later.restarts,
        "idle_after_ready_s": round(idle.t - t_ready, 1),
        "canary_ok_after_ready_s": round(ok.t - t_ready, 1),
        "restarts_total_delta": kit.exporter.restarts_total() - restarts_total_before,
    }
    assert (later.restarts or 0) - (before.restarts or 0) == 1, drill.facts
    assert drill.facts["restarts_total_delta"] == 1, "llm_vitals_restarts_total disagrees with the API"
    assert later.state == "idle", drill.timeline
    assert canary_delta(before, later).get("error", 0) == 0


def kill_under_load(kit: Kit, victim_of: Callable[[ServerProcess], psutil.Process]) -> tuple[float, float, Load]:
    """From idle, start the engine's fault load and SIGKILL `victim_of(server)` once the engine's page shows it.

    Returns when the load began, when the kill was sent, and the load (it sends nothing after the
    kill: the requests in flight are the ones the kill hits).
    """
    kit.wait_idle()
    t0 = time.time()
    load = kit.engine.fault_load(kit.server)
    try:
        kit.wait_working(load)
        kit.save_page("busy-before-kill")
        victim = victim_of(kit.server)
        assert not load.done(), "the load ended before the SIGKILL"
    except BaseException:
        load.cancel()
        raise
    load.stop()
    t_kill = time.time()
    victim.kill()  # SIGKILL
    return t0, t_kill, load


def settle(kit: Kit) -> tuple[Sample, str | None]:
    """After a fault: the first idle sample, or a `down` one with the engine's own crash as the reason (else None)."""
    after = kit.watcher.wait_for(lambda s: s.state in ("idle", "down"), timeout=90, what="idle after the load (or down)",
                                 after=time.time())
    return after, kit.engine.crash(kit.server) if after.state == "down" else None


def note_crashes(kit: Kit, drill: Drill, before: str | None, after: str | None) -> None:
    """Record the engine's own crashes around a drill (a known upstream bug: the exporter rightly reads it down),
    and launch the server again after one, so the drills after it run."""
    if before is not None:
        drill.facts["crashed_before"] = before
    if after is not None:
        drill.facts["crashed_after_the_fault"] = after
        kit.relaunch_if_crashed()


def stuck_bound(kit: Kit, reason: str | None) -> float:
    """The latest a stuck verdict may come after the fault: stuck_after plus two polls, each as long as
    its /metrics read can last (its timeout while the read is accepted and never answered)."""
    settings = kit.engine.exporter
    poll = settings.unanswered_poll_s if reason == "metrics_unanswered" else settings.poll_interval
    return settings.stuck_after + 2 * poll + DETECTION_SLACK_S


def clients_waited(outcomes: list[Outcome]) -> int:
    """The answered requests that took twice the fastest one or longer: sent at once to a full server,
    they waited for a slot, wherever they waited (0 when there were slots for all)."""
    seconds = [o.seconds for o in outcomes if o.status == 200]
    return sum(1 for s in seconds if s >= 2 * min(seconds)) if seconds else 0


def failed_status(outcome: Outcome, failed: frozenset[int | None] | None) -> bool:
    return outcome.status != 200 if failed is None else outcome.status in failed


def start_extras(start: dict) -> dict:
    """What a start's record says beyond its time, PID and log (llama.cpp's loading answer, vLLM's keep-alive)."""
    return {k: v for k, v in start.items() if k not in ("seconds", "pid", "log")}
