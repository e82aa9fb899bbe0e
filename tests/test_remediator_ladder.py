"""The ladder, pages, cordons and the backoff over hours: the pure gate and its state transitions
driven by a minute-by-minute fleet with an injected clock (no I/O, no sleeps).

Each run is one Deployment whose pod hangs again some minutes after each restart, wherever the new
pod lands; Alertmanager sends the alert when a hang begins and re-sends it every `repeat_interval`
while it fires (the same fingerprint and startsAt). The checks are what the remediator promises:
a page holds until a human releases it, a cordon needs evidence about that node, cordons stay
within max_cordoned_nodes, and a loop slower than the budget's window still slows down.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from llm_vitals.remediator import gate
from llm_vitals.remediator.gate import GatePolicy, TemplateMatch
from llm_vitals.remediator.model import AlertFacts, FleetView, GateState, Intent, TargetStatus
from llm_vitals.remediator.state import finished, node_cordoned, pruned, undo_of, with_effects, workload_released

T0 = 1_800_000_000.0
MINUTE = 60.0
HOUR = 3600.0
DEPLOYMENT = "Deployment/llm/vllm"
TARGET = "llm/vllm-0"
# The shipped settings: remediator/example.yaml's ladder and alerts/alertmanager.yml's repeat_interval.
POLICY = GatePolicy(
    targets=frozenset(),
    global_cooldown=900,
    max_restarts=3,
    budget_window=HOUR,
    max_unhealthy=2,
    templates=(TemplateMatch(engine="vllm", namespace="llm"),),
    escalate_within=30 * MINUTE,
    max_cordoned_nodes=1000,  # no limit: what the ladder alone does
)
REPEAT_INTERVAL = HOUR


@dataclass
class Fleet:
    """One Deployment's pod as the exporter would see it, and what the remediator did to it."""

    hang_after: float  # a new pod hangs this long after it starts
    same_node: bool  # a new pod lands on the node of the last one (else on a fresh node)
    node: int = 0
    started: float = T0 - HOUR
    stuck_since: float | None = T0
    last_sent: float | None = None
    restarts: list[float] = field(default_factory=list)
    cordoned: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    def status(self) -> TargetStatus:
        state = "stuck" if self.stuck_since is not None else "busy"
        return TargetStatus(state, self.started, engine="vllm", namespace="llm", pod=f"vllm-{len(self.restarts)}",
                            pod_uid=f"u{len(self.restarts)}", node=f"node-{self.node}", workload=DEPLOYMENT)

    def replaced(self, now: float, cordon: str | None) -> None:
        """The pod was evicted (and its node cordoned): a new pod starts, and hangs again later."""
        if cordon is not None or not self.same_node:
            self.node += 1
        self.started, self.stuck_since, self.last_sent = now, None, None
        self.restarts.append(now)


def run(fleet: Fleet, policy: GatePolicy, hours: float, state: GateState | None = None,
        start: float = T0) -> GateState:
    """Drive the gate minute by minute for `hours` from `start`; the state it commits is returned."""
    state = state or GateState()
    now = start
    while now < start + hours * HOUR:
        if fleet.stuck_since is None and now >= fleet.started + fleet.hang_after:
            fleet.stuck_since = now
        if fleet.stuck_since is not None and (fleet.last_sent is None or now - fleet.last_sent >= REPEAT_INTERVAL):
            fleet.last_sent = now
            state = webhook(fleet, policy, state, now)
        now += MINUTE
    return state


def webhook(fleet: Fleet, policy: GatePolicy, state: GateState, now: float) -> GateState:
    """One alert through the pure gate, its effects committed, an allowed action carried out."""
    assert fleet.stuck_since is not None
    labels = {"alertname": "LLMServerStuck", "target": TARGET, "remediation": "restart"}
    alert = AlertFacts("firing", labels, "fp-vllm", fleet.stuck_since)
    view = FleetView({TARGET: fleet.status()})
    decision = gate.decide(alert, view, state, policy, now)
    fleet.reasons.append(decision.reason)
    effects = gate.effects_of(decision, alert, view, state, policy, now)
    intent = None
    if decision.allowed:
        intent = Intent("replica/x", TARGET, None, DEPLOYMENT, now, undo_of(state, DEPLOYMENT))
    state = with_effects(state, effects, alert, now, intent)
    if intent is not None:
        cordon = fleet.status().node if decision.reason == "cordon_and_move" else None
        if cordon is not None:
            fleet.cordoned.append(cordon)
            state = node_cordoned(state, cordon)
        state = finished(state, intent.holder, DEPLOYMENT)
        fleet.replaced(now, cordon)
    return pruned(state, now, policy.budget_window)


def test_a_page_holds_for_hours_and_no_healthy_node_is_cordoned():
    """The issue's run: stuck again every 29 minutes, each new pod on another node, for 14 hours.
    On main each re-send after escalate_within started the ladder over: 8 nodes cordoned."""
    fleet = Fleet(hang_after=29 * MINUTE, same_node=False)
    state = run(fleet, POLICY, 14)
    assert fleet.cordoned == []  # the hang followed the software across nodes
    assert len(fleet.restarts) == 1  # the first restart; the next hang pages, and the page holds
    assert fleet.reasons[0] == "allowed" and set(fleet.reasons[1:]) == {"escalated_to_human"}
    assert len(fleet.reasons) == 15  # the page, then each hourly re-send of the same alert, journaled
    assert gate.paged(state, DEPLOYMENT)


# Another workload restarted on node-0 just before: the node's own evidence (gate.node_suspect).
NEIGHBOUR = GateState(ladder={"StatefulSet/llm/other": ("restart", T0)}, ladder_nodes={"StatefulSet/llm/other": "node-0"})


def test_a_pinned_pod_hanging_again_on_its_node_alone_pages_and_cordons_nothing():
    """A StatefulSet's or a LeaderWorkerSet group's pod comes back on its node by design: its own bug
    hanging it again there is no evidence against the node. Before, the ladder cordoned it (the fleet
    soak's 30 days: 13-14 healthy nodes)."""
    fleet = Fleet(hang_after=29 * MINUTE, same_node=True)
    state = run(fleet, POLICY, 14)
    assert fleet.cordoned == []
    assert len(fleet.restarts) == 1  # the first restart; the next hang pages, and the page holds
    assert fleet.reasons[:2] == ["allowed", "escalated_to_human"]
    assert state.cordoned_nodes == frozenset() and gate.paged(state, DEPLOYMENT)


def test_a_hang_that_comes_back_on_a_node_where_another_workload_hung_cordons_that_node_once_then_pages():
    fleet = Fleet(hang_after=29 * MINUTE, same_node=True)
    state = run(fleet, POLICY, 14, NEIGHBOUR)
    assert fleet.cordoned == ["node-0"]  # the restart left it on node-0 and it hung there again, as the other did
    assert len(fleet.restarts) == 2  # a restart, the move, then the page holds
    assert fleet.reasons[:3] == ["allowed", "cordon_and_move", "escalated_to_human"]
    assert state.cordoned_nodes == {"node-0"} and gate.paged(state, DEPLOYMENT)


def test_a_released_workload_starts_the_ladder_again():
    fleet = Fleet(hang_after=29 * MINUTE, same_node=False)
    state = run(fleet, POLICY, 3)
    state = workload_released(state, DEPLOYMENT)
    assert not gate.paged(state, DEPLOYMENT)
    fleet.last_sent = None  # the next re-send is judged afresh
    fleet.reasons.clear()
    run(fleet, POLICY, 1, state, start=T0 + 3 * HOUR)
    assert fleet.reasons[0] == "allowed"


def test_cordons_stay_within_max_cordoned_nodes_and_the_refusal_pages():
    # Two Deployments' worth of evidence: node-0 is already cordoned (and not released).
    fleet = Fleet(hang_after=29 * MINUTE, same_node=True)
    state = run(fleet, replace(POLICY, max_cordoned_nodes=1), 14, replace(NEIGHBOUR, cordoned_nodes=frozenset({"node-x"})))
    assert fleet.cordoned == []
    assert fleet.reasons[:3] == ["allowed", "cordon_limit", "escalated_to_human"]
    assert state.cordoned_nodes == {"node-x"} and gate.paged(state, DEPLOYMENT)


@pytest.mark.parametrize("hang_after", [31 * MINUTE, 45 * MINUTE, 2 * HOUR])
def test_a_loop_slower_than_the_window_slows_down_under_the_backoff(hang_after):
    """Restarted once per window/(max_restarts - 1) or slower, the sliding window never fills; on
    main it restarted every time for ever. The backoff makes each wait longer, up to its cap."""
    policy = replace(POLICY, escalate_within=None)  # the ladder off, as shipped by default
    fleet = Fleet(hang_after=hang_after, same_node=True)
    run(fleet, policy, 48)
    gaps = [b - a for a, b in zip(fleet.restarts, fleet.restarts[1:], strict=False)]
    assert all(gap >= gate.backoff_delay(policy, n) for n, gap in enumerate(gaps, start=1))
    assert "backoff" in fleet.reasons
    unbounded = 48 * HOUR // (hang_after + MINUTE)
    assert len(fleet.restarts) <= 48 * HOUR / policy.backoff_max + 6 < unbounded


def test_a_quiet_period_ends_the_backoff_streak():
    policy = replace(POLICY, escalate_within=None)
    fleet = Fleet(hang_after=13 * HOUR, same_node=True)  # hangs once per 13 h: longer than reset_after
    state = run(fleet, policy, 48)
    assert "backoff" not in fleet.reasons and len(fleet.restarts) == 4
    assert state.backoff[DEPLOYMENT][0] == 1
