"""Issue 22 through the remediator's HTTP API, with its real parts (the app, the SQLite journal and
store, the exporter client) and a loopback exporter: budgets and the human reset per workload, an
exporter answer with one unknown verdict, the journal behind auth, a node released.

The same on the real API server, with pods and evictions: tests/k8s/test_workload_safety.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_remediator_helpers import AUTH, alert_payload, target_json
from test_remediator_webhook import actions, exporter, metric, post, remediator, restarter  # noqa: F401

from llm_vitals.remediator.exporter_client import parse_targets
from llm_vitals.remediator.ledger import update
from llm_vitals.remediator.state import node_cordoned

DEPLOYMENT = "Deployment/llm/vllm"


def deployed(exporter, *states: tuple[str, str]) -> None:  # noqa: F811
    """The exporter reports pods of one Deployment (each its own target, each naming the workload)."""
    exporter.targets = {name: target_json(name, state, workload=DEPLOYMENT) for name, state in states}
    for name in "bcde":
        exporter.targets[name] = target_json(name, "idle")


async def test_a_deployments_budget_is_spent_across_its_new_pod_names_and_its_reset_names_it(
        remediator, exporter, restarter):  # noqa: F811
    """Two http targets standing in for the pods a Deployment's restarts make: each restart "replaces"
    the stuck pod by the next. The third stuck pod finds the Deployment's circuit open."""
    targets = {name: {"executor": "http", "url": restarter.url, "timeout": "5s"} for name in ("p1", "p2", "p3", *"bcde")}
    client = await remediator(targets=targets, global_cooldown="0s", exporter_max_age="0s",
                              budget={"max_restarts": 2, "window": "1h", "backoff": {"initial": "0s"}})
    for i, pod in enumerate(("p1", "p2"), start=1):
        deployed(exporter, (pod, "stuck"))
        _, body = await post(client, alert_payload(pod, fingerprint=f"fp-{pod}"))
        assert body["decisions"][0]["reason"] == "allowed", body
        await client.service.wait_idle()
        assert await metric(client, f'llm_vitals_remediator_workload_restarts{{workload="{DEPLOYMENT}"}}') == i
    deployed(exporter, ("p3", "stuck"))
    _, body = await post(client, alert_payload("p3", fingerprint="fp-p3"))
    assert body["decisions"][0]["reason"] == "circuit_open" and DEPLOYMENT in body["decisions"][0]["detail"]
    assert restarter.calls == 2
    assert await metric(client, f'llm_vitals_remediator_circuit_open{{workload="{DEPLOYMENT}"}}') == 1
    rows = await actions(client, 3)
    assert [(r["target"], r["workload"], r["reason"]) for r in rows] == [
        ("p3", DEPLOYMENT, "circuit_open"), ("p2", DEPLOYMENT, "allowed"), ("p1", DEPLOYMENT, "allowed")]

    response = await client.post("/api/v1/circuit/reset", json={"workload": DEPLOYMENT}, headers=AUTH)
    assert response.status == 200 and await response.json() == {"reset": [DEPLOYMENT], "were_open": [DEPLOYMENT]}
    assert (await client.post("/api/v1/circuit/reset", json={"workload": "Deployment/llm/other"},
                              headers=AUTH)).status == 404
    assert (await client.post("/api/v1/circuit/reset", json={"workload": DEPLOYMENT, "target": "p3"},
                              headers=AUTH)).status == 422
    _, body = await post(client, alert_payload("p3", fingerprint="fp-p3"))
    assert body["decisions"][0]["reason"] == "allowed"
    await client.service.wait_idle()
    assert restarter.calls == 3


async def test_one_unknown_verdict_refuses_that_target_only(remediator, exporter, restarter):  # noqa: F811
    """A newer exporter's reason for b: b is unknown_verdict; a, in the same answer, is restarted."""
    exporter.targets["b"] = target_json("b", "stuck", reason="engine_wedged_in_allreduce")
    exporter.targets["c"] = target_json("c", "draining", reason="idle")
    client = await remediator(global_cooldown="0s")
    _, body = await post(client, alert_payload("b", fingerprint="fp-b"))
    decision = body["decisions"][0]
    assert decision["reason"] == "unknown_verdict" and "'engine_wedged_in_allreduce'" in decision["detail"]
    _, body = await post(client, alert_payload("c", fingerprint="fp-c"))
    assert body["decisions"][0]["reason"] == "unknown_verdict" and "state 'draining'" in body["decisions"][0]["detail"]
    _, body = await post(client, alert_payload("a"))
    assert body["decisions"][0]["reason"] == "allowed"
    await client.service.wait_idle()
    assert restarter.calls == 1
    evidence = await (await client.get(f"/api/v1/actions/{(await actions(client, 3))[2]['id']}", headers=AUTH)).json()
    assert evidence["evidence"]["reason"] == "engine_wedged_in_allreduce"  # shown as the exporter said it


@pytest.mark.parametrize("change, unknown", [
    ({"state": "draining"}, "state 'draining'"),
    ({"reason": "engine_wedged"}, "reason 'engine_wedged'"),
    ({"state": "draining", "reason": "engine_wedged"}, "state 'draining', reason 'engine_wedged'"),
], ids=["state", "reason", "both"])
def test_an_unknown_verdict_is_read_as_such_and_the_rest_of_the_target_too(change, unknown):
    raw = {**target_json("b", "stuck", recently_unhealthy=True, workload=DEPLOYMENT), **change}
    statuses = parse_targets({"targets": [target_json("a", "stuck"), raw], "generated_at": 1.0})
    assert statuses["a"].unknown_verdict is None and statuses["a"].state == "stuck"
    b = statuses["b"]
    assert b.unknown_verdict is not None and unknown in b.unknown_verdict
    assert b.state == raw["state"] and b.workload == DEPLOYMENT and b.recently_unhealthy and b.raw == raw


@pytest.mark.parametrize("document", [
    {"targets": [target_json("a", "stuck", since="yesterday")]},  # another field wrong: doubt, as before
    {"targets": [{**target_json("a", "stuck"), "state": 7}]},  # not a word at all
    {"targets": [{k: v for k, v in target_json("a", "draining").items() if k != "name"}]},  # whose verdict?
    {"targets": "a"},
    {"generated_at": 1.0},
    [],
], ids=["bad since", "state not a string", "no name", "targets not a list", "no targets", "not an object"])
def test_a_target_wrong_in_another_way_makes_the_whole_answer_doubt(document: Any):
    with pytest.raises(ValueError):
        parse_targets(document)


async def test_the_journal_takes_the_webhooks_auth(remediator):  # noqa: F811
    client = await remediator()
    await post(client, alert_payload("a"))
    await client.service.wait_idle()
    for path in ("/api/v1/actions", "/api/v1/actions/1"):
        refused = await client.get(path)
        assert refused.status == 401 and "WWW-Authenticate" in refused.headers
        assert (await client.get(path, headers={"Authorization": "Bearer wrong"})).status == 401
        assert (await client.get(path, headers=AUTH)).status == 200


async def test_a_released_node_may_be_escalated_again(remediator):  # noqa: F811
    client = await remediator()
    await update(client.service.store, lambda state: node_cordoned(state, "gpu-node-7"))
    assert await metric(client, 'llm_vitals_remediator_node_escalated{node="gpu-node-7"}') == 1
    assert (await client.post("/api/v1/nodes/gpu-node-7/release")).status == 401
    assert (await client.post("/api/v1/nodes/Not_A_Node/release", headers=AUTH)).status == 400
    response = await client.post("/api/v1/nodes/gpu-node-7/release", headers=AUTH)
    assert response.status == 200
    assert await response.json() == {"node": "gpu-node-7", "released": True, "was_escalated": True}
    assert client.service.store.last.cordoned_nodes == frozenset()
    assert await metric(client, 'llm_vitals_remediator_node_escalated{node="gpu-node-7"}') is None
    again = await (await client.post("/api/v1/nodes/gpu-node-7/release", headers=AUTH)).json()
    assert again["was_escalated"] is False
    rows = await actions(client, 2)
    assert [(r["decision"], r["detail"]) for r in rows] == [
        ("node_release", "node gpu-node-7 released by an operator (it was not escalated)"),
        ("node_release", "node gpu-node-7 released by an operator")]


async def test_the_state_store_health_is_a_metric(remediator):  # noqa: F811
    client = await remediator()
    assert await metric(client, "llm_vitals_remediator_state_up") == 1
    assert await metric(client, 'llm_vitals_remediator_state_errors_total{operation="read"}') == 0
