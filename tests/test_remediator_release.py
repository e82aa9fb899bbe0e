"""Resets, pauses and releases name what they touch, through the real app (SQLite journal and store,
a loopback exporter, the real http executor): an empty or null workload is a 400, resetting every
circuit needs `all: true`, a huge number is a 400 (never a 500), and a paged workload holds until
an authenticated release."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_remediator_helpers import AUTH, alert_payload
from test_remediator_webhook import actions, exporter, metric, post, remediator, restarter  # noqa: F401

from llm_vitals.remediator.ledger import update
from llm_vitals.remediator.state import workload_released


async def open_circuits(client, *workloads: str) -> None:
    await update(client.service.store, lambda s: replace(s, open_circuits=frozenset(workloads)))


@pytest.mark.parametrize("path, body, status", [
    ("/api/v1/circuit/reset?workload=", None, 400),  # an unset shell variable: ?workload=$WORKLOAD
    ("/api/v1/circuit/reset?target=", None, 400),
    ("/api/v1/circuit/reset", {"workload": None}, 400),
    ("/api/v1/circuit/reset", {"workload": ""}, 400),
    ("/api/v1/circuit/reset", {"target": None}, 400),
    ("/api/v1/circuit/reset", {"workload": " a"}, 400),
    ("/api/v1/circuit/reset", {}, 400),
    ("/api/v1/circuit/reset", None, 400),  # no name at all
    ("/api/v1/circuit/reset", {"all": False}, 400),
    ("/api/v1/circuit/reset", {"all": "yes"}, 400),
    ("/api/v1/circuit/reset?all=1", None, 400),
    ("/api/v1/circuit/reset?workload=a", {"workload": "a"}, 400),  # in one place, not two
    ("/api/v1/circuit/reset?everything=true", None, 400),
    ("/api/v1/circuit/reset", {"workload": "a", "all": True}, 422),
], ids=["empty query", "empty target query", "null", "empty", "null target", "padded", "empty object", "no body",
        "all false", "all yes", "all=1", "query and body", "unknown query", "a name and all"])
async def test_a_reset_that_names_nothing_is_refused_and_touches_nothing(remediator, path, body, status):  # noqa: F811
    client = await remediator()
    await open_circuits(client, "a", "b")
    response = await client.post(path, headers=AUTH, **({"json": body} if body is not None else {}))
    assert response.status == status, await response.text()
    assert "error" in await response.json()
    assert client.service.store.last.open_circuits == {"a", "b"}


@pytest.mark.parametrize("path, body", [
    ("/api/v1/circuit/reset", {"all": True}),
    ("/api/v1/circuit/reset?all=true", None),
], ids=["body", "query"])
async def test_every_circuit_is_reset_only_when_asked_by_name(remediator, path, body):  # noqa: F811
    client = await remediator()
    await open_circuits(client, "a", "b")
    response = await client.post(path, headers=AUTH, **({"json": body} if body is not None else {}))
    assert response.status == 200
    assert await response.json() == {"reset": list("abcde"), "were_open": ["a", "b"]}
    assert client.service.store.last.open_circuits == frozenset()


async def test_one_named_workload_is_reset_alone(remediator):  # noqa: F811
    client = await remediator()
    await open_circuits(client, "a", "b")
    response = await client.post("/api/v1/circuit/reset?workload=a", headers=AUTH)
    assert response.status == 200 and await response.json() == {"reset": ["a"], "were_open": ["a"]}
    assert client.service.store.last.open_circuits == {"b"}


@pytest.mark.parametrize("until", [10**400, -(10**400), 10**20, 1e300, 253402300800],
                         ids=["huge int", "huge negative int", "past year 9999", "huge float", "one past 9999"])
async def test_a_pause_until_no_time_can_be_is_a_400(remediator, until):  # noqa: F811
    client = await remediator()
    response = await client.post("/api/v1/pause", json={"until": until, "reason": "upgrade"}, headers=AUTH)
    assert response.status == 400 and (await response.json())["error"].startswith("until: at most")
    assert (await (await client.get("/api/v1/pause", headers=AUTH)).json())["paused"] is False


async def test_a_pause_until_the_last_rfc3339_second_is_taken(remediator):  # noqa: F811
    client = await remediator()
    response = await client.post("/api/v1/pause", json={"until": 253402300799, "reason": "indefinitely"},
                                 headers=AUTH)
    assert response.status == 200 and (await response.json())["paused"] is True


async def test_a_page_holds_until_an_authenticated_release(remediator, restarter):  # noqa: F811
    client = await remediator()
    await update(client.service.store, lambda s: replace(s, pages={"a": client.clock.now - 7200}))
    assert await metric(client, 'llm_vitals_remediator_workload_paged{workload="a"}') == 1
    # Alertmanager's re-sends of the alert: each refused and journaled, nothing restarted.
    for _ in range(2):
        _, body = await post(client, alert_payload("a"))
        assert body["decisions"][0]["reason"] == "escalated_to_human"
        client.clock.advance(3600)
    assert restarter.calls == 0
    assert [r["reason"] for r in await actions(client)] == ["escalated_to_human"] * 2

    assert (await client.post("/api/v1/workloads/release", json={"workload": "a"})).status == 401
    for bad in ({"workload": None}, {"workload": ""}, {}, {"workload": "a", "all": True}, ["a"]):
        response = await client.post("/api/v1/workloads/release", json=bad, headers=AUTH)
        assert response.status == 400, bad
    assert (await client.post("/api/v1/workloads/release?workload=", headers=AUTH)).status == 400
    assert workload_released(client.service.store.last, "b") == client.service.store.last
    assert "a" in client.service.store.last.pages

    response = await client.post("/api/v1/workloads/release", json={"workload": "a"}, headers=AUTH)
    assert response.status == 200
    assert await response.json() == {"workload": "a", "released": True, "was_paged": True}
    assert await metric(client, 'llm_vitals_remediator_workload_paged{workload="a"}') is None
    _, body = await post(client, alert_payload("a"))
    assert body["decisions"][0]["reason"] == "allowed"
    await client.service.wait_idle()
    assert restarter.calls == 1
    again = await client.post("/api/v1/workloads/release?workload=a", headers=AUTH)
    assert (await again.json())["was_paged"] is False
    rows = await actions(client, 3)
    assert [(r["decision"], r["workload"]) for r in rows] == [
        ("workload_release", "a"), ("restart", "a"), ("workload_release", "a")]
    assert [rows[0]["detail"], rows[2]["detail"]] == [
        "workload a released by an operator (it was not paged)", "workload a released by an operator"]


async def test_the_restart_streak_and_the_backoff_are_seen_and_a_circuit_reset_ends_them(remediator):  # noqa: F811
    client = await remediator()
    await update(client.service.store, lambda s: replace(s, backoff={"a": (3, client.clock.now - 600)}))
    assert await metric(client, 'llm_vitals_remediator_workload_restart_streak{workload="a"}') == 3
    assert await metric(client, 'llm_vitals_remediator_backoff_refused_seconds{workload="a"}') is None
    _, body = await post(client, alert_payload("a"))
    assert body["decisions"][0]["reason"] == "backoff" and "3000s of backoff left" in body["decisions"][0]["detail"]
    # The stuck server is held back: LLMVitalsRemediatorBackoffHolding reads this series.
    assert await metric(client, 'llm_vitals_remediator_backoff_refused_seconds{workload="a"}') == 0
    assert (await client.post("/api/v1/circuit/reset", json={"workload": "a"}, headers=AUTH)).status == 200
    assert await metric(client, 'llm_vitals_remediator_workload_restart_streak{workload="a"}') is None
    assert await metric(client, 'llm_vitals_remediator_backoff_refused_seconds{workload="a"}') is None
    _, body = await post(client, alert_payload("a", fingerprint="fp-2"))
    assert body["decisions"][0]["reason"] == "allowed"


@pytest.mark.parametrize("route", ["/api/v1/circuit/reset", "/api/v1/workloads/release"])
@pytest.mark.parametrize("query, body, status, error", [
    ("?workload=a", b'{"workload": "a"}', 400, "not both"),
    ("", b'{"workload": ', 400, "invalid JSON"),
    ("", b"[" * (64 * 1024 + 1), 413, "body too large"),
], ids=["query and body", "broken JSON", "too large"])
async def test_an_operators_call_is_read_from_its_query_or_its_body_the_same_way_on_every_route(
        remediator, route, query, body, status, error):  # noqa: F811
    client = await remediator()
    await open_circuits(client, "a")
    response = await client.post(route + query, headers={**AUTH, "Content-Type": "application/json"}, data=body)
    assert response.status == status and error in (await response.json())["error"]
    assert client.service.store.last.open_circuits == {"a"}


DEEP = b"[" * 60_000  # nested past Python's recursion limit, within the 64 KiB an operator's call may send


@pytest.mark.parametrize("path", ["/api/v1/pause", "/api/v1/circuit/reset", "/api/v1/workloads/release",
                                  "/api/v1/state/reinit"])
async def test_json_nested_too_deeply_is_a_400_on_every_operators_route(remediator, path):  # noqa: F811
    """Before, json.loads' RecursionError escaped these handlers: a 500 (the webhook alone caught it)."""
    client = await remediator()
    response = await client.post(path, data=DEEP, headers={**AUTH, "Content-Type": "application/json"})
    assert response.status == 400, await response.text()
    assert (await response.json())["error"] == "invalid JSON: nested too deeply"


@pytest.mark.parametrize("action_id", ["12345678901234567890", "9223372036854775808", "0", "-1"])
async def test_an_action_id_no_row_can_have_is_a_404(remediator, action_id):  # noqa: F811
    """Before, a 20-digit id overflowed SQLite's integer: a 500."""
    client = await remediator()
    response = await client.get(f"/api/v1/actions/{action_id}", headers=AUTH)
    assert response.status == 404, await response.text()
