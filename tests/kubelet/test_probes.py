"""Drills 1-4: what the kubelet does with the shim's answers, on the chart's classic sidecar.

Each drill has a workload of its own (a copy of the chart's vLLM Deployment, tests/kubelet/
workloads.py) and they all run at once on the one cluster: the module fixture starts every drill in
a thread and each test waits for its own drill's record. Every wait watches state (the namespace's
watch in history.py, the shim's API, the node's Docker events); the only fixed durations are the
drills' own load periods.

1. long load: the server listens only after 90 s; never killed, Ready once it serves, within the
   startup budget of the manifest (startupProbe failureThreshold x periodSeconds);
2. saturation: a full batch for 3 minutes; no restart, no change in the Endpoints, no canary;
3. hang, in three forms under load: (a) the simulator's engine hung, (b) a real llama-server's
   engine loop frozen by ptrace (its HTTP threads answer on), (c) the simulator frozen whole by
   SIGSTOP (its port accepts, nothing answers, not even /metrics: the shim reads it `stuck`,
   `metrics_unanswered`); the kubelet restarts the server container, never the shim (a frozen
   server ignores SIGTERM: the grace period's SIGKILL ends it);
4. drain: `kubectl delete pod` runs the server's preStop hook, which drains the shim; the pod
   leaves the Endpoints before its server gets SIGTERM.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest
import yaml
from real_engine.engine import sigstopped
from real_llamacpp.engine import long_generations
from real_llamacpp.freeze_thread import frozen_thread

from llm_vitals.config import validate_document
from llm_vitals.demo.load import Load
from llm_vitals.exporter.settings import ExporterSettings

from .tier import Tier, restarts, since
from .workloads import SERVER, SHIM_STUCK_AFTER, Workload, find, llama_server, server_workload, simulator

LOAD_SECONDS = 90  # drill 1: the simulated weight load
SATURATION_SECONDS = 180  # drill 2
KILL_EVENT_SLACK_S = 1.0  # drill 5: how long before the daemon's SIGKILL event a `down` view may be the kill read
WORKLOADS = {
    "long-load": Workload("vllm-load", 8010, 9510, simulator(8010, load_seconds=LOAD_SECONDS)),
    "saturation": Workload("vllm-busy", 8020, 9520, simulator(8020)),
    "hang-sim": Workload("vllm-hang", 8030, 9530, simulator(8030)),
    "drain": Workload("vllm-drain", 8050, 9550, simulator(8050)),
    "frozen-whole": Workload("vllm-frozen", 8060, 9560, simulator(8060)),
}


def probe(tier: Tier, name: str) -> dict[str, Any]:
    """The server container's probe of that name, as deployed (the chart's vLLM Deployment's)."""
    server = find(tier.rendered, "Deployment", SERVER)["spec"]["template"]["spec"]["containers"][0]
    return server[name]


def budget(tier: Tier, name: str) -> float:
    p = probe(tier, name)
    return float(p.get("failureThreshold", 3) * p.get("periodSeconds", 10))


def endpoints_story(tier: Tier, pod: str, t0: float) -> list[tuple[float, str]]:
    return [(round(t - t0, 1), where) for t, where in tier.history.endpoints_of(pod)]


def libgomp() -> Path:
    found = next((p for p in (Path("/usr/lib/x86_64-linux-gnu/libgomp.so.1"), Path("/lib/x86_64-linux-gnu/libgomp.so.1"))
                  if p.exists()), None)
    assert found is not None, "no libgomp.so.1 (the llama.cpp build links it)"
    return found.resolve()


# -- the drills ----------------------------------------------------------------------------------------


def drill_long_load(tier: Tier) -> dict[str, Any]:
    w = WORKLOADS["long-load"]
    applied = tier.deploy(w)
    startup_budget = budget(tier, "startupProbe")
    pod = tier.wait_ready(w.name, LOAD_SECONDS + startup_budget)
    status = tier.pod(pod.name)["status"]
    [server] = [c for c in status["containerStatuses"] if c["name"] == "vllm"]
    started = calendar.timegm(time.strptime(server["state"]["running"]["startedAt"], "%Y-%m-%dT%H:%M:%SZ"))
    seen_started = tier.first(w.name, pod.name, lambda p: p.started.get("vllm"))
    # The pod's containers are in its own node's dockerd (two kubelets once shared one dockershim socket).
    tier.cluster.docker(tier.node_index(pod.node), "inspect", tier.container_id(pod.name, "vllm"))
    return {
        "pod": pod.name, "node": pod.node, "applied_to_ready_s": round(pod.at - applied, 1),
        "container_start_to_ready_s": round(pod.at - started, 1), "load_s": LOAD_SECONDS,
        "startup_probe_passed_s": since(started, seen_started), "startup_budget_s": startup_budget,
        "restarts": restarts(pod), "endpoints": endpoints_story(tier, pod.name, applied),
        "headline": f"servable after {LOAD_SECONDS} s, Ready {pod.at - started:.1f} s after the container started "
                    f"(budget {startup_budget:.0f} s), restarts {restarts(pod)}",
    }


def _in_loop(body: Callable[[aiohttp.ClientSession], Any]) -> Any:
    """Run an async body with its own client session, in this thread's own event loop."""
    async def main() -> Any:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            return await body(session)
    return asyncio.run(main())


def drill_saturation(tier: Tier) -> dict[str, Any]:
    w = WORKLOADS["saturation"]
    applied = tier.deploy(w)
    pod = tier.wait_ready(w.name, 240)
    shim_url = tier.url(pod.node, w.shim_port)
    server_url = tier.url(pod.node, w.server_port)

    async def body(session: aiohttp.ClientSession) -> dict[str, Any]:
        load = Load(session, server_url, workers=8, max_tokens=1500)  # 4 slots: 4 running, 4 waiting
        load.start()
        try:
            def full() -> bool:
                view = tier.shim(pod.node, w.shim_port)
                return bool(view and view["state"] == "busy" and (view.get("waiting") or 0) > 0)
            await asyncio.to_thread(tier.history.wait, full, 60, "the shim to read a full batch (busy, waiting > 0)", 1)
            canaries_before = tier.metric(shim_url, "llm_vitals_canary_requests_total")
            began = time.time()
            states: dict[str, int] = {}
            ready_answers: dict[bool, int] = {}
            while time.time() - began < SATURATION_SECONDS:
                view = await asyncio.to_thread(tier.shim, pod.node, w.shim_port)
                if view:
                    states[view["state"]] = states.get(view["state"], 0) + 1
                    ready_answers[view["ready"]] = ready_answers.get(view["ready"], 0) + 1
                await asyncio.to_thread(tier.history.pause, 2)
            ended = time.time()
            canaries = tier.metric(shim_url, "llm_vitals_canary_requests_total") - canaries_before
        finally:
            await load.stop()
        return {"began": began, "ended": ended, "states": states, "ready_answers": ready_answers, "canaries": canaries}

    window = _in_loop(body)
    last = tier.history.latest(w.name)[pod.name]
    changes = [(t, where) for t, where in tier.history.endpoints_of(pod.name) if window["began"] <= t <= window["ended"]]
    return {
        "pod": pod.name, "node": pod.node, "held_s": round(window["ended"] - window["began"], 1),
        "shim_states": window["states"], "shim_ready": window["ready_answers"], "canaries": window["canaries"],
        "restarts": restarts(last), "endpoint_changes_in_window": changes,
        "endpoints": endpoints_story(tier, pod.name, applied),
        "headline": f"{window['ended'] - window['began']:.0f} s saturated: restarts {restarts(last)}, "
                    f"{len(changes)} Endpoints changes, {window['canaries']:.0f} canaries, shim states {window['states']}",
    }


def _hang_record(tier: Tier, w: Workload, pod_name: str, node: str, applied: float, wedged: float,
                 restarted_at: float, shim_id_before: str, views: list[tuple[float, dict]]) -> dict[str, Any]:
    liveness = probe(tier, "livenessProbe")
    live_budget = 2 * SHIM_STUCK_AFTER  # the shim's liveness_budget default: 2 x stuck_after
    expected = live_budget + liveness["failureThreshold"] * liveness["periodSeconds"]
    first_stuck = next((t for t, v in views if v["state"] == "stuck"), None)
    first_not_live = next((t for t, v in views if not v["live"]), None)
    last = tier.history.latest(w.name)[pod_name]
    unhealthy = tier.events(pod_name, "Unhealthy")
    killing = tier.events(pod_name, "Killing")
    return {
        "pod": pod_name, "node": node, "wedge_to_stuck_s": since(wedged, first_stuck),
        "wedge_to_live_503_s": since(wedged, first_not_live),
        "wedge_to_server_restart_s": round(restarted_at - wedged, 1),
        "expected_s": f"liveness budget {live_budget:g} + {liveness['failureThreshold']} x {liveness['periodSeconds']} s "
                      f"= {expected:g}, + up to one period, + the preStop hook's 15 s wait before SIGTERM",
        "restarts": restarts(last), "shim_container_unchanged": tier.container_id(pod_name, "vitals-shim") == shim_id_before,
        "events": sorted({f"{e['reason']}: {e['message'][:120]}" for e in unhealthy + killing}),
        "endpoints": endpoints_story(tier, pod_name, applied),
    }


def _after_restart(tier: Tier, w: Workload, pod_name: str, node: str, wedged: float) -> dict[str, Any]:
    """Whether the server serves again (the shim's view: restarts counted, idle or busy) and the pod
    turns Ready again; None for what did not happen within two minutes (the test says so)."""
    def counted() -> dict | None:
        view = tier.shim(node, w.shim_port)
        return view if view and view["restarts"] >= 1 and view["state"] in ("idle", "busy") else None

    def ready_again() -> float | None:
        return next((p.at for p in tier.history.live(w.name) if p.name == pod_name and p.ready
                     and restarts(p).get("vllm", 0) >= 1), None)

    after: dict[str, Any] = {"shim_restarts": None, "state_after": None, "draining_after": None, "wedge_to_ready_again_s": None}
    with contextlib.suppress(AssertionError):
        view = tier.history.wait(counted, 120, "the shim to see the restarted server serve")
        after |= {"shim_restarts": view["restarts"], "state_after": view["state"]}
    with contextlib.suppress(AssertionError):
        after["wedge_to_ready_again_s"] = round(tier.history.wait(ready_again, 120, f"{pod_name} Ready again") - wedged, 1)
        # The endpoints controller follows the pod's Ready condition a moment later.
        tier.history.wait(lambda: tier.history.endpoints_of(pod_name)[-1][1] == "ready", 60, f"{pod_name} back in the Endpoints")
    if tier.history.cancelled.is_set():
        raise AssertionError("cancelled: the run is being torn down")
    view = tier.shim(node, w.shim_port)
    after["draining_after"] = view.get("draining") if view else None
    after["restarts"] = restarts(tier.history.latest(w.name)[pod_name])
    return after


def drill_hang_simulator(tier: Tier) -> dict[str, Any]:
    w = WORKLOADS["hang-sim"]
    applied = tier.deploy(w)
    pod = tier.wait_ready(w.name, 240)
    shim_id = tier.container_id(pod.name, "vitals-shim")
    server_url = tier.url(pod.node, w.server_port)
    views: list[tuple[float, dict]] = []

    async def body(session: aiohttp.ClientSession) -> tuple[float, float]:
        load = Load(session, server_url, workers=6, max_tokens=1500)
        load.start()
        try:
            await asyncio.to_thread(tier.history.wait, lambda: (v := tier.shim(pod.node, w.shim_port)) and v["state"] == "busy",
                                    60, "busy under load", 1)
            async with session.post(f"{server_url}/admin/fault", json={"fault": "hang"}) as answer:
                assert answer.status == 200, await answer.text()
            wedged = time.time()
            restarted = await asyncio.to_thread(_watch_until_restart, tier, w, pod.name, pod.node, views, 600)
        finally:
            await load.stop()
        return wedged, restarted

    wedged, restarted = _in_loop(body)
    record = _hang_record(tier, w, pod.name, pod.node, applied, wedged, restarted, shim_id, views)
    record |= _after_restart(tier, w, pod.name, pod.node, wedged)
    record["endpoints"] = endpoints_story(tier, pod.name, applied)
    record["headline"] = (f"simulator hung: server restarted {record['wedge_to_server_restart_s']} s after the wedge "
                          f"({record['expected_s']}); restarts {record['restarts']}; shim counted {record['shim_restarts']}; Ready again "
                          f"{record['wedge_to_ready_again_s']} s after the wedge")
    return record


def _watch_until_restart(tier: Tier, w: Workload, pod: str, node: str, views: list[tuple[float, dict]],
                         timeout: float) -> float:
    """Read the shim every second until the watch sees the server's restartCount go up; when it did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        at = tier.first(w.name, pod, lambda p: p.restarts.get("vllm", 0) >= 1)
        if at is not None:
            return at
        view = tier.shim(node, w.shim_port, timeout=2)
        if view:
            views.append((time.time(), view))
        tier.history.pause(1)
    raise AssertionError(f"{pod}: the server was not restarted within {timeout:g} s; shim: {views[-1:]}")


def drill_hang_llamacpp(tier: Tier, binary: Path, model: Path) -> dict[str, Any]:
    w = Workload("llama-hang", 8040, 9540, llama_server(8040, binary, model, libgomp()))
    applied = tier.deploy(w)
    pod = tier.wait_ready(w.name, 240)
    shim_id = tier.container_id(pod.name, "vitals-shim")
    server_id = tier.container_id(pod.name, "vllm")
    pid = tier.host_pid(pod.node, server_id)
    server_url = tier.url(pod.node, w.server_port)
    views: list[tuple[float, dict]] = []
    with long_generations(server_url, 6):
        tier.history.wait(lambda: (v := tier.shim(pod.node, w.shim_port)) and v["state"] == "busy", 60,
                          "llama-server busy under load", 1)
        # The engine loop (the main thread, the container's PID 1) stops; its HTTP threads answer on.
        with frozen_thread(pid, 900) as wedged:
            restarted = _watch_until_restart(tier, w, pod.name, pod.node, views, 600)
    record = _hang_record(tier, w, pod.name, pod.node, applied, wedged, restarted, shim_id, views)
    record |= _after_restart(tier, w, pod.name, pod.node, wedged) | {"frozen_pid": pid}
    record["endpoints"] = endpoints_story(tier, pod.name, applied)
    record["headline"] = (f"llama-server's engine loop frozen (ptrace): server restarted "
                          f"{record['wedge_to_server_restart_s']} s after the freeze; restarts {record['restarts']}; "
                          f"shim counted {record['shim_restarts']}; Ready again {record['wedge_to_ready_again_s']} s after it")
    return record


def drill_frozen_whole(tier: Tier) -> dict[str, Any]:
    w = WORKLOADS["frozen-whole"]
    applied = tier.deploy(w)
    pod = tier.wait_ready(w.name, 240)
    shim_id, server_id = tier.container_id(pod.name, "vitals-shim"), tier.container_id(pod.name, "vllm")
    # The simulator is the container's PID 1 (no shell: simulator() execs it), so this is the whole server.
    server = psutil.Process(tier.host_pid(pod.node, server_id))
    server_url = tier.url(pod.node, w.server_port)
    views: list[tuple[float, dict]] = []

    async def body(session: aiohttp.ClientSession) -> tuple[float, float]:
        load = Load(session, server_url, workers=2, max_tokens=1500)
        load.start()
        try:
            await asyncio.to_thread(tier.history.wait, lambda: (v := tier.shim(pod.node, w.shim_port)) and v["state"] == "busy",
                                    60, "busy under load", 1)
            # The stopped process is SIGCONTed on the way out only if it is still the one stopped
            # (psutil checks its start time); after the restart it is gone, killed by the kubelet.
            with sigstopped(server) as fault:
                restarted = await asyncio.to_thread(_watch_until_restart, tier, w, pod.name, pod.node, views, 600)
        finally:
            await load.stop()
        return fault.t, restarted

    frozen, restarted = _in_loop(body)
    record = _hang_record(tier, w, pod.name, pod.node, applied, frozen, restarted, shim_id, views)
    stuck_reasons = sorted({v["reason"] for _, v in views if v["state"] == "stuck"})
    signals = [(float(e["timeNano"]) / 1e9, e["Actor"]["Attributes"].get("signal"))
               for e in tier.docker_events(pod.node, server_id, frozen - 1) if e.get("Action") == "kill"]
    kills = [(round(t - frozen, 1), sig) for t, sig in signals]
    sigkill = next((t for t, sig in signals if sig == "9"), restarted)
    # `down` before the SIGKILL would be a frozen server read as gone, which liveness never acts on.
    # The daemon logs its kill event after it sends the signal, and a view's time is when the shim's
    # answer came back, so a view within KILL_EVENT_SLACK_S of the event may already be the kill read
    # (CI once saw a `refused` view in the same tenth of a second as the event). The freeze it guards against
    # lasted minutes before the SIGKILL.
    down_before_kill = [(round(t - frozen, 1), v["reason"]) for t, v in views
                        if v["state"] == "down" and t < sigkill - KILL_EVENT_SLACK_S]
    record |= {"stuck_reasons": stuck_reasons, "down_before_kill": down_before_kill, "server_kills": kills}
    record |= _after_restart(tier, w, pod.name, pod.node, frozen)
    record["endpoints"] = endpoints_story(tier, pod.name, applied)
    record["headline"] = (f"simulator SIGSTOPped whole: stuck ({', '.join(stuck_reasons)}) {record['wedge_to_stuck_s']} s "
                          f"after the freeze, /live failing at {record['wedge_to_live_503_s']} s, server restarted at "
                          f"{record['wedge_to_server_restart_s']} s (kills {kills}); restarts {record['restarts']}; "
                          f"Ready again {record['wedge_to_ready_again_s']} s after the freeze")
    return record


def drill_drain(tier: Tier) -> dict[str, Any]:
    w = WORKLOADS["drain"]
    applied = tier.deploy(w)
    pod = tier.wait_ready(w.name, 240)
    server_id, shim_id = tier.container_id(pod.name, "vllm"), tier.container_id(pod.name, "vitals-shim")
    draining_seen: list[float] = []
    stop = threading.Event()

    def read_drain() -> None:
        while not stop.is_set():
            view = tier.shim(pod.node, w.shim_port, timeout=1)
            if view and view.get("draining"):
                draining_seen.append(time.time())
            if stop.wait(0.3) or tier.history.cancelled.is_set():
                return

    reader = threading.Thread(target=read_drain, daemon=True)
    reader.start()
    deleted = time.time()
    tier.cluster.kubectl("delete", "pod", "-n", "llm", pod.name, "--wait=false")
    gone = tier.history.wait(lambda: next((p.at for p in tier.history.of_workload(w.name)
                                           if p.name == pod.name and p.event == "DELETED"), None),
                             120, f"{pod.name} deleted")
    stop.set()
    reader.join(timeout=5)
    events = tier.docker_events(pod.node, server_id, deleted - 1) + tier.docker_events(pod.node, shim_id, deleted - 1)
    kills = sorted((float(e["timeNano"]) / 1e9, e["Actor"]["ID"] == server_id, e["Actor"]["Attributes"].get("signal"))
                   for e in events if e.get("Action") == "kill")
    server_term = next((t for t, is_server, sig in kills if is_server and sig == "15"), None)
    shim_term = next((t for t, is_server, sig in kills if not is_server and sig == "15"), None)
    left_endpoints = next((t for t, where in tier.history.endpoints_of(pod.name) if t >= deleted and where != "ready"), None)
    failed_hooks = tier.events(pod.name, "FailedPreStopHook")
    return {
        "pod": pod.name, "node": pod.node, "left_endpoints_s": since(deleted, left_endpoints),
        "first_seen_draining_s": since(deleted, draining_seen[0] if draining_seen else None),
        "server_sigterm_s": since(deleted, server_term), "shim_sigterm_s": since(deleted, shim_term),
        "pod_gone_s": round(gone - deleted, 1), "kills": [(round(t - deleted, 1), "server" if s else "shim", sig)
                                                          for t, s, sig in kills],
        "failed_prestop_hooks": [e["message"] for e in failed_hooks],
        "endpoints": endpoints_story(tier, pod.name, applied),
        "headline": f"deleted at 0: out of the Endpoints at {since(deleted, left_endpoints)} s, shim draining at "
                    f"{since(deleted, draining_seen[0] if draining_seen else None)} s, server SIGTERM at "
                    f"{since(deleted, server_term)} s, shim SIGTERM at {since(deleted, shim_term)} s",
    }


# -- running them side by side -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def drills(tier: Tier) -> Iterator[dict[str, Future]]:
    binary, model = (Path(p) for p in (_required_env("LLM_VITALS_LLAMACPP_BIN"), _required_env("LLM_VITALS_LLAMACPP_MODEL")))
    began = time.time()
    pool = ThreadPoolExecutor(6, thread_name_prefix="drill")
    futures = {
        "long-load": pool.submit(drill_long_load, tier),
        "saturation": pool.submit(drill_saturation, tier),
        "hang-sim": pool.submit(drill_hang_simulator, tier),
        "hang-llamacpp": pool.submit(drill_hang_llamacpp, tier, binary, model),
        "drain": pool.submit(drill_drain, tier),
        "frozen-whole": pool.submit(drill_frozen_whole, tier),
    }
    try:
        yield futures
    finally:
        if not all(f.done() for f in futures.values()):
            tier.history.cancel()  # a test failed or the run was interrupted: end the drills' waits now
        pool.shutdown(wait=True)
    tier.report.facts["probe drills s"] = round(time.time() - began, 1)
    for name in ("vllm-load", "vllm-busy", "vllm-hang", "llama-hang", "vllm-drain", "vllm-frozen"):
        tier.cluster.kubectl("delete", "deployment", "-n", "llm", name, "--ignore-not-found", "--wait=false", check=False)


def _required_env(name: str) -> str:
    import os

    value = os.environ.get(name, "")
    assert value, f"{name} is not set; run `make test-kubelet`"
    return value


def result(drills: dict[str, Future], name: str, tier: Tier) -> dict[str, Any]:
    try:
        record = drills[name].result(timeout=1200)
    except BaseException as exc:
        tier.report.drill(name, {"headline": f"FAILED: {exc!r}"[:300]})
        raise
    tier.report.drill(name, record)
    print(f"\n{name}: {record}")
    return record


def test_long_load_is_never_killed_and_turns_ready_once_it_serves(drills, tier):
    record = result(drills, "long-load", tier)
    assert record["restarts"] == {"vllm": 0, "vitals-shim": 0}
    # Ready only once the server listens, and well within the manifest's startup budget.
    assert LOAD_SECONDS <= record["container_start_to_ready_s"] <= record["startup_budget_s"]
    assert record["endpoints"][-1][1] == "ready"


def test_saturation_for_three_minutes_gives_no_restart_no_endpoint_change_no_canary(drills, tier):
    record = result(drills, "saturation", tier)
    assert record["held_s"] >= SATURATION_SECONDS
    assert record["restarts"] == {"vllm": 0, "vitals-shim": 0}
    assert record["endpoint_changes_in_window"] == []
    assert record["canaries"] == 0
    assert set(record["shim_states"]) == {"busy"} and set(record["shim_ready"]) == {True}


@pytest.mark.parametrize("engine", ["hang-sim", "hang-llamacpp"])
def test_a_hung_engine_restarts_the_server_container_and_never_the_shim(drills, tier, engine):
    record = result(drills, engine, tier)
    assert record["restarts"] == {"vllm": 1, "vitals-shim": 0}
    assert record["shim_container_unchanged"]
    assert record["shim_restarts"] == 1 and record["state_after"] in ("idle", "busy")
    # The preStop drain ran on the liveness restart too; the restarted server is not draining.
    assert record["draining_after"] is False and record["wedge_to_ready_again_s"] is not None
    assert any("Liveness probe failed" in e for e in record["events"]), record["events"]
    liveness = probe(tier, "livenessProbe")
    floor = 2 * SHIM_STUCK_AFTER + (liveness["failureThreshold"] - 1) * liveness["periodSeconds"]
    assert record["wedge_to_server_restart_s"] >= floor
    # The pod left the ready Endpoints while stuck, and came back once the new server served.
    wheres = [where for _, where in record["endpoints"]]
    assert "not ready" in wheres and wheres[-1] == "ready"


def _shim_settings(tier: Tier, w: Workload) -> ExporterSettings:
    """The shim's settings as deployed for `w` (its ConfigMap, validated by the exporter's own model;
    its token file is only in the pod, and no figure here depends on it)."""
    config = next(d for d in server_workload(tier.rendered, w, tier.image) if d["kind"] == "ConfigMap")
    return validate_document(ExporterSettings, yaml.safe_load(config["data"]["exporter.yaml"]), f"{w.name}-shim")


def test_a_server_frozen_whole_is_stuck_unanswered_and_the_kubelet_restarts_it(drills, tier):
    record = result(drills, "frozen-whole", tier)
    assert record["restarts"] == {"vllm": 1, "vitals-shim": 0}
    assert record["shim_container_unchanged"]
    # Its port accepted and nothing answered: stuck by the frozen rule only, and never `down` (which
    # liveness never acts on) before the kubelet killed it.
    assert record["stuck_reasons"] == ["metrics_unanswered"], record["stuck_reasons"]
    assert record["down_before_kill"] == [], record["down_before_kill"]
    stuck, live_503, restart = record["wedge_to_stuck_s"], record["wedge_to_live_503_s"], record["wedge_to_server_restart_s"]
    assert stuck is not None and live_503 is not None, record
    # No good read for down_after over two failed reads at least makes it stuck; a frozen poll lasts
    # its /metrics timeout and the second probe's. The last good read and the last progress came up
    # to one poll before the freeze; /live fails once the liveness budget has passed since that
    # progress, which down_after (as long as the budget here) has already passed.
    shim = _shim_settings(tier, WORKLOADS["frozen-whole"])
    target = shim.targets[0]
    frozen_poll = shim.poll_interval * (1 + shim.poll_jitter) + 2 * shim.metrics_timeout
    assert target.down_after - shim.poll_interval <= stuck <= target.down_after + 2 * frozen_poll, record
    assert target.liveness - shim.poll_interval <= live_503 and stuck <= live_503 <= stuck + 10, record
    assert live_503 < restart
    liveness = probe(tier, "livenessProbe")
    assert restart - live_503 >= (liveness["failureThreshold"] - 1) * liveness["periodSeconds"]
    assert any("Liveness probe failed" in e for e in record["events"]), record["events"]
    # The stopped process cannot act on SIGTERM: the grace period's SIGKILL ends it.
    signals = [sig for _, sig in record["server_kills"]]
    assert "15" in signals and signals[-1] == "9", record["server_kills"]
    assert record["shim_restarts"] == 1 and record["state_after"] in ("idle", "busy")
    assert record["draining_after"] is False and record["wedge_to_ready_again_s"] is not None
    wheres = [where for _, where in record["endpoints"]]
    assert "not ready" in wheres and wheres[-1] == "ready"


def test_deleting_a_pod_drains_the_shim_before_the_server_gets_sigterm(drills, tier):
    record = result(drills, "drain", tier)
    assert record["failed_prestop_hooks"] == []
    assert record["first_seen_draining_s"] is not None
    assert record["server_sigterm_s"] is not None and record["left_endpoints_s"] is not None
    assert record["left_endpoints_s"] < record["server_sigterm_s"]
    assert record["first_seen_draining_s"] < record["server_sigterm_s"]
    # The shim outlived the server's hook: it got SIGTERM after the server did.
    assert record["shim_sigterm_s"] is not None and record["shim_sigterm_s"] >= record["server_sigterm_s"]



