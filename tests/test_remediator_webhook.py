"""The webhook and the other routes, end to end on loopback: the real app, a loopback exporter
serving the documented JSON, and the real `http` executor against a counting restart endpoint."""

from __future__ import annotations

import base64
import json
import logging

import pytest
from conftest import AM_FIXTURES
from test_remediator_helpers import (
    AUTH,
    FIRING,
    RESOLVED,
    TOKEN,
    TRUNCATED,
    Clock,
    FakeExporter,
    RestartCounter,
    alert_payload,
    make_settings,
)

from llm_vitals.remediator.app import SERVICE, create_app

TARGETS = "abcde"


@pytest.fixture
async def exporter(aiohttp_server):
    fake = FakeExporter({name: ("stuck" if name == "a" else "idle") for name in TARGETS})
    server = await aiohttp_server(fake.app())
    fake.url = str(server.make_url("")).rstrip("/")
    return fake


@pytest.fixture
async def restarter(aiohttp_server):
    counter = RestartCounter()
    server = await aiohttp_server(counter.app())
    counter.url = str(server.make_url("/admin/restart"))
    return counter


@pytest.fixture
def remediator(aiohttp_client, tmp_path, exporter, restarter):
    """A factory: the remediator app on loopback with a test clock; settings overridable."""

    async def make(**over):
        targets = over.pop("targets", None) or {
            name: {"executor": "http", "url": restarter.url, "timeout": "5s"} for name in TARGETS
        }
        settings = make_settings(tmp_path, over.pop("exporter_url", exporter.url), targets, **over)
        clock = Clock()
        client = await aiohttp_client(create_app(settings, clock=clock))
        client.clock = clock
        client.service = client.server.app[SERVICE]
        return client

    return make


async def post(client, payload, headers=AUTH):
    response = await client.post("/webhook", json=payload, headers=headers)
    return response.status, await response.json()


async def actions(client, limit=100):
    response = await client.get(f"/api/v1/actions?limit={limit}", headers=AUTH)
    assert response.status == 200
    return (await response.json())["actions"]


async def metric(client, line_prefix: str) -> float | None:
    text = await (await client.get("/metrics")).text()
    for line in text.splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_stuck_alert_with_real_alertmanager_headers_restarts_once(remediator, restarter):
    client = await remediator()
    headers = json.loads((AM_FIXTURES / "webhook-request-headers.json").read_text())["headers"]
    headers = {k: v for k, v in headers.items() if k in ("Authorization", "User-Agent")}
    status, body = await post(client, alert_payload("a"), headers)
    assert status == 200
    assert body["decisions"] == [
        {"target": "a", "fingerprint": "ae4ddf2da96a7112", "decision": "restart", "reason": "allowed", "detail": ""}
    ]
    await client.service.wait_idle()
    assert restarter.calls == 1
    [row] = await actions(client)
    assert row["decision"] == "restart" and row["result"] == "ok" and row["executor"] == "http"
    assert row["target"] == "a" and row["alertname"] == "LLMServerStuck" and row["duration_seconds"] >= 0
    assert set(row) == {"id", "time", "target", "alertname", "fingerprint", "starts_at", "decision", "reason",
                        "executor", "result", "detail", "duration_seconds", "workload", "actor"}
    assert row["workload"] == "a"  # a static target is its own workload
    assert row["actor"] == "remediator"  # its own restart, told apart from the kubelet's
    assert await metric(client, 'llm_vitals_remediator_decisions_total{reason="allowed",target="a"}') == 1
    assert await metric(client, 'llm_vitals_remediator_restarts_total{result="ok",target="a"}') == 1
    assert await metric(client, 'llm_vitals_remediator_last_restart_timestamp_seconds{target="a"}') == client.clock.now
    assert await metric(client, "llm_vitals_remediator_restart_in_progress") == 0


async def test_real_firing_fixture_without_remediation_label_is_refused(remediator, restarter):
    client = await remediator()
    status, body = await post(client, FIRING)
    assert status == 200 and body["decisions"][0]["reason"] == "no_restart_label"
    assert restarter.calls == 0


async def test_resolved_alert_is_journaled_with_no_action(remediator, restarter, exporter):
    client = await remediator()
    status, body = await post(client, RESOLVED)
    assert status == 200
    assert body["decisions"][0]["decision"] == "resolved"
    [row] = await actions(client)
    assert (row["decision"], row["reason"], row["result"], row["executor"]) == ("resolved", "not_firing", None, None)
    assert restarter.calls == 0 and exporter.requests == 0


async def test_truncated_payload_handles_the_alerts_it_carries(remediator, restarter):
    client = await remediator()
    payload = json.loads(json.dumps(TRUNCATED))
    payload["alerts"][0]["labels"]["remediation"] = "restart"
    status, body = await post(client, payload)
    assert status == 200 and body["truncated_alerts"] == 1
    assert body["decisions"][0]["reason"] == "allowed"
    await client.service.wait_idle()
    assert restarter.calls == 1


async def test_missing_or_wrong_credentials_get_401(remediator, restarter):
    client = await remediator()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                    {"Authorization": f"Basic {base64.b64encode(b'x:' + TOKEN.encode()).decode()}"}):
        response = await client.post("/webhook", json=alert_payload("a"), headers=headers)
        assert response.status == 401
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert restarter.calls == 0 and await actions(client) == []


async def test_basic_auth(remediator, tmp_path, restarter):
    (tmp_path / "pw").write_text("pa:ss\n")
    client = await remediator(auth={"basic_auth": {"username": "am", "password_file": str(tmp_path / "pw")}})
    good = "Basic " + base64.b64encode(b"am:pa:ss").decode()
    bad = "Basic " + base64.b64encode(b"am:pa:sx").decode()
    assert (await client.post("/webhook", json=RESOLVED, headers={"Authorization": bad})).status == 401
    assert (await client.post("/webhook", json=RESOLVED, headers={"Authorization": "Basic !!"})).status == 401
    assert (await client.post("/webhook", json=RESOLVED, headers={"Authorization": good})).status == 200


async def test_explicit_no_auth(remediator):
    client = await remediator(auth={"none": True})
    assert (await client.post("/webhook", json=RESOLVED)).status == 200


async def test_five_megabyte_body_gets_413_without_being_read(remediator):
    client = await remediator()
    body = b'{"pad": "' + b"x" * (5 * 1024 * 1024) + b'"}'
    response = await client.post("/webhook", data=body, headers={**AUTH, "Content-Type": "application/json"})
    assert response.status == 413
    assert "larger than 1048576 bytes" in (await response.json())["error"]


async def test_chunked_body_over_the_cap_gets_413(remediator):
    client = await remediator(body_limit=4096)

    async def chunks():
        for _ in range(100):
            yield b"x" * 1024

    response = await client.post("/webhook", data=chunks(), headers=AUTH)
    assert response.status == 413


@pytest.mark.parametrize("body", [b'{"version": "4", "alerts": [', b"\xff\xfe{}", b"[" * 200_000, b""])
async def test_invalid_json_gets_400(remediator, body):
    client = await remediator()
    response = await client.post("/webhook", data=body, headers=AUTH)
    assert response.status == 400
    assert (await response.json())["error"].startswith("invalid JSON")


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda p: p["alerts"][0].update(startsAt="yesterday"), "alerts.0.startsAt"),
        (lambda p: p["alerts"][0].update(labels=["target", "a"]), "alerts.0.labels"),
        (lambda p: p["alerts"][0].pop("fingerprint"), "alerts.0.fingerprint"),
        (lambda p: p["alerts"][0].update(status="burning"), "alerts.0.status"),
        (lambda p: p.update(alerts={"a": 1}), "alerts"),
        (lambda p: p.update(version="3"), "version"),
        (lambda p: p.update(truncatedAlerts="many"), "truncatedAlerts"),
    ],
)
async def test_wrong_types_get_422_naming_the_field(remediator, restarter, mutate, field):
    client = await remediator()
    payload = alert_payload("a")
    mutate(payload)
    status, body = await post(client, payload)
    assert status == 422
    assert any(f.startswith(field + ":") for f in body["fields"]), body
    assert field in body["error"]
    assert restarter.calls == 0


async def test_a_json_list_gets_422(remediator):
    client = await remediator()
    status, body = await post(client, [1, 2])
    assert status == 422 and "valid dictionary" in body["error"]


async def test_unknown_target_is_refused_and_not_a_metric_label(remediator, restarter, exporter):
    client = await remediator()
    status, body = await post(client, alert_payload("gpu-zz"))
    assert status == 200 and body["decisions"][0]["reason"] == "unknown_target"
    assert restarter.calls == 0 and exporter.requests == 0
    assert (
        await metric(client, 'llm_vitals_remediator_decisions_total{reason="unknown_target",target="(unknown)"}') == 1
    )
    assert "gpu-zz" not in await (await client.get("/metrics")).text()
    [row] = await actions(client)
    assert row["target"] == "gpu-zz" and row["decision"] == "refused"


async def test_redelivery_is_a_duplicate(remediator, restarter):
    client = await remediator()
    assert (await post(client, alert_payload("a")))[1]["decisions"][0]["reason"] == "allowed"
    await client.service.wait_idle()
    client.clock.advance(3600)  # past the cooldown: only the dedupe holds
    assert (await post(client, alert_payload("a")))[1]["decisions"][0]["reason"] == "duplicate"
    assert restarter.calls == 1


async def test_global_cooldown_spans_targets_and_then_opens(remediator, restarter, exporter):
    exporter.targets["b"]["state"] = "stuck"
    client = await remediator()
    assert (await post(client, alert_payload("a")))[1]["decisions"][0]["reason"] == "allowed"
    await client.service.wait_idle()
    b = alert_payload("b", fingerprint="b1")
    assert (await post(client, b))[1]["decisions"][0]["reason"] == "cooldown"
    client.clock.advance(900)
    assert (await post(client, b))[1]["decisions"][0]["reason"] == "allowed"
    await client.service.wait_idle()
    assert restarter.calls == 2


async def test_executor_failure_is_journaled_counted_and_cooldown_still_holds(remediator, restarter, exporter):
    restarter.status = 500
    exporter.targets["b"]["state"] = "stuck"
    client = await remediator()
    await post(client, alert_payload("a"))
    await client.service.wait_idle()
    [row] = await actions(client)
    assert row["result"] == "error" and "HTTP 500" in row["detail"]
    assert await metric(client, 'llm_vitals_remediator_restarts_total{result="error",target="a"}') == 1
    assert (await post(client, alert_payload("b", fingerprint="b1")))[1]["decisions"][0]["reason"] == "cooldown"


async def test_exporter_unreachable_does_nothing_and_asks_for_a_retry(remediator, restarter, exporter):
    exporter.fail_with = 500
    client = await remediator()
    status, body = await post(client, alert_payload("a"))
    # Nothing was started, so a retry is safe: 503 makes Alertmanager try again with backoff.
    assert status == 503 and body["decisions"][0]["reason"] == "exporter_unreachable"
    assert restarter.calls == 0
    [row] = await actions(client)
    assert row["reason"] == "exporter_unreachable" and row["decision"] == "refused"
    exporter.fail_with = None
    status, body = await post(client, alert_payload("a"))
    assert status == 200 and body["decisions"][0]["reason"] == "allowed"


async def test_never_5xx_once_a_restart_was_started(remediator, restarter, exporter):
    """One payload, two alerts: the first starts a restart, the second cannot reach the exporter."""
    exporter.targets["b"]["state"] = "stuck"
    exporter.fail_after = 1
    client = await remediator(exporter_max_age=0)
    payload = alert_payload("a")
    payload["alerts"].append(alert_payload("b", fingerprint="fb")["alerts"][0])
    status, body = await post(client, payload)
    assert status == 200
    assert [d["reason"] for d in body["decisions"]] == ["allowed", "exporter_unreachable"]
    await client.service.wait_idle()
    assert restarter.calls == 1


async def test_restart_detected_by_the_exporter_without_a_start_time_refuses(remediator, restarter, exporter):
    from test_remediator_helpers import STARTS_AT_UNIX

    exporter.targets["a"].update(process_start_time=None, last_restart_at=STARTS_AT_UNIX + 5)
    client = await remediator()
    status, body = await post(client, alert_payload("a"))
    assert status == 200 and body["decisions"][0]["reason"] == "restarted_since_alert"
    # No restart of its own explains it: the journal says another actor restarted it (a static target: not the kubelet).
    assert (await actions(client))[0]["actor"] == "other"
    exporter.targets["a"].update(last_restart_at=STARTS_AT_UNIX - 5)
    client2 = await remediator(state_path=str(client.service.journal.path) + "-2")
    assert (await post(client2, alert_payload("a")))[1]["decisions"][0]["reason"] == "allowed"


async def test_exporter_not_listening_is_unreachable(remediator, restarter):
    from conftest import free_port

    client = await remediator(exporter_url=f"http://127.0.0.1:{free_port()}")
    status, body = await post(client, alert_payload("a"))
    assert status == 503 and body["decisions"][0]["reason"] == "exporter_unreachable"


async def test_exporter_answer_over_the_cap_is_unreachable_without_reading_it_all(aiohttp_server):
    import asyncio

    import aiohttp
    from aiohttp import web

    from llm_vitals.remediator.exporter_client import _MAX_BYTES, ExporterClient

    sent = 0

    async def endless(request):
        nonlocal sent
        response = web.StreamResponse()
        await response.prepare(request)
        try:
            while sent < 8 * _MAX_BYTES:
                await response.write(b" " * 65536)
                sent += 65536
        except (ConnectionError, RuntimeError):
            pass  # the client hung up, as it should
        return response

    app = web.Application()
    app.router.add_get("/api/v1/targets", endless)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as http:
        client = ExporterClient(str(server.make_url("")), http, timeout=30)
        assert await asyncio.wait_for(client.fleet(), 60) is None
    assert sent < 4 * _MAX_BYTES


async def test_exporter_trickling_its_answer_is_unreachable_within_the_timeout(aiohttp_server, caplog):
    import asyncio
    import time

    import aiohttp
    from aiohttp import web

    from llm_vitals.remediator.exporter_client import ExporterClient

    async def trickle(request):
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(600):  # a byte every 50 ms: no single read ever waits out the timeout
            await response.write(b" ")
            await asyncio.sleep(0.05)
        return response

    app = web.Application()
    app.router.add_get("/api/v1/targets", trickle)
    server = await aiohttp_server(app)
    url = str(server.make_url("")).replace("://", "://reader:exporter-s3cret@")
    caplog.set_level(logging.DEBUG)
    async with aiohttp.ClientSession() as http:
        client = ExporterClient(url, http, timeout=0.5)
        began = time.monotonic()
        assert await client.fleet() is None
        assert time.monotonic() - began < 10
    from llm_vitals.logs import JsonFormatter

    # Our own lines, fields included (the client library logs no request lines of its own).
    ours = "\n".join(JsonFormatter().format(r) for r in caplog.records if r.name.startswith("llm_vitals.remediator"))
    assert "exporter unreachable" in ours and "127.0.0.1" in ours and "exporter-s3cret" not in ours


async def test_target_no_longer_stuck_is_refused(remediator, restarter, exporter):
    exporter.targets["a"]["state"] = "busy"
    client = await remediator()
    status, body = await post(client, alert_payload("a"))
    assert status == 200 and body["decisions"][0]["reason"] == "not_stuck"
    assert restarter.calls == 0


async def test_budget_opens_the_circuit_until_an_authenticated_reset(remediator, restarter):
    client = await remediator(budget={"max_restarts": 1, "window": "1h"}, global_cooldown="1m")
    await post(client, alert_payload("a"))
    await client.service.wait_idle()
    assert await metric(client, 'llm_vitals_remediator_circuit_open{workload="a"}') == 1
    client.clock.advance(7200)  # past the window: the circuit stays open anyway
    again = alert_payload("a", starts_at="2026-12-02T16:00:00Z")
    assert (await post(client, again))[1]["decisions"][0]["reason"] == "circuit_open"
    assert (await client.post("/api/v1/circuit/reset", json={"target": "a"})).status == 401
    assert (await client.post("/api/v1/circuit/reset", json={"target": "zz"}, headers=AUTH)).status == 404
    response = await client.post("/api/v1/circuit/reset", json={"target": "a"}, headers=AUTH)
    assert response.status == 200 and await response.json() == {"reset": ["a"], "were_open": ["a"]}
    assert await metric(client, 'llm_vitals_remediator_circuit_open{workload="a"}') == 0
    assert (await post(client, again))[1]["decisions"][0]["reason"] == "allowed"
    await client.service.wait_idle()
    assert restarter.calls == 2
    assert [r["decision"] for r in await actions(client, 3)] == ["restart", "circuit_reset", "refused"]


async def test_dry_run_records_would_restart_and_runs_nothing(remediator, restarter):
    client = await remediator(dry_run=True)
    status, body = await post(client, alert_payload("a"))
    assert status == 200 and body["decisions"][0]["decision"] == "dry_run"
    assert (await post(client, alert_payload("a")))[1]["decisions"][0]["reason"] == "duplicate"
    assert restarter.calls == 0
    assert [r["decision"] for r in await actions(client)] == ["refused", "dry_run"]


async def test_actions_limit_and_healthz(remediator):
    client = await remediator()
    for i in range(3):
        await post(client, alert_payload("a", remediation=None, fingerprint=f"f{i}"))
    assert [r["fingerprint"] for r in await actions(client, 2)] == ["f2", "f1"]
    for bad in ("0", "x", "100000"):
        assert (await client.get(f"/api/v1/actions?limit={bad}", headers=AUTH)).status == 400
    response = await client.get("/healthz")
    assert response.status == 200 and (await response.json())["status"] == "ok"


async def test_secrets_never_leak_into_logs_answers_or_the_journal(remediator, restarter, caplog, tmp_path):
    caplog.set_level(logging.DEBUG)
    secret_url = "http://operator:hunter2-secret@127.0.0.1:1/restart"  # refuses connections
    targets = {name: {"executor": "http", "url": restarter.url} for name in TARGETS}
    targets["a"] = {"executor": "http", "url": secret_url, "timeout": "2s"}
    client = await remediator(targets=targets)
    texts = []
    for headers in ({}, {"Authorization": "Bearer " + TOKEN[:-1]}, AUTH):
        response = await client.post("/webhook", json=alert_payload("a"), headers=headers)
        texts.append(await response.text())
    response = await client.post("/webhook", data=b"{bad", headers=AUTH)
    texts.append(await response.text())
    await client.service.wait_idle()
    texts.append(await (await client.get("/api/v1/actions", headers=AUTH)).text())
    texts.append(await (await client.get("/metrics")).text())
    texts.append(repr(client.server.app))
    everything = "\n".join(texts) + caplog.text
    assert "Connect" in texts[-3]  # the failed restart is journaled ...
    for secret in (TOKEN, "hunter2-secret"):
        assert secret not in everything  # ... without the credentials of either side


async def test_journal_prunes_old_refusals_at_start_and_keeps_restarts(tmp_path):
    # The gate's state moved from the journal's rows to its store, a row of the same file.
    from llm_vitals.remediator import shared
    from llm_vitals.remediator.gate import AlertFacts, Effects
    from llm_vitals.remediator.journal import Journal
    from llm_vitals.remediator.sqlite_store import SqliteStore

    alert = AlertFacts("firing", {"target": "a", "alertname": "LLMServerStuck"}, "fp", 1000.0)
    journal = Journal(tmp_path / "j.db", retention=3600)
    await journal.open(now=10_000)
    store = SqliteStore(tmp_path / "j.db", 3600, lambda: 10_000)
    await store.open()
    journal.record_decision(2000, alert, "refused", "cooldown")
    journal.record_decision(9000, alert, "refused", "cooldown")
    state, version = await store.read()
    intent = shared.with_effects(state, Effects(intent=True, open_circuit=True), alert, 2000, shared.Intent("r/1", "a", None))
    assert await store.commit(version, intent)
    await journal.record_intent(2000, alert, "http")
    await store.close()
    await journal.close()
    journal = Journal(tmp_path / "j.db", retention=3600)
    assert await journal.open(now=10_000) == 1  # the pending restart was interrupted
    store = SqliteStore(tmp_path / "j.db", 3600, lambda: 10_000)
    await store.open()
    rows = await journal.actions(10)
    assert [(r["time"], r["decision"], r["result"]) for r in rows] == [
        (9000, "refused", None),
        (2000, "restart", "interrupted"),
    ]
    assert store.last.open_circuits == {"a"} and alert.key in store.last.decided_keys
    assert store.last.last_restart_started == 2000
    await store.close()
    await journal.close()


async def test_a_straggler_of_a_clearing_fleet_wide_fault_is_not_restarted(remediator, restarter, exporter):
    """b and c read healthy again but were unhealthy within the exporter's last two polls."""
    for name in "bc":
        exporter.targets[name].update(state="busy", recently_unhealthy=True)
    client = await remediator()
    status, body = await post(client, alert_payload("a"))
    assert status == 200 and body["decisions"][0]["reason"] == "fleet_gate"
    assert restarter.calls == 0
