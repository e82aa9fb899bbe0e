"""One set of rules for what the API server answers to an eviction or a delete (kube/evictions.py),
decided by status, reason and causes, never by the message text."""

from __future__ import annotations

import pytest
from test_remediator_loop import replicas  # noqa: F401

from llm_vitals.kube.errors import ApiError, api_error
from llm_vitals.kube.evictions import judged

PDB_STATUS = {"kind": "Status", "code": 429, "reason": "TooManyRequests",
              "message": "Cannot evict pod as it would violate the pod's disruption budget.",
              "details": {"causes": [{"reason": "DisruptionBudget",
                                      "message": "The disruption budget vllm needs 2 healthy pods and has 2 currently"}]}}
# API Priority and Fairness: 429, no causes (its message may say anything).
APF_STATUS = {"kind": "Status", "code": 429, "reason": "TooManyRequests",
              "message": "Too many requests, please try again later. (disruption budget?)",
              "details": {"retryAfterSeconds": 1}}

CASES = [
    ("a PodDisruptionBudget names itself in the causes", api_error(429, PDB_STATUS), True, "disruption_budget"),
    ("API Priority and Fairness: no cause, whatever the message says", api_error(429, APF_STATUS), True,
     "api_throttled"),
    ("a throttled delete", api_error(429, APF_STATUS), False, "api_throttled"),
    ("a delete's 429 is never a budget (deletes ignore them)", api_error(429, PDB_STATUS), False, "api_throttled"),
    ("gone", ApiError(404, "NotFound", "pods \"x\" not found"), True, "gone"),
    ("the UID precondition failed", ApiError(409, "Conflict"), True, "replaced"),
    ("forbidden", ApiError(403, "Forbidden", "disruption budget"), True, "failed"),
    ("a 500", ApiError(500, "InternalError"), False, "failed"),
]


@pytest.mark.parametrize("error, evicting, outcome", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_an_answer_is_judged_by_status_reason_and_causes(error, evicting, outcome):
    removal = judged(error, evicting, "pod llm/x", "u1")
    assert removal.outcome == outcome
    assert removal.refused == (outcome if outcome in ("disruption_budget", "api_throttled") else None)
    assert removal.absent == (outcome in ("gone", "replaced"))


def test_a_status_keeps_the_reasons_of_its_causes():
    assert api_error(429, PDB_STATUS).causes == ("DisruptionBudget",)
    assert api_error(429, APF_STATUS).causes == ()


async def test_a_throttled_restart_is_taken_back_and_starts_no_disruption_streak(replicas):  # noqa: F811
    """Before, a 429 of API Priority and Fairness was journaled `disruption_budget` and started the
    streak that LLMVitalsRemediatorDisruptionBudget pages on."""
    from test_remediator_helpers import Clock
    from test_remediator_loop import T0, MemoryStore, alert

    from llm_vitals.remediator.executors import ExecResult

    clock = Clock(T0)
    store = MemoryStore(clock)
    replica = await replicas(store, clock)
    replica.executor.result = ExecResult("error", "the API server throttled the evict", refused="api_throttled")
    assert await replica.decide(alert("a")) == "allowed"
    await replica.actor.wait_idle()
    assert store.state.disrupted == {} and store.state.restart_times == {} and store.state.in_progress is None
    assert alert("a").key not in store.state.decided_keys  # the next re-send is judged afresh
    [row] = await replica.journal.actions(10)
    assert row["reason"] == "api_throttled"
