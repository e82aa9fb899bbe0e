"""Fault drills: the exporter (poll 1 s, stuck_after 10 s) judged against a real Triton 2.51.

The drills are the kit's (tests/real_engine/drills.py), run with this tier's engine (engine.py), in
file order on one server and one exporter: smoke, idle canaries, saturation, frozen worker (SIGSTOP
of the PyTriton Python process, HTTP alive), frozen tritonserver (every port accepts, none answers),
kill (SIGKILL of tritonserver), restart on the same ports, and a second model loaded, then
unloaded and two more loaded under load (no restart). Triton's Python backend sometimes crashes
by itself after a frozen worker is resumed (TritonServer.crash): the drill records it and launches
Triton again so the drills after it run.
"""

from __future__ import annotations

import signal
import time

import httpx
from real_engine import drills
from real_engine.engine import Kit, wait_until
from real_engine.load import Load
from real_engine.report import Drill

from .engine import CONCURRENCY, INFER, LOAD_TOKENS
from .triton_server import EXTRA_MODELS, infer_body


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
