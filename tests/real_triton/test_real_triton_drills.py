"""Fault drills: the exporter (poll 1 s, stuck_after 10 s) judged against a real Triton 2.51.

The drills are the kit's (tests/real_engine/drills.py), run with this tier's engine (engine.py), in
file order on one server and one exporter: smoke, idle canaries, saturation, frozen worker (SIGSTOP
of the PyTriton Python process, HTTP alive), frozen tritonserver (every port accepts, none answers),
kill (SIGKILL of tritonserver), restart on the same ports, a second model loaded, then
unloaded and two more loaded under load (no restart), and one model wedged in its own code while
another model serves (stuck, the model named: issue 29), and a decoupled (streaming) model idle and
hung, watched by an exporter of its own (issue 38). Triton's Python backend sometimes crashes
by itself after a frozen worker is resumed (TritonServer.crash): the drill records it and launches
Triton again so the drills after it run.
"""

from __future__ import annotations

import signal
import time
from dataclasses import replace

import httpx
from real_engine import drills
from real_engine.engine import Kit, wait_until
from real_engine.harness import ExporterProcess, Watcher
from real_engine.load import Load
from real_engine.report import Drill

from .engine import CONCURRENCY, INFER, LOAD_TOKENS
from .triton_server import (
    EXTRA_MODELS,
    HOLD_SIGNAL,
    MODEL,
    RELEASE_SIGNAL,
    STREAM,
    STREAM_BIND_SIGNAL,
    STREAM_HOLD_SIGNAL,
    STREAM_RELEASE_SIGNAL,
    infer_body,
)


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


def test_models_loaded_and_unloaded_under_load_are_no_restart(kit: Kit, drill: Drill):
    """Issue 23, part 7: a second model loaded and given work, then, while the first is saturated, unloaded,
    and two more loaded. Their series come and go (the sums over models fall): no restart, and the
    saturated model is never stuck, down or idle meanwhile. The pages of each step are kept
    (logs/pages/), the real counterparts of tests/test_engine_triton.py's transformed ones, where
    new versions of one model are table-tested (PyTriton 0.7.0 cannot serve two versions of a name)."""
    server, watcher = kit.server, kit.watcher
    kit.relaunch_if_crashed()
    kit.wait_idle()
    worker = server.main_process()  # the PyTriton process: it takes the load and unload orders (toy_lm_server.py)
    b, c, d = EXTRA_MODELS
    restarts_before = kit.exporter.restarts_total()

    def ready(name: str) -> bool:
        """Triton's own word that the model serves (its series show while it loads)."""
        try:
            return httpx.get(f"{server.url}/v2/models/{name}/ready", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    def counted(name: str) -> str:
        # Triton 2.51 drops an unloaded model's series but its request_failure ones, which stay as they were.
        return f'nv_inference_exec_count{{model="{name}"'

    def order(sig: signal.Signals, name: str, loaded: bool) -> float:
        began = time.time()
        worker.send_signal(sig)
        kit.wait_page(lambda page: (counted(name) in page) is loaded, f"{name} {'on' if loaded else 'gone from'} the page",
                      timeout=180)
        if loaded:
            assert wait_until(lambda: ready(name), timeout=180, every=0.5) is not None, f"{name} never ready"
        return round(time.time() - began, 1)

    facts = {"load_b_s": order(signal.SIGUSR1, b, loaded=True)}
    for _ in range(3):  # its own counters count: their fall at the unload would read as a reset
        answer = httpx.post(f"{server.url}/v2/models/{b}/infer", json=infer_body(2), timeout=60)
        assert answer.status_code == 200, answer.text
    kit.save_page("two-models")
    t0 = time.time()
    load = Load.sustained(server.url, INFER, lambda n: infer_body(LOAD_TOKENS), CONCURRENCY, max_seconds=240)
    with load:
        kit.wait_working(load)
        busy = watcher.wait_for(lambda s: s.state == "busy" and s.reason == "progress", timeout=60, what="busy with progress",
                                after=t0)
        facts["unload_b_s"] = order(signal.SIGUSR2, b, loaded=False)
        kit.save_page("model-unloaded")
        kit.later(3 * kit.engine.exporter.poll_interval)
        facts["load_c_s"] = order(signal.SIGUSR1, c, loaded=True)
        facts["load_d_s"] = order(signal.SIGUSR1, d, loaded=True)
        t_loaded = time.time()
        kit.save_page("models-loaded-again")
        kit.later(3 * kit.engine.exporter.poll_interval)
        t_stop = time.time()
        load.stop()
        outcomes = kit.engine.finish_load(kit, load)
    kit.wait_idle()
    # From the first busy read to the load's stop: before it the exporter may not have seen the load
    # yet, and after it the load drains to idle.
    polled = kit.exporter.polled_states(busy.t, t_stop)
    drill.timeline = watcher.timeline(t0)
    drill.facts = {**facts, "restarts_total_delta": kit.exporter.restarts_total() - restarts_before,
                   "states_polled": sorted({state for _, state in polled}), "polls": len(polled),
                   "idle_polls": sum(state == "idle" for _, state in polled),
                   "busy_polls_after_last_load": sum(state == "busy" for t, state in polled if t >= t_loaded),
                   "statuses": sorted({str(o.status) for o in outcomes})}
    assert drill.facts["restarts_total_delta"] == 0, "a model loaded or unloaded read as a restart"
    # `idle` is allowed, and only idle: binding a model runs in the PyTriton process that also carries
    # every response, and on a loaded 2-core box the load's queue drained to 0 for ~8 s while toy_lm_c
    # was bound (page: running 0, waiting 0, nothing moving: idle by the rule, rightly). What a model
    # coming or going must never do is read as stuck, down, a restart, or stop the load being read.
    assert set(drill.facts["states_polled"]) <= {"busy", "idle"}, drill.timeline
    assert drill.facts["busy_polls_after_last_load"] > 0, drill.timeline


def test_unit_frozen_one_model_beside_a_serving_one_is_stuck_naming_the_model(kit: Kit, drill: Drill):
    """Issue 29: each model (and version) is a unit. toy_lm wedged in its own code (its infer functions held,
    toy_lm_server.py's HOLD_SIGNAL) with requests queued at it, while another model completes its own
    requests: the sums over models keep moving, yet the target is `stuck` within stuck_after plus two
    polls, and the API's `unit` names toy_lm. Nothing is restarted, and toy_lm serves again once let go.

    Not a SIGSTOP of toy_lm's Python-backend stubs: Triton finds a stopped stub unhealthy within ~2 s
    and fails its requests (HTTP 500, "Stub process 'toy_lm_0_0' is not healthy"), so none stay
    queued; that is a failing model, not a frozen one (seen on this tier's first run of the drill).

    Runs after the models drill, which leaves toy_lm_c and toy_lm_d loaded; on a server relaunched
    since, the first extra model is loaded here (SIGUSR1, toy_lm_server.py)."""
    server, watcher, settings = kit.server, kit.watcher, kit.engine.exporter
    kit.relaunch_if_crashed()
    kit.wait_idle()
    page = kit.wait_page(lambda page: "nv_inference_exec_count" in page, "a page with a model")
    other = next((name for name in EXTRA_MODELS if f'nv_inference_exec_count{{model="{name}"' in page), None)
    if other is None:
        other = EXTRA_MODELS[0]
        server.main_process().send_signal(signal.SIGUSR1)
        kit.wait_page(lambda page: f'nv_inference_exec_count{{model="{other}"' in page, f"{other} on the page", timeout=180)
    assert wait_until(lambda: httpx.get(f"{server.url}/v2/models/{other}/ready", timeout=10).status_code == 200,
                      timeout=180, every=0.5) is not None, f"{other} never ready"
    worker = server.main_process()  # the PyTriton process, which runs the infer functions
    restarts_before = kit.exporter.restarts_total()
    unit = f'model="{MODEL}",version="1"'

    def completed(text: str, name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(f'nv_inference_exec_count{{model="{name}"'))

    def queued(text: str, name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(f'nv_inference_pending_request_count{{model="{name}"'))

    t0 = time.time()
    worker.send_signal(HOLD_SIGNAL)
    try:
        # A request past its last token when the hold came (an idle canary: one token) still completes:
        # the count to compare with is one a poll after the hold.
        kit.later(settings.poll_interval)
        before = kit.wait_page(lambda page: True, "a page once held")
        frozen = Load.sustained(server.url, INFER, lambda n: infer_body(LOAD_TOKENS), CONCURRENCY, max_seconds=240)
        serving = Load.sustained(server.url, f"/v2/models/{other}/infer", lambda n: infer_body(2), 2, max_seconds=240)
        with frozen, serving:
            stuck = watcher.wait_for(lambda s: s.state == "stuck", timeout=settings.stuck_after + 4 * settings.poll_interval + 30,
                                     what="stuck while another model serves", after=t0)
            kit.save_page("unit-frozen")
            during = kit.wait_page(lambda page: True, "a page while frozen")
            t_stuck = time.time()
            kit.later(2 * settings.poll_interval)
            held = watcher.wait_for(lambda s: True, timeout=30, what="a sample after stuck", after=t_stuck)
            worker.send_signal(RELEASE_SIGNAL)
            recovered = watcher.wait_for(lambda s: s.state == "busy", timeout=60, what="busy once let go", after=time.time())
            frozen.stop()
            serving.stop()
            outcomes = kit.engine.finish_load(kit, frozen) + kit.engine.finish_load(kit, serving)
    finally:
        worker.send_signal(RELEASE_SIGNAL)
    kit.wait_idle()
    drill.timeline = watcher.timeline(t0)
    drill.detected("hold to stuck", stuck.t - t0)
    drill.facts = {
        "other_model": other, "unit": stuck.unit, "stuck_detected_s": round(stuck.t - t0, 1),
        "stuck_after": settings.stuck_after,
        "other_completed_while_frozen": completed(during, other) - completed(before, other),
        "frozen_model_completed_while_frozen": completed(during, MODEL) - completed(before, MODEL),
        "frozen_model_queued_while_frozen": queued(during, MODEL),
        "state_after_stuck": held.state, "unit_after_stuck": held.unit, "recovered_s": round(recovered.t - t0, 1),
        "restarts_total_delta": kit.exporter.restarts_total() - restarts_before,
        "statuses": sorted({str(o.status) for o in outcomes}),
    }
    assert drill.facts["other_completed_while_frozen"] > 0, "the other model served nothing: the sums did not move"
    assert drill.facts["frozen_model_completed_while_frozen"] == 0, drill.facts
    assert drill.facts["frozen_model_queued_while_frozen"] > 0, drill.facts
    assert stuck.unit == unit, drill.facts
    assert (held.state, held.unit) == ("stuck", unit), drill.timeline
    assert drill.facts["stuck_detected_s"] <= settings.stuck_after + 4 * settings.poll_interval + 10, drill.facts
    assert drill.facts["restarts_total_delta"] == 0, "a frozen model is no restart"
    assert drill.facts["statuses"] == ["200"], drill.facts  # held, not failed: every request answered once let go


def test_decoupled_model_idle_canaries_on_generate_stream_and_hung_unjudgeable_never_restartable(kit: Kit, drill: Drill):
    """Issue 38: a decoupled model (PyTriton's generator, `decoupled=True`) bound on the running server and watched
    by an exporter of its own. Its infer route answers 501; the exporter reads its config, canaries it on its
    generate_stream route (the first event) and, with no signal of the model's own that moves mid-stream on the
    page, reads it `idle` / `unjudgeable`, the model named. Its generators then held (a hung streaming model):
    the canaries time out, more than failures_before_unresponsive of them, and it is never `unresponsive` (a
    restart) nor unready; let go, its canary answers again."""
    server = kit.server
    kit.relaunch_if_crashed()
    t0 = time.time()
    worker = server.main_process()
    worker.send_signal(STREAM_BIND_SIGNAL)

    def ready() -> bool:
        try:
            return httpx.get(f"{server.url}/v2/models/{STREAM}/ready", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    assert wait_until(ready, timeout=180, every=0.5) is not None, f"{STREAM} never ready"
    bound_s = round(time.time() - t0, 1)
    infer = httpx.post(f"{server.url}/v2/models/{STREAM}/infer", json=infer_body(1), timeout=30)
    # Short canaries, so that failures_before_unresponsive (3) of them time out within seconds.
    settings = replace(kit.engine.exporter, target="real-triton-stream", canary_timeout=2.0,
                       canary_request={"inputs": [{"name": "max_tokens", "shape": [1], "datatype": "INT32", "data": [1]}]})
    exporter = ExporterProcess(settings, server.url, kit.engine.log_dir,
                               target_keys={"metrics_url": server.metrics_url, "model": STREAM})
    exporter.start()
    try:
        with Watcher(exporter) as watcher:
            t1 = time.time()
            idle = watcher.wait_for(lambda s: s.canaries.get("ok", 0) >= 2 and s.state == "idle", timeout=60,
                                    what="two canaries answered, idle", after=t1)
            t_hold = time.time()
            worker.send_signal(STREAM_HOLD_SIGNAL)
            try:
                failed = watcher.wait_for(lambda s: s.canaries.get("timeout", 0) >= 4, timeout=60,
                                          what="four canaries timed out", after=t_hold)
                # The next idle read: between them the server reads busy while another model (toy_lm,
                # under the tier's own exporter's canaries) completes work, which is progress.
                held = watcher.wait_for(lambda s: s.state == "idle", timeout=30, what="an idle read after the timeouts",
                                        after=failed.t)
            finally:
                worker.send_signal(STREAM_RELEASE_SIGNAL)
            t_release = time.time()
            answered = watcher.wait_for(lambda s: s.canaries.get("ok", 0) > failed.canaries.get("ok", 0), timeout=60,
                                        what="a canary answered once let go", after=t_release)
            samples = watcher.since(t1)
            drill.timeline = watcher.timeline(t1)
    finally:
        exporter.stop()
    drill.facts = {
        "bound_s": bound_s, "infer_status": infer.status_code, "idle_reason": idle.reason, "unit": idle.unit,
        "canaries_ok_idle": idle.canaries.get("ok", 0), "hold_to_4_timeouts_s": round(failed.t - t_hold, 1),
        "state_held": held.state, "reason_held": held.reason, "ready_held": held.ready, "live_held": held.live,
        "states_seen": sorted({str(s.state) for s in samples}), "release_to_canary_ok_s": round(answered.t - t_release, 1),
        "wall_s": round(time.time() - t0, 1),
    }
    assert drill.facts["infer_status"] == 501, drill.facts  # what the plain canary got: a rejection now, never a failure
    assert (idle.reason, idle.unit) == ("unjudgeable", f'model="{STREAM}"'), drill.facts
    # Busy is another model's work moving (toy_lm's canaries); never a restartable or a down state.
    assert set(drill.facts["states_seen"]) <= {"starting", "idle", "busy"}, drill.timeline
    assert (held.state, held.reason, held.ready, held.live) == ("idle", "unjudgeable", 200, 200), drill.facts
