"""The two actors at the chain's shipped timings, on a virtual clock: when a hold ends, the remediator
restarts the stuck servers, not the kubelet.

The clocks that ship: the kubelet restarts a server whose liveness failed 6 probes 20 s apart, and
liveness fails a stuck server once its 240 s budget has passed since the end of the last hold
(llm_vitals/exporter/backstop_rule.py, `verdict.is_live`), so about 6 minutes after a hold ends. Alertmanager
re-sends a firing alert to the remediator at `repeat_interval` (15m) rounded up to its
`group_interval` (1m): 16 minutes. Before, the remediator waited for that re-send, and the kubelet
restarted 10 of 10 hung servers 352-372 s after a pause was lifted. Now it decides the targets it
held itself within `holds.REDECIDE_INTERVAL` of the hold's end, and the backstop's word stays `hold`
until it has.

Pure parts only (the gate, its effects and transitions, the word, the shim's rule), driven second by
second; a restart's claim ends after the executor's 30 s, the server serves again 120 s after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from itertools import pairwise

import pytest

from llm_vitals.backstop_word import BackstopWord, answer_json, word_in
from llm_vitals.exporter.backstop_rule import Heard, backstop, heard, held, last_held
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict import Verdict, is_live
from llm_vitals.remediator import gate, holds, shared
from llm_vitals.remediator import gate_word as word
from llm_vitals.remediator.gate import AlertFacts, FleetView, GatePolicy, JournalState, TargetStatus

T0 = 1_800_000_000.0
PODS = [f"llm/vllm-{i:02d}" for i in range(20)]  # 20 single-replica workloads (a static target each)
HUNG = PODS[:10]
PAUSE_LIFTED = 1800.0  # seconds after T0
HANG_AT = 300.0  # during the pause; Alertmanager's sends then come at 480 s and every 960 s, 600 s after the lift
# The shipped clocks.
STUCK_AFTER, ALERT_FOR = 120.0, 60.0  # the exporter's stuck_after; LLMServerStuck's `for`
GROUP_INTERVAL, REPEAT_INTERVAL = 60.0, 900.0  # alerts/alertmanager.yml, the remediator's route (group_wait 0)
ASK_EVERY, PROBE_PERIOD, PROBE_FAILURES, AFTER = 15.0, 20.0, 6, 600.0  # the shim's ask; the livenessProbe
EXECUTOR, SERVES_AGAIN = 30.0, 120.0  # a restart's claim; its server back
# The shipped gate (15m cooldown, 3 restarts an hour, the backoff), with a fleet gate that lets 10 of 20 through.
POLICY = GatePolicy(targets=frozenset(PODS), global_cooldown=900.0, max_restarts=3, budget_window=3600.0,
                    max_unhealthy=10)
LIVENESS = TargetSettings(name="vllm", url="http://127.0.0.1:8000", engine="vllm", stuck_after=STUCK_AFTER)


@dataclass
class Pod:
    hung_at: float | None = None
    back_at: float | None = None  # a restart was made: the server serves again from then
    heard: Heard = field(default_factory=Heard)
    failing_since: float | None = None


@dataclass
class Chain:
    """The remediator's state, Alertmanager's groups, the shims and the kubelet, second by second."""

    redecides: bool = True
    held_words: bool = True  # the word holds a held target's workload (False: as before, only the checks)
    state: JournalState = field(default_factory=lambda: JournalState(paused_until=T0 + PAUSE_LIFTED,
                                                                       pause_reason="maintenance"))
    pods: dict[str, Pod] = field(default_factory=lambda: {name: Pod() for name in PODS})
    sent: dict[str, float] = field(default_factory=dict)  # per alert group: when Alertmanager last sent
    restarts: list[tuple[float, str, str]] = field(default_factory=list)  # (at, pod, actor)
    decided: list[tuple[float, str, str]] = field(default_factory=list)  # (at, pod, reason) of the remediator
    claim_ends: float = math.inf

    def status(self, name: str, now: float) -> TargetStatus:
        pod = self.pods[name]
        stuck = pod.hung_at is not None and now - pod.hung_at >= STUCK_AFTER
        return TargetStatus("stuck" if stuck else "busy" if pod.hung_at is not None else "idle",
                            process_start_time=T0 - 7200, workload=name)

    def fleet(self, now: float) -> FleetView:
        return FleetView({name: self.status(name, now) for name in PODS})

    def alert(self, name: str) -> AlertFacts:
        pod = self.pods[name]
        assert pod.hung_at is not None
        return AlertFacts("firing", {"alertname": "LLMServerStuck", "target": name, "remediation": "restart"},
                          f"fp-{name}", pod.hung_at + STUCK_AFTER)

    def decide(self, facts: AlertFacts, now: float) -> None:
        """What the remediator's loop does with one alert: decide, commit its effects, start its restart."""
        if gate.precheck(facts, self.state, POLICY) is not None:
            return
        fleet = self.fleet(now)
        decision = gate.decide(facts, fleet, self.state, POLICY, now)
        effects = gate.effects_of(decision, facts, fleet, self.state, POLICY, now)
        intent = shared.Intent("replica/1", facts.target or "", now + EXECUTOR, facts.target or "", now) \
            if decision.allowed else None
        self.state = shared.with_effects(self.state, effects, facts, now, intent)
        self.decided.append((now, facts.target or "", decision.reason))
        if decision.allowed:
            self.claim_ends = now + EXECUTOR
            self.restart(facts.target or "", now, "remediator")

    def restart(self, name: str, now: float, actor: str) -> None:
        self.restarts.append((now, name, actor))
        self.pods[name].back_at = now + SERVES_AGAIN

    def second(self, t: float) -> None:
        now = T0 + t
        if t == PAUSE_LIFTED:
            self.state = shared.paused_state(self.state, None, "")
        if now >= self.claim_ends:
            self.state, self.claim_ends = shared.finished(self.state, "replica/1"), math.inf
        for name, pod in self.pods.items():
            if pod.back_at is not None and now >= pod.back_at:
                self.pods[name] = Pod(heard=pod.heard)  # serving again: a new process, no hang
            elif t == HANG_AT and name in HUNG:
                pod.hung_at = now
        # Alertmanager: a group's first notification when the alert fires, then a re-send at the first
        # group_interval tick past repeat_interval; a resolved alert ends its group.
        for name, pod in self.pods.items():
            firing = pod.hung_at is not None and now - pod.hung_at >= STUCK_AFTER + ALERT_FOR
            if not firing:
                self.sent.pop(name, None)
                continue
            last = self.sent.get(name)
            if last is None or (now - last > REPEAT_INTERVAL and (now - last) % GROUP_INTERVAL == 0):
                self.sent[name] = now
                self.decide(self.alert(name), now)
        # The remediator's own look (redecide.py), every REDECIDE_INTERVAL.
        if self.redecides and t % holds.REDECIDE_INTERVAL == 0:
            for item in holds.due(self.state, self.fleet(now), POLICY, now):
                self.decide(item.held.facts(item.target), now)
        # Each hung server's shim asks for its word every 15 s; the kubelet probes its liveness every 20 s.
        for name, pod in self.pods.items():
            if pod.hung_at is None:
                continue
            if t % ASK_EVERY == 0:
                said = word.word_for(name, self.state if self.held_words else replace(self.state, held={}), POLICY, now)
                answer = as_read(said)
                pod.heard = heard(held(pod.heard, now, AFTER, T0), answer, now, 0, AFTER)
            if t % PROBE_PERIOD == 0:
                verdict = Verdict(state=self.status(name, now).state, reason="no_progress", detail="",
                                  since=pod.hung_at, first_seen=T0, started=True, up=True, last_progress=pod.hung_at)
                mode = backstop(pod.heard, now, AFTER, T0)
                if is_live(verdict, LIVENESS, now, holding=mode.mode == "hold",
                           held_at=last_held(pod.heard, now, AFTER, T0)):
                    pod.failing_since = None
                    continue
                pod.failing_since = pod.failing_since if pod.failing_since is not None else now
                if now - pod.failing_since >= (PROBE_FAILURES - 1) * PROBE_PERIOD and pod.back_at is None:
                    self.restart(name, now, "kubelet")


def as_read(said: BackstopWord) -> BackstopWord | str:
    """The word as the shim reads it from GET /api/v1/backstop (backstop_word.py `word_in`)."""
    return word_in(answer_json(0.0, [said]), said.workload)


def run(chain: Chain, seconds: float) -> Chain:
    for t in range(int(seconds) + 1):
        chain.second(float(t))
    return chain


@pytest.fixture(scope="module")
def lifted() -> Chain:
    return run(Chain(), PAUSE_LIFTED + 10 * POLICY.global_cooldown + 600)


def test_after_a_pause_is_lifted_the_remediator_restarts_every_hung_server_not_the_kubelet(lifted):
    actors = {name: actor for _, name, actor in lifted.restarts}
    assert actors == dict.fromkeys(HUNG, "remediator")
    assert len(lifted.restarts) == len(HUNG)


def test_one_at_a_time_behind_the_global_cooldown(lifted):
    times = [at - T0 for at, _, _ in lifted.restarts]
    assert all(b - a >= POLICY.global_cooldown for a, b in pairwise(times))


def test_the_first_restart_comes_within_the_bound_of_the_lift_not_at_the_re_send(lifted):
    first = lifted.restarts[0][0] - T0
    assert PAUSE_LIFTED <= first <= PAUSE_LIFTED + holds.REDECIDE_INTERVAL
    # Each next one within the bound of its cooldown's end, too.
    for (a, _, _), (b, _, _) in pairwise(lifted.restarts):
        assert b - a <= POLICY.global_cooldown + holds.REDECIDE_INTERVAL


def test_the_word_held_every_hung_server_until_its_restart(lifted):
    assert not [r for r in lifted.restarts if r[2] == "kubelet"]
    assert lifted.state.held == {}  # every hold ended by a decision


def test_as_before_the_kubelet_restarted_every_hung_server_after_the_lift():
    """The defect this guards, reproduced: no look of its own and no held word, the remediator waits for
    Alertmanager's re-send (16 min) and the kubelet (~6 min after the lift) restarts all ten."""
    chain = run(Chain(redecides=False, held_words=False), PAUSE_LIFTED + 1200)
    kubelet = [at - T0 - PAUSE_LIFTED for at, _, actor in chain.restarts if actor == "kubelet"]
    assert len(kubelet) == len(HUNG)
    assert all(340 <= after <= 380 for after in kubelet)
