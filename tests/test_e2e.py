"""The whole chain end to end: simulator -> exporter -> real Prometheus -> real Alertmanager -> remediator.

One scenario on one running chain (tests/e2e_chain.py), phase after phase, as in issue 5:

1. backend gpu-1 saturated for 60 s: busy on every poll, zero canaries to it, no restart-labelled
   alert (pending or firing), no webhook decision, no restart. LLMServerSaturated (info) fires.
2. gpu-2 hangs: exactly one restart, by the remediator through Alertmanager; gpu-2 is busy again.
3. gpu-1 and gpu-3 hang at the same moment (max_unhealthy 2): one restarts at once, the other is
   refused for the global cooldown, then restarted once it has passed (Alertmanager re-sends).
4. all three hang: no restart at all; every target's alert is refused with reason `fleet_gate`.
   Meanwhile every query of the Grafana dashboard returns data from this real Prometheus.
The journal then shows every decision with its reason.

Between phases the scenario waits for every backend to serve and every target to be idle or busy:
a backend still loading after a restart counts as `down` for the fleet gate.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from conftest import REPO, load_script
from e2e_chain import Chain, running_chain
from stack import StackError, pid_alive

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("real_stack")]

NAMES = ["gpu-1", "gpu-2", "gpu-3"]  # fleet backends 0, 1, 2: the backends 1, 2, 3
# The issue says 60 s. It fits: the whole test stays under ~3 minutes on a loaded 2-core machine.
SATURATION_SECONDS = 60
WEBHOOK_TIMEOUT = 30  # the real Prometheus skips evaluations when the machine is loaded
GATE_REASONS = {
    "not_firing", "no_restart_label", "unknown_target", "duplicate", "exporter_unreachable", "not_stuck",
    "restarted_since_alert", "gpu_fault", "restart_in_progress", "cooldown", "circuit_open", "fleet_gate",
    "dry_run", "allowed",
}


def restarts_of(actions: list[dict], name: str | None = None) -> list[dict]:
    return [a for a in actions if a["decision"] == "restart" and (name is None or a["target"] == name)]


def decided_after(actions: list[dict], since: float) -> list[dict]:
    return [a for a in actions if a["time"] >= since]


async def test_saturation_hang_cooldown_and_fleet_gate_through_the_real_stack(tmp_path):
    queries = load_script(REPO / "dashboards" / "queries.py")
    timings: dict[str, float] = {}
    begun = time.monotonic()
    async with running_chain(tmp_path / "chain", NAMES) as chain:
        timings["start"] = time.monotonic() - begun
        await chain.wait(chain.all_healthy, 30, "every target idle or busy at start")

        mark = time.monotonic()
        await phase_saturation(chain)
        timings["saturation"] = time.monotonic() - mark

        mark = time.monotonic()
        await phase_one_hang(chain)
        timings["one hang"] = time.monotonic() - mark

        mark = time.monotonic()
        await phase_two_hangs(chain)
        timings["two hangs"] = time.monotonic() - mark

        mark = time.monotonic()
        await phase_fleet_hang(chain, queries)
        timings["fleet hang"] = time.monotonic() - mark

        await check_journal(chain)
        pids = [p.pid for p in (chain.fleet.process, chain.exporter, chain.remediator,
                                chain.stack.prometheus, chain.stack.alertmanager)]
    timings["total"] = time.monotonic() - begun
    assert not [pid for pid in pids if pid_alive(pid)], "teardown must stop every process it started"
    print("e2e phase timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))


# -- phases ---------------------------------------------------------------------------------------


async def phase_saturation(chain: Chain) -> None:
    """Two slots, six clients, for 60 s: a full server that keeps stepping is busy and left alone."""
    name = "gpu-1"
    await chain.load(chain.index(name), workers=6, max_tokens=100)

    async def queued_and_settled():
        target = (await chain.targets())[name]
        # Busy for longer than a canary's timeout: any canary sent while it was still idle has ended.
        settled = time.time() - target["since"] > chain.timings.canary_timeout + 0.5
        return target["state"] == "busy" and (target["waiting"] or 0) >= 3 and settled and target

    before = await chain.wait(queued_and_settled, 20, f"{name} busy with a queue")
    canaries_before = sum(before["canary"]["results"].values())
    started = time.time()
    saw_saturated_alert = False
    max_waiting = 0.0
    while time.time() - started < SATURATION_SECONDS:
        restart_alerts = await chain.stack.query('ALERTS{remediation="restart"}')
        assert restart_alerts == [], f"a restart-labelled alert under load: {restart_alerts}"
        saturated = await chain.stack.query(f'ALERTS{{alertname="LLMServerSaturated",alertstate="firing",target="{name}"}}')
        saw_saturated_alert |= bool(saturated)
        target = (await chain.targets())[name]
        assert target["state"] == "busy", (target["state"], target["reason"], target["detail"])
        max_waiting = max(max_waiting, target["waiting"] or 0)
        await asyncio.sleep(2)  # the phase lasts a fixed time by definition; these are samples within it

    after = (await chain.targets())[name]
    points = [p for p in await chain.history(name) if p[0] >= started]
    assert len(points) >= SATURATION_SECONDS / chain.timings.poll_interval * 0.5, "the exporter kept polling"
    assert {state for _, _, state in points} == {"busy"}, "every poll under load read busy"
    assert sum(after["canary"]["results"].values()) == canaries_before, "a canary was sent to a busy server"
    assert max_waiting >= 3 and after["steps_per_second"] > 0
    assert saw_saturated_alert, "LLMServerSaturated (info) should fire: the load was seen as load"
    assert await chain.actions() == [], "the remediator was called during saturation"
    assert await chain.backend_restarts() == [0, 0, 0]
    assert after["restarts"] == 0
    await chain.unload(chain.index(name))
    await chain.wait(chain.all_healthy, 30, "all healthy after saturation")


async def phase_one_hang(chain: Chain) -> None:
    """gpu-2 hangs with work in flight: exactly one restart, through Alertmanager, then busy again."""
    name, i = "gpu-2", 1
    await chain.load(i, workers=2, max_tokens=200)
    await chain.wait(lambda: _state_is(chain, name, "busy"), 20, f"{name} busy")
    hung_at = time.time()
    await chain.fleet.fault(i, "hang")

    async def restarted():
        return (await chain.backend_restarts())[i] == 1

    await chain.wait(restarted, WEBHOOK_TIMEOUT + 10, f"{name} restarted")
    await chain.wait(lambda: _state_is(chain, name, "busy"), 20, f"{name} busy again after its restart")

    async def resolved():
        return any(a["target"] == name and a["decision"] == "resolved" for a in await chain.actions())

    # The resolution reaching the remediator closes the episode: no second restart can follow it.
    await chain.wait(resolved, WEBHOOK_TIMEOUT, f"the resolved {name} alert at the remediator")
    actions = await chain.actions()
    restarts = restarts_of(actions)
    assert [(a["target"], a["reason"], a["result"], a["alertname"], a["executor"]) for a in restarts] == [
        (name, "allowed", "ok", "LLMServerStuck", "http")
    ], actions
    assert restarts[0]["time"] > hung_at
    assert await chain.backend_restarts() == [0, 1, 0]
    assert (await chain.targets())[name]["restarts"] == 1, "the exporter saw exactly one restart"
    await chain.wait(chain.all_healthy, 30, "all healthy after one hang")


async def phase_two_hangs(chain: Chain) -> None:
    """gpu-1 and gpu-3 hang together: one restart now, the other after the global cooldown."""
    pair = ["gpu-1", "gpu-3"]
    for name in pair:
        await chain.load(chain.index(name), workers=2, max_tokens=200)
    await chain.wait(lambda: _all_busy(chain, pair), 20, "gpu-1 and gpu-3 busy")
    await _wait_out_cooldown(chain)
    hung_at = time.time()
    # The same moment, as near as two control requests get (milliseconds).
    await asyncio.gather(*(chain.fleet.fault(chain.index(name), "hang") for name in pair))

    async def both_restarted():
        return await chain.backend_restarts() == [1, 1, 1]

    await chain.wait(both_restarted, 2 * WEBHOOK_TIMEOUT, "both restarted, in turn")
    await chain.wait(lambda: _all_busy(chain, pair), 20, "gpu-1 and gpu-3 busy again")

    async def both_resolved():
        actions = decided_after(await chain.actions(), hung_at)
        return {a["target"] for a in actions if a["decision"] == "resolved"} >= set(pair)

    await chain.wait(both_resolved, WEBHOOK_TIMEOUT, "both alerts resolved at the remediator")
    actions = decided_after(await chain.actions(), hung_at)
    restarts = restarts_of(actions)
    assert sorted(a["target"] for a in restarts) == pair, actions
    assert all(a["reason"] == "allowed" and a["result"] == "ok" for a in restarts), restarts
    first, second = restarts
    assert second["time"] - first["time"] >= chain.timings.global_cooldown - 0.05, (first, second)
    # Between the two, the second target's alert was refused; the global cooldown said why.
    held = [a for a in actions if a["target"] == second["target"] and first["time"] <= a["time"] < second["time"]]
    assert "cooldown" in {a["reason"] for a in held}, held
    assert {a["reason"] for a in held} <= {"cooldown", "restart_in_progress"}, held
    assert await chain.backend_restarts() == [1, 1, 1]
    await chain.wait(chain.all_healthy, 30, "all healthy after two hangs")


async def phase_fleet_hang(chain: Chain, queries) -> None:
    """All three hang: more than max_unhealthy, so the fault is probably elsewhere. No restart."""
    for name in NAMES:
        if chain.index(name) not in chain.loads:
            await chain.load(chain.index(name), workers=2, max_tokens=200)
    await chain.wait(lambda: _all_busy(chain, NAMES), 20, "all three busy")
    # The cooldown is checked before the fleet gate: let it pass, so the refusal is the fleet gate's.
    await _wait_out_cooldown(chain)
    hung_at = time.time()
    await asyncio.gather(*(chain.fleet.fault(i, "hang") for i in range(len(NAMES))))

    async def every_target_refused_twice():
        refused = Counter(a["target"] for a in decided_after(await chain.actions(), hung_at)
                          if a["reason"] == "fleet_gate")
        # Twice: the first notification and a re-send (repeat_interval) were both refused.
        return all(refused[n] >= 2 for n in NAMES)

    await chain.wait(every_target_refused_twice, WEBHOOK_TIMEOUT + 10, "fleet_gate refusals for all three")
    await check_dashboard_queries(chain, queries)

    actions = decided_after(await chain.actions(), hung_at)
    assert restarts_of(actions) == [], actions
    assert {a["reason"] for a in actions} == {"fleet_gate"}, actions
    assert all(a["decision"] == "refused" and "3 of 3 targets unhealthy" in a["detail"] for a in actions), actions
    assert await chain.backend_restarts() == [1, 1, 1]
    targets = await chain.targets()
    assert {targets[n]["state"] for n in NAMES} == {"stuck"}, "still stuck: nothing was restarted"


async def check_dashboard_queries(chain: Chain, queries) -> None:
    """Every panel's query, `$target` set to this fleet, returns data from the real Prometheus."""
    regex = "|".join(NAMES)
    panel_queries = queries.dashboard_queries(target=regex, rate_interval="30s")
    assert panel_queries, "the dashboard has no queries"
    empty = []
    for q in panel_queries:
        if "llm_vitals_pace_ratio" in q.expr:
            continue  # each target of this fleet is its own workload: no peers, no pace judged, no sample
        try:
            result = await chain.wait(lambda q=q: chain.stack.query(q.expr), 15, f"data for panel {q.panel!r}")
        except StackError as exc:  # collected, so one run names every empty panel
            empty.append(f"{q.panel} [{q.ref_id}]: {q.expr}\n    {str(exc).splitlines()[0]}")
            continue
        assert all("value" in series for series in result)
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)
    # The `target` variable (Grafana's label_values, $engine "All") lists the fleet.
    variable = queries.substitute(queries.variable_query())
    metric = variable.split("(", 1)[1].rsplit(",", 1)[0].strip()
    series = await chain.stack.query(f"group by (target) ({metric})")
    assert sorted(s["metric"]["target"] for s in series) == NAMES, (variable, series)
    # $engine filters through llm_vitals_target_info: this fleet is vLLM, so "llamacpp" shows none of it.
    for q in queries.dashboard_queries(target=regex, rate_interval="30s", engine="llamacpp"):
        assert await chain.stack.query(q.expr) == [], (q.panel, q.expr)


async def check_journal(chain: Chain) -> None:
    """The journal holds every decision with its reason; restarts are exactly the four expected."""
    actions = await chain.actions()
    assert actions, "empty journal"
    for action in actions:
        assert action["reason"] in GATE_REASONS | {"not_firing"}, action
        assert action["decision"] in {"restart", "refused", "resolved"}, action
        assert action["target"] in NAMES, action
        assert action["alertname"] == "LLMServerStuck", "only restart-labelled alerts reach the remediator"
    restarts = restarts_of(actions)
    assert [a["target"] for a in restarts][:1] == ["gpu-2"]
    assert sorted(a["target"] for a in restarts) == ["gpu-1", "gpu-2", "gpu-3"]
    assert all(a["result"] == "ok" and a["duration_seconds"] is not None for a in restarts), restarts
    reasons = Counter(a["reason"] for a in actions)
    assert reasons["allowed"] == 3 and reasons["fleet_gate"] >= 6 and reasons["cooldown"] >= 1, reasons
    # Every decision was also counted in the remediator's metrics, which Prometheus scraped.
    counted = await chain.stack.query("sum by (reason) (llm_vitals_remediator_decisions_total)")
    assert {s["metric"]["reason"] for s in counted} >= {"allowed", "cooldown", "fleet_gate"}, counted


# -- helpers --------------------------------------------------------------------------------------


async def _state_is(chain: Chain, name: str, state: str) -> bool:
    return (await chain.targets())[name]["state"] == state


async def _all_busy(chain: Chain, names: list[str]) -> bool:
    targets = await chain.targets()
    return all(targets[n]["state"] == "busy" for n in names) and await chain.all_healthy()


async def _wait_out_cooldown(chain: Chain) -> None:
    async def passed():
        starts = [a["time"] for a in restarts_of(await chain.actions())]
        return not starts or time.time() - max(starts) > chain.timings.global_cooldown + 0.5

    await chain.wait(passed, chain.timings.global_cooldown + 10, "the global cooldown to pass")
