"""The starved-HTTP-threads drill (issue 38): llama-server with `--threads-http 2` under 6 clients,
judged by an exporter at the timings the product ships.

Each in-flight request holds one of llama-server's HTTP threads; with all of them held, a read of
`/metrics` (and the second probe) can wait behind the clients' requests. A server last seen
saturated is judged by `stuck_after` from its last progress, so it must read busy however long its
reads wait, and still read stuck once it really stops.
"""

from __future__ import annotations

import time
from collections import Counter
from itertools import pairwise

from real_engine.engine import sigstopped
from real_engine.harness import ExporterProcess, ExporterSettings, Sample, Watcher
from real_engine.launcher import ServerProcess
from real_engine.load import Load

from llm_vitals.exporter import settings as shipped

from .engine import LONG_GENERATION_TOKENS

HTTP_THREADS = 2
CLIENTS = 6
WINDOW_S = 180.0  # the issue's: never stuck for 3 minutes
SLACK_S = 5.0  # the exporter's poll jitter and a loaded box


def shipped_exporter() -> ExporterSettings:
    """The exporter's settings for this drill: every time the product's own default."""
    target, exporter, canary = (shipped.TargetSettings.model_fields, shipped.ExporterSettings.model_fields,
                                shipped.CanarySettings.model_fields)
    return ExporterSettings(
        target="real-llamacpp-starved", engine="llamacpp", stuck_after=target["stuck_after"].default,
        down_after=target["down_after"].default, poll_interval=exporter["poll_interval"].default,
        metrics_timeout=exporter["metrics_timeout"].default, canary_interval=canary["interval"].default,
        canary_timeout=canary["timeout"].default)


def working(sample: Sample) -> bool:
    return sample.state == "busy" and sample.reason == "progress" and (sample.running or 0) > 0


def saturated(sample: Sample) -> bool:
    return (sample.running or 0) > 0 and (sample.waiting or 0) > 0


def run(server: ServerProcess, exporter: ExporterProcess, watcher: Watcher) -> tuple[dict, Sample]:
    """The load for WINDOW_S from the first busy read, then SIGSTOP under it until stuck: (facts, the stuck sample)."""
    settings = exporter.settings
    body = {"prompt": "Once upon a time", "n_predict": LONG_GENERATION_TOKENS, "ignore_eos": True,
            "cache_prompt": False, "stream": True}
    t0 = time.time()
    errors_before, restarts_before = exporter.poll_errors(), exporter.restarts_total()
    with Load.sustained(server.url, "/completion", lambda n: body, concurrency=CLIENTS, max_seconds=WINDOW_S + 300) as load:
        # Not always saturated: cpp-httplib 0.58 adds a thread for a new connection only when none is idle at
        # that instant, so a burst of connections can leave some queued behind the held ones (seen: 1 of 6
        # requests admitted for minutes, the exporter's kept connection answered throughout).
        first = watcher.wait_for(working, timeout=120, what="busy with requests running", after=t0)
        time.sleep(max(0.0, first.t + WINDOW_S - time.time()))
        t_end = time.time()
        errors = {k: v - errors_before.get(k, 0.0) for k, v in exporter.poll_errors().items()}
        # Requests that ended in the window, by status (None: the connection failed): a client stops at its first failure.
        ended = dict(Counter(str(o.status) for o in load.outcomes))
        assert not load.done(), "the load ended before the window did"
        last = watcher.latest()
        with sigstopped(server.main_process()) as fault:
            bound = settings.stuck_after + 2 * settings.unanswered_poll_s + SLACK_S
            stuck = watcher.wait_for(lambda s: s.state == "stuck", timeout=bound + 30, what="stuck after SIGSTOP", after=fault.t)
        load.cancel()
    polled = exporter.polled_states(first.t, t_end)
    gaps = [b - a for (a, _), (b, _) in pairwise(polled)]
    return {
        "t0": t0,
        "http_threads": HTTP_THREADS, "clients": CLIENTS, "window_s": WINDOW_S,
        "exporter": {"stuck_after": settings.stuck_after, "down_after": settings.down_after,
                     "poll_interval": settings.poll_interval, "metrics_timeout": settings.metrics_timeout},
        "first_working_s": round(first.t - t0, 1),
        "running_waiting_seen": sorted({(s.running, s.waiting) for s in watcher.since(first.t) if s.t <= t_end}, key=str)[:10],
        "polled_while_starved": dict(Counter(state for _, state in polled)),
        "polls_while_starved": len(polled),
        "largest_poll_gap_s": round(max(gaps, default=0.0), 1),
        "poll_errors_while_starved": {k: v for k, v in errors.items() if v},
        "requests_ended_in_window": ended,
        "stuck_detected_s": round(stuck.t - fault.t, 1),
        "stuck_bound_s": bound,
        # Last read saturated: judged from its last progress (at most a poll and its jitter before the stop),
        # not after down_after. Not saturated: the frozen rule's down_after stands, and no floor.
        "saturated_at_stop": saturated(last),
        "stuck_floor_s": settings.stuck_after - settings.poll_interval * 1.1 - 1.0 if saturated(last) else 0.0,
        "restarts_total_delta": exporter.restarts_total() - restarts_before,
    }, stuck
