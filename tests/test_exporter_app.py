"""The exporter's routes on a live app: the metric contract, the API shape, probes, drain, canaries, secrets."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from test_exporter_helpers import (
    BUSY_PAGE,
    FakeVllm,
    make_settings,
    make_target,
    record,
    start_exporter,
    target_json,
    wait_for,
)

from llm_vitals.exporter.app import STORE, create_app
from llm_vitals.exporter.canary import run_canaries
from llm_vitals.exporter.verdict import CanaryOutcome, PollError, judge, record_canary

# docs/metrics.md: the public contract (name -> type, labels besides `target`).
CONTRACT = {
    "llm_vitals_target_info": ("gauge", {"engine", "role", "url", "namespace", "pod", "node", "workload"}),
    "llm_vitals_up": ("gauge", set()),
    "llm_vitals_state": ("gauge", {"state"}),
    "llm_vitals_paused_too_long": ("gauge", set()),
    "llm_vitals_requests_running": ("gauge", set()),
    "llm_vitals_requests_waiting": ("gauge", set()),
    "llm_vitals_engine_steps_per_second": ("gauge", set()),
    "llm_vitals_generation_tokens_per_second": ("gauge", set()),
    "llm_vitals_stuck_seconds": ("gauge", set()),
    "llm_vitals_restarts": ("counter", set()),
    "llm_vitals_process_start_time_seconds": ("gauge", set()),
    "llm_vitals_canary_requests": ("counter", {"result"}),
    "llm_vitals_canary_last_success_timestamp_seconds": ("gauge", set()),
    "llm_vitals_ready": ("gauge", set()),
    "llm_vitals_live": ("gauge", set()),
    "llm_vitals_draining": ("gauge", set()),
    "llm_vitals_gpu_fault": ("gauge", set()),
    "llm_vitals_gpu_fault_events_lossy": ("gauge", set()),
    "llm_vitals_pace_ratio": ("gauge", set()),
    "llm_vitals_degraded": ("gauge", set()),
    "llm_vitals_last_poll_timestamp_seconds": ("gauge", set()),
    "llm_vitals_poll_duration_seconds": ("gauge", set()),
    "llm_vitals_poll_errors": ("counter", {"reason"}),
}
TARGET_KEYS = {"name", "engine", "role", "url", "state", "reason", "detail", "since", "stuck_seconds",
               "process_start_time", "last_poll", "up", "ready", "live", "draining", "gpu_fault", "restarts",
               "running", "waiting", "steps_per_second", "generation_tokens_per_second", "counters",
               "last_unhealthy_at", "recently_unhealthy"}


async def test_metrics_follow_the_design_contract(aiohttp_server, aiohttp_client) -> None:
    upstream = FakeVllm()
    server = await aiohttp_server(upstream.app())
    client = await start_exporter(aiohttp_client, make_settings([make_target("gpu-a", str(server.make_url("")))]))
    await wait_for(lambda: record(client, "gpu-a").verdict.last_canary_ok, what="first poll and canary")

    response = await client.get("/metrics")
    assert response.status == 200
    families = {f.name: f for f in text_string_to_metric_families(await response.text())}
    for name, (kind, extra_labels) in CONTRACT.items():
        assert name in families, name
        family = families[name]
        assert family.type == kind, name
        # A lone target's pace is not judged: its ratio has no sample (never a made-up 1).
        assert family.samples or name == "llm_vitals_pace_ratio", name
        for sample in family.samples:
            assert set(sample.labels) == {"target"} | extra_labels, (name, sample.labels)
            assert sample.labels["target"] == "gpu-a"
    states = {s.labels["state"]: s.value for s in families["llm_vitals_state"].samples}
    assert sorted(states) == sorted(["starting", "idle", "busy", "stuck", "unresponsive", "down", "asleep", "waiting_on_peer",
                                   "paused"])
    assert list(states.values()).count(1.0) == 1 and states["idle"] == 1.0
    assert {s.name for s in families["llm_vitals_restarts"].samples} == {"llm_vitals_restarts_total"}
    assert "cached" in families["llm_vitals_up"].documentation.lower() or "cache" in families["llm_vitals_up"].documentation
    errors = {s.labels["reason"] for s in families["llm_vitals_poll_errors"].samples}
    assert {"connect", "timeout", "http_status", "bad_metrics", "too_large"} <= errors


async def test_a_removed_target_leaves_no_series(aiohttp_client) -> None:
    both = make_settings([make_target("a", "http://127.0.0.1:9"), make_target("b", "http://127.0.0.1:9")])
    first = await aiohttp_client(create_app(both, poll=False))
    assert 'target="b"' in await (await first.get("/metrics")).text()
    only_a = make_settings([make_target("a", "http://127.0.0.1:9")])
    second = await aiohttp_client(create_app(only_a, poll=False))
    text = await (await second.get("/metrics")).text()
    assert 'target="a"' in text and 'target="b"' not in text


async def test_api_shape_matches_the_interface(aiohttp_server, aiohttp_client) -> None:
    upstream = FakeVllm(BUSY_PAGE)
    server = await aiohttp_server(upstream.app())
    client = await start_exporter(aiohttp_client, make_settings(
        [make_target("gpu-a", str(server.make_url(""))), make_target("gone", "http://127.0.0.1:9")]))
    await wait_for(lambda: record(client, "gpu-a").verdict.last_poll, what="first poll")

    listing = await (await client.get("/api/v1/targets")).json()
    assert isinstance(listing["generated_at"], float)
    assert [t["name"] for t in listing["targets"]] == ["gpu-a", "gone"]
    one = await target_json(client, "gpu-a")
    assert set(one) >= TARGET_KEYS
    assert one["state"] == "busy" and one["running"] == 2 and one["waiting"] == 6
    assert one["process_start_time"] == pytest.approx(1796222422.26)
    assert one["counters"] == {"steps": 462.0, "generation_tokens": 903.0, "prompt_tokens": 29.0, "finished": 1.0,
                               "kv_usage": pytest.approx(0.0019536019536019467)}
    assert one["ready"] is True  # busy is ready: load never makes a server unready
    missing = await client.get("/api/v1/targets/nope")
    assert missing.status == 404
    assert await missing.json() == {"error": "unknown target 'nope'"}

    await wait_for(lambda: len(record(client, "gpu-a").history) >= 2, what="two history points")
    points = (await (await client.get("/api/v1/targets/gpu-a/history")).json())["points"]
    assert all(len(p) == 3 and isinstance(p[0], float) and p[2] in ("busy",) for p in points)
    assert (await client.get("/api/v1/targets/nope/history")).status == 404


async def test_probes_answer_from_the_cache(aiohttp_client) -> None:
    settings = make_settings([make_target("gpu-a", "http://127.0.0.1:9", stuck_after=60)])
    client = await aiohttp_client(create_app(settings, poll=False))
    rec = client.app[STORE].get("gpu-a")
    target = rec.settings

    async def status(kind: str) -> int:
        return (await client.get(f"/probe/gpu-a/{kind}")).status

    assert (await status("startup"), await status("ready"), await status("live")) == (503, 503, 200)
    from llm_vitals.exporter.engines import PageReading
    t0 = rec.verdict.first_seen
    for _ in range(2):  # idle: a whole interval with nothing pending and nothing moving
        rec.record_poll(judge(rec.verdict, PageReading(0, 0, 1, 1, 1, 1, 0.0, 5.0), t0, target), t0, 0.01)
    rec.record_canary("ok", record_canary(rec.verdict, CanaryOutcome("ok"), t0, target))
    assert (await status("startup"), await status("ready"), await status("live")) == (200, 200, 200)
    rec.record_poll(judge(rec.verdict, PollError("connect", "refused"), t0 + 1, target), t0 + 1, 0.01)
    assert (await status("startup"), await status("ready"), await status("live")) == (200, 503, 200)
    body = await (await client.get("/probe/gpu-a/ready")).json()
    assert body["state"] == "down" and body["reason"] == "connect"
    assert (await client.get("/probe/gpu-a/other")).status == 404
    assert (await client.get("/probe/nope/ready")).status == 404


async def test_drain_is_guarded_by_the_bearer_token(aiohttp_client) -> None:
    settings = make_settings([make_target("gpu-a", "http://127.0.0.1:9", startup_grace=60)],
                             environ={"DRAIN_TOKEN": "drain-secret-789"}, drain_token_env="DRAIN_TOKEN")
    client = await aiohttp_client(create_app(settings, poll=False))
    rec = client.app[STORE].get("gpu-a")
    from llm_vitals.exporter.engines import PageReading
    t0 = rec.verdict.first_seen
    rec.record_poll(judge(rec.verdict, PageReading(1, 0, 1, 1, 1, 1, 0.0, 5.0), t0, rec.settings), t0, 0.01)
    assert (await client.get("/probe/gpu-a/ready")).status == 200

    assert (await client.post("/probe/gpu-a/drain")).status == 401
    assert (await client.post("/probe/gpu-a/drain", headers={"Authorization": "Bearer wrong"})).status == 401
    auth = {"Authorization": "Bearer drain-secret-789"}
    drained = await client.post("/probe/gpu-a/drain", headers=auth)
    assert drained.status == 200 and (await drained.json())["draining"] is True
    assert (await client.get("/probe/gpu-a/ready")).status == 503
    assert (await client.get("/probe/gpu-a/live")).status == 200
    assert "llm_vitals_draining{target=\"gpu-a\"} 1.0" in await (await client.get("/metrics")).text()
    assert (await client.post("/probe/gpu-a/undrain", headers=auth)).status == 200
    assert (await client.get("/probe/gpu-a/ready")).status == 200
    assert (await client.post("/probe/nope/drain", headers=auth)).status == 404


async def test_idle_canary_uses_the_first_model_and_one_greedy_token(aiohttp_server, aiohttp_client) -> None:
    upstream = FakeVllm()
    server = await aiohttp_server(upstream.app())
    client = await start_exporter(aiohttp_client, make_settings([make_target("gpu-a", str(server.make_url("")))]))
    await wait_for(lambda: upstream.completions, what="a canary")
    assert upstream.completions[0]["body"] == {"model": "tiny", "prompt": "ping", "max_tokens": 1, "temperature": 0}
    await wait_for(lambda: record(client, "gpu-a").canaries["ok"] >= 1, what="canary counted")
    assert (await client.get("/probe/gpu-a/ready")).status == 200


async def test_busy_server_gets_no_canary(aiohttp_server, aiohttp_client) -> None:
    upstream = FakeVllm(BUSY_PAGE)
    server = await aiohttp_server(upstream.app())
    client = await start_exporter(aiohttp_client, make_settings([make_target("gpu-a", str(server.make_url("")))]))
    await wait_for(lambda: record(client, "gpu-a").polls >= 6, what="six polls")
    assert upstream.completions == []
    assert sum(record(client, "gpu-a").canaries.values()) == 0


async def test_hung_canaries_make_an_idle_server_unresponsive_one_at_a_time(aiohttp_server, aiohttp_client) -> None:
    upstream = FakeVllm()
    upstream.completion_mode = "hang"
    server = await aiohttp_server(upstream.app())
    target = make_target("gpu-a", str(server.make_url("")), canary={"interval": 0.2, "timeout": 0.4})
    client = await start_exporter(aiohttp_client, make_settings([target]))
    try:
        await wait_for(lambda: record(client, "gpu-a").verdict.state == "unresponsive", what="unresponsive")
        rec = record(client, "gpu-a")
        assert rec.canaries["timeout"] == 3 and rec.verdict.reason == "canary_failed"
        # At most one canary in flight: never more sent than timed out, plus the one now running.
        assert len(upstream.completions) <= rec.canaries["timeout"] + 1
        assert (await client.get("/probe/gpu-a/ready")).status == 503
        upstream.completion_mode = "ok"
        upstream.release.set()
        await wait_for(lambda: record(client, "gpu-a").verdict.state == "idle", what="back to idle")
    finally:
        upstream.release.set()


async def test_no_secret_in_logs_api_errors_or_metrics(aiohttp_server, aiohttp_client, caplog) -> None:
    secret = "sk-very-secret-4242"
    upstream = FakeVllm()
    upstream.completion_mode = "error"  # 500 whose body echoes the Authorization header
    server = await aiohttp_server(upstream.app())
    settings = make_settings([make_target("gpu-a", str(server.make_url("")), api_key_env="VLLM_KEY",
                                          canary={"interval": 0.1, "timeout": 1})],
                             environ={"VLLM_KEY": secret})
    caplog.set_level(logging.DEBUG)
    client = await start_exporter(aiohttp_client, settings)
    await wait_for(lambda: record(client, "gpu-a").verdict.state == "unresponsive", what="unresponsive")
    # The key was used (so the test proves something) ...
    assert upstream.completions[0]["headers"]["Authorization"] == f"Bearer {secret}"
    assert upstream.models_headers[0]["Authorization"] == f"Bearer {secret}"
    # ... and appears nowhere the exporter writes.
    answers = [await (await client.get(path)).text() for path in (
        "/metrics", "/api/v1/targets", "/api/v1/targets/gpu-a", "/api/v1/targets/gpu-a/history",
        "/probe/gpu-a/ready", "/probe/gpu-a/live", "/probe/gpu-a/startup", "/healthz")]
    logs = caplog.text + "".join(str(getattr(r, "fields", "")) for r in caplog.records)
    for text in [*answers, logs, repr(settings), repr(record(client, "gpu-a").verdict)]:
        assert secret not in text
    assert "canary failed" in caplog.text  # the failures were logged, just without the key


async def test_gpu_fault_file_flags_the_target_and_makes_it_unready(aiohttp_server, aiohttp_client, tmp_path) -> None:
    upstream = FakeVllm(BUSY_PAGE)
    server = await aiohttp_server(upstream.app())
    flag = tmp_path / "gpu-a.fault"
    client = await start_exporter(aiohttp_client, make_settings(
        [make_target("gpu-a", str(server.make_url("")), gpu_fault_file=str(flag))]))
    rec = record(client, "gpu-a")
    await wait_for(lambda: rec.verdict.state == "busy", what="busy")
    assert (await target_json(client, "gpu-a"))["gpu_fault"] is False
    flag.write_text("Xid 79: GPU has fallen off the bus\n")
    await wait_for(lambda: rec.gpu_fault, what="gpu fault flagged")
    view = await target_json(client, "gpu-a")
    assert view["gpu_fault"] is True and view["gpu_fault_detail"] == "Xid 79: GPU has fallen off the bus"
    assert view["ready"] is False
    assert 'llm_vitals_gpu_fault{target="gpu-a"} 1.0' in await (await client.get("/metrics")).text()
    flag.unlink()
    await wait_for(lambda: rec.gpu_fault is None, what="gpu fault cleared")


async def test_an_unreadable_gpu_fault_file_keeps_the_fault_it_held_and_shows_why(aiohttp_server, aiohttp_client,
                                                                                  tmp_path) -> None:
    upstream = FakeVllm(BUSY_PAGE)
    server = await aiohttp_server(upstream.app())
    flag = tmp_path / "gpu-a.fault"
    flag.write_text("Xid 79: GPU has fallen off the bus\n")
    client = await start_exporter(aiohttp_client, make_settings(
        [make_target("gpu-a", str(server.make_url("")), gpu_fault_file=str(flag), stuck_after=600)]))
    rec = record(client, "gpu-a")
    await wait_for(lambda: rec.gpu_fault, what="gpu fault flagged")
    flag.unlink()
    flag.mkdir()  # the path made a directory: unreadable, not cleared
    await wait_for(lambda: "file" in rec.gpu_fault_errors, what="the read error shown")
    polls = rec.polls
    await wait_for(lambda: rec.polls >= polls + 3, what="three more polls")
    view = await target_json(client, "gpu-a")
    assert view["gpu_fault"] is True and view["gpu_fault_detail"] == "Xid 79: GPU has fallen off the bus"
    assert view["gpu_fault_errors"]["file"] == f"cannot read {flag}: Is a directory"
    assert view["ready"] is False
    flag.rmdir()  # absent: the agent cleared it
    await wait_for(lambda: rec.gpu_fault is None and "file" not in rec.gpu_fault_errors, what="cleared, no error")


async def test_credentials_in_a_target_url_are_not_shown(aiohttp_client) -> None:
    settings = make_settings([make_target("gpu-a", "http://admin:hunter2-pw@127.0.0.1:9/")])
    client = await aiohttp_client(create_app(settings, poll=False))
    for path in ("/metrics", "/api/v1/targets", "/api/v1/targets/gpu-a"):
        text = await (await client.get(path)).text()
        assert "hunter2-pw" not in text and "http://127.0.0.1:9" in text


async def test_each_state_change_is_one_json_log_line(aiohttp_server, aiohttp_client, caplog) -> None:
    from llm_vitals.logs import JsonFormatter

    upstream = FakeVllm(BUSY_PAGE)
    server = await aiohttp_server(upstream.app())
    caplog.set_level(logging.INFO, logger="llm_vitals.exporter")
    client = await start_exporter(aiohttp_client, make_settings([make_target("gpu-a", str(server.make_url("")))]))
    rec = record(client, "gpu-a")
    await wait_for(lambda: rec.verdict.state == "busy", what="busy")
    upstream.metrics_status = 500
    await wait_for(lambda: rec.verdict.state == "down", what="down")
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records if r.getMessage() == "state change"]
    assert [(line["from"], line["to"]) for line in lines] == [("starting", "busy"), ("busy", "down")]
    last = lines[-1]
    assert last["target"] == "gpu-a" and last["reason"] == "http_status" and last["restarts"] == 0
    assert last["counters"]["generation_tokens"] == 903.0


async def test_a_canary_answer_that_arrives_in_pieces_is_ok(aiohttp_server) -> None:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = json.dumps({"choices": [{"index": 0, "text": " the"}]}).encode()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(body[:10])
        await asyncio.sleep(0.05)  # the rest arrives later, as through a proxy or a slow link
        await response.write(body[10:])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    server = await aiohttp_server(app)
    target = make_settings([make_target("gpu-a", str(server.make_url("")))]).targets[0]
    async with aiohttp.ClientSession() as session:
        run = await run_canaries(session, target, "tiny")
    assert (run.outcome.result, run.outcome.detail) == ("ok", "")


async def test_a_slow_health_check_does_not_turn_stuck_into_down(aiohttp_server, aiohttp_client) -> None:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=BUSY_PAGE, content_type="text/plain")  # work pending, nothing moving

    async def slow_health(request: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.Response()

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", slow_health)
    server = await aiohttp_server(app)
    client = await start_exporter(aiohttp_client, make_settings(
        [make_target("gpu-a", str(server.make_url("")))], health_timeout=0.1))
    rec = record(client, "gpu-a")
    await wait_for(lambda: rec.verdict.state == "stuck", what="stuck")
    assert rec.poll_errors["timeout"] == 0 and rec.verdict.up is True


async def test_a_bug_in_the_canary_is_logged_and_not_counted_against_the_server(
        aiohttp_server, aiohttp_client, caplog, monkeypatch) -> None:
    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr("llm_vitals.exporter.poller.run_canaries", broken)
    upstream = FakeVllm()
    server = await aiohttp_server(upstream.app())
    caplog.set_level(logging.ERROR, logger="llm_vitals.exporter")
    client = await start_exporter(aiohttp_client, make_settings(
        [make_target("gpu-a", str(server.make_url("")), canary={"interval": 0.1, "timeout": 1})]))
    rec = record(client, "gpu-a")
    await wait_for(lambda: sum("canary failed unexpectedly" in r.getMessage() for r in caplog.records) >= 2,
                   what="two canaries that hit the bug")
    assert sum(rec.canaries.values()) == 0 and rec.verdict.canary_failures == 0
    assert rec.verdict.state == "idle"

