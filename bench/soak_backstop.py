"""The kubelet's liveness backstop in the fleet soak (issue 33): a `SoakActor` beside the remediator.

Each step (one minute) every hung pod's shim asks a remediator replica for its workload's word
(`Remediator.backstop_words`, what GET /api/v1/backstop answers, read by the shim's own
`word_in`), and judges its liveness by the exporter's own pure rule (llm_vitals/exporter/backstop_rule.py
and `verdict.is_live`). The kubelet restarts a server whose liveness has failed for 6 probes of 20 s,
and that restart is recorded as an action of the `kubelet`, so that the soak's invariants judge it as
they judge the remediator's: one actor decides, and every restart obeys the gate (no restart of a
paged workload, within the budget and backoff, none while the state is lost).

With `obey=False` the shims never ask (liveness alone, as before issue 33): the invariants then show
the kubelet restarting what the gate holds.

The kubelet's restart is a restart of the server container in place (`Fleet.restart_container`: the
same pod, a new start time, which the exporter reports as `last_restart_time`, so the remediator counts
it in the workload's budget, backoff and circuit). Approximation: a shim is modelled only while its
server hangs.

    soak = Soak(config, directory); soak.actors.append(KubeletBackstop()); await soak.run()
"""

from __future__ import annotations

import json
from typing import Any

from fleet_sim import STUCK_AFTER
from soak_invariants import Action

from llm_vitals.backstop_word import BackstopWord, answer_json, word_in
from llm_vitals.exporter.backstop_rule import Heard, backstop, heard, held, last_held
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict import Verdict, is_live
from llm_vitals.remediator.store import StateUnavailable

PROBE_PERIOD, PROBE_FAILURES = 20.0, 6  # the vLLM example's livenessProbe (deploy/helm/llm-vitals/templates/vllm.yaml)
AFTER = 600.0  # backstop.after as shipped


class KubeletBackstop:
    """The kubelet's liveness restarts of the soak's pods, through each pod's shim (a SoakActor)."""

    def __init__(self, obey: bool = True, after: float = AFTER):
        self.obey, self.after = obey, after
        self.target = TargetSettings(name="vllm", url="http://127.0.0.1:8000", engine="vllm", stuck_after=STUCK_AFTER)
        self.heard: dict[str, Heard] = {}  # per pod UID: what its shim heard
        self.started: dict[str, float] = {}  # per pod UID: when its shim started
        self.failing_since: dict[str, float] = {}  # per pod UID: the first failed liveness probe of the streak
        self.restarts = 0

    async def step(self, soak: Any, now: float) -> None:
        pods = list(soak.fleet.pods())
        present = {pod.uid for _, pod in pods}
        for kept in (self.heard, self.started, self.failing_since):
            for uid in [u for u in kept if u not in present]:
                del kept[uid]
        hung = [(w, p) for w, p in pods if soak.fleet.hung(p, now)]
        answers = await self._ask(soak, sorted({w.key for w, _ in hung})) if self.obey and hung else None
        for workload, pod in hung:
            started = self.started.setdefault(pod.uid, now)
            verdict = Verdict(state="stuck" if now - (pod.hangs_at or now) >= STUCK_AFTER else "busy",
                              reason="no_progress", detail="", since=pod.hangs_at or now, first_seen=started,
                              started=True, up=True, last_progress=pod.hangs_at)
            if self.obey:
                shim = held(self.heard.get(pod.uid, Heard()), now, self.after, started)
                shim = heard(shim, answers.get(workload.key) if answers is not None else None, now, 0, self.after)
                self.heard[pod.uid] = shim
                mode = backstop(shim, now, self.after, started)
                live = is_live(verdict, self.target, now, holding=mode.mode == "hold",
                               held_at=last_held(shim, now, self.after, started))
            else:
                live = is_live(verdict, self.target, now)
            if live:
                self.failing_since.pop(pod.uid, None)
                continue
            first = self.failing_since.setdefault(pod.uid, now)
            if now - first >= (PROBE_FAILURES - 1) * PROBE_PERIOD:
                self._restart(soak, workload.key, pod, now)

    async def _ask(self, soak: Any, workloads: list[str]) -> dict[str, BackstopWord | str] | None:
        """The word for each workload from a replica the Service would pick; None when none runs."""
        replica = next((r for r in soak.replicas if r.service is not None), None)
        if replica is None:
            return None
        try:
            _, words = await replica.service.backstop_words(workloads)
        except StateUnavailable:
            return dict.fromkeys(workloads, "the remediator answered HTTP 503")
        answer = json.loads(json.dumps(answer_json(0.0, words)))  # as the shim reads it
        return {w: word_in(answer, w) for w in workloads}

    def _restart(self, soak: Any, workload: str, pod: Any, now: float) -> None:
        at_fault = soak.fleet.node_at_fault(pod.uid)
        node = pod.node
        done = soak.fleet.restart_container(pod.uid, now)
        cordoned = sum(1 for n in soak.fleet.nodes.values() if n.cordoned_by_vitals)
        soak.history.record_action(Action(soak.history.next_seq(), now, "kubelet_restart", workload, pod.name, node,
                                          "kubelet", done, cordoned, at_fault))
        soak.tallies["action kubelet_restart"] += 1
        self.restarts += 1
        self.failing_since.pop(pod.uid, None)
