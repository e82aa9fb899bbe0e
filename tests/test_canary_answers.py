"""What a canary's answer means: a timeout, a reset or a 5xx is a failed canary; a 4xx is `canary_rejected`.

A rejection (a renamed model, a rotated key, a chat-only or embeddings server) is shown and alerted,
never counted toward `unresponsive`, and never restartable. The meaning is a pure function
(`judge_answer`), tested as a table; the I/O edge against real aiohttp servers on loopback.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from test_exporter_helpers import FakeVllm, make_settings, make_target, record, start_exporter, target_json, wait_for

from llm_vitals.exporter.canary import CHAT, COMPLETION, EMBEDDINGS, canaries_of, judge_answer, run_canaries
from llm_vitals.exporter.engines import PageReading
from llm_vitals.exporter.settings import ConfigError, TargetSettings
from llm_vitals.exporter.verdict import CanaryOutcome, Verdict, initial, is_ready, judge, record_canary
from llm_vitals.remediator.exporter_client import parse_targets
from llm_vitals.remediator.gate import AlertFacts, FleetView, GatePolicy, JournalState, decide
from llm_vitals.sim.fleet import Fleet, SimConfig

CHOICES = json.dumps({"choices": [{"index": 0, "text": " the"}]}).encode()
EMBEDDED = json.dumps({"data": [{"index": 0, "embedding": [0.1, 0.2]}]}).encode()


def target(**canary: Any) -> TargetSettings:
    return make_settings([make_target("gpu-a", "http://127.0.0.1:9", canary={"interval": 0.5, "timeout": 1, **canary})]).targets[0]


@pytest.mark.parametrize(("status", "body", "canary", "result"), [
    (200, CHOICES, COMPLETION, "ok"),
    (200, EMBEDDED, EMBEDDINGS, "ok"),
    (500, b"", COMPLETION, "error"),
    (502, b"", COMPLETION, "error"),
    (503, b"", COMPLETION, "error"),
    (400, b"", COMPLETION, "rejected"),
    (401, b"", COMPLETION, "rejected"),
    (403, b"", COMPLETION, "rejected"),
    (404, b"", COMPLETION, "rejected"),
    (405, b"", COMPLETION, "rejected"),
    (422, b"", COMPLETION, "rejected"),
    (429, b"", COMPLETION, "rejected"),
    (307, b"", COMPLETION, "rejected"),  # a redirect (never followed): the url is not the API
    (200, b"<html>login</html>", COMPLETION, "rejected"),  # not JSON: a portal, not an engine
    (200, b'{"choices": []}', COMPLETION, "rejected"),
    (200, CHOICES, EMBEDDINGS, "rejected"),  # the answer of another route
], ids=lambda v: str(v)[:20])
def test_what_an_answer_means(status: int, body: bytes, canary, result: str) -> None:
    outcome = judge_answer(status, body, canary)
    assert outcome.result == result
    if result != "ok":
        assert canary.path in outcome.detail


def test_rejection_details_name_the_likely_cause_and_never_the_body() -> None:
    assert "renamed model" in judge_answer(404, b"", COMPLETION).detail
    assert "API key" in judge_answer(401, b"", COMPLETION).detail
    assert "secret" not in judge_answer(200, b"secret", COMPLETION).detail


@pytest.mark.parametrize(("engine_or_endpoint", "learned", "paths"), [
    ("auto", None, ["/v1/completions", "/v1/chat/completions", "/v1/embeddings"]),
    ("auto", "/v1/chat/completions", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]),
    ("auto", "/v1/embeddings", ["/v1/embeddings", "/v1/completions", "/v1/chat/completions"]),
    ("chat", None, ["/v1/chat/completions"]),
    ("embeddings", "/v1/completions", ["/v1/embeddings"]),
    ("completions", None, ["/v1/completions"]),
])
def test_the_canary_follows_what_the_server_serves_or_what_the_target_sets(engine_or_endpoint, learned, paths) -> None:
    assert [c.path for c in canaries_of(target(endpoint=engine_or_endpoint), learned)] == paths


def test_an_engine_with_its_own_canary_takes_only_that_one() -> None:
    triton = make_settings([{"name": "t", "url": "http://127.0.0.1:8000", "engine": "triton", "model": "m",
                             "canary": {"request": {"inputs": []}}}]).targets[0]
    assert [c.path for c in canaries_of(triton, "/v1/completions")] == ["/v2/models/{model}/infer"]


def test_an_endpoint_for_an_engine_with_its_own_canary_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"canary\.endpoint is for OpenAI-compatible servers"):
        make_settings([{"name": "t", "url": "http://127.0.0.1:8000", "engine": "triton", "model": "m",
                        "canary": {"endpoint": "chat", "request": {"inputs": []}}}])


# -- the verdict ---------------------------------------------------------------------------------

T = target(failures_before_unresponsive=2)
IDLE = replace(initial(0.0), state="idle", reason="idle", started=True, since=10.0, last_served=10.0)
REJECTED = CanaryOutcome("rejected", "/v1/completions answered HTTP 404: ...")


def fold(verdict: Verdict, *outcomes: CanaryOutcome, at: float = 20.0) -> Verdict:
    for i, outcome in enumerate(outcomes):
        verdict = record_canary(verdict, outcome, at + i, T)
    return verdict


@pytest.mark.parametrize(("case", "start", "outcomes", "state", "reason", "failures"), [
    ("one rejection is shown", IDLE, [REJECTED], "idle", "canary_rejected", 0),
    ("rejections never make unresponsive", IDLE, [REJECTED] * 5, "idle", "canary_rejected", 0),
    ("timeouts do", IDLE, [CanaryOutcome("timeout")] * 2, "unresponsive", "canary_failed", 2),
    ("5xx do", IDLE, [CanaryOutcome("error", "HTTP 500")] * 2, "unresponsive", "canary_failed", 2),
    ("a rejection ends a run of failures", IDLE, [CanaryOutcome("timeout"), REJECTED, CanaryOutcome("timeout")],
     "idle", "idle", 1),
    ("a rejection lifts unresponsive: a restart cannot fix it",
     replace(IDLE, state="unresponsive", reason="canary_failed", canary_failures=2), [REJECTED],
     "idle", "canary_rejected", 0),
    ("an answer clears it", IDLE, [REJECTED, CanaryOutcome("ok")], "idle", "canary_ok", 0),
    ("busy stays busy", replace(IDLE, state="busy", reason="progress"), [REJECTED], "busy", "progress", 0),
])
def test_a_rejected_canary_in_the_verdict(case, start, outcomes, state, reason, failures) -> None:
    after = fold(start, *outcomes)
    assert (after.state, after.reason, after.canary_failures) == (state, reason, failures)


def test_the_next_idle_poll_keeps_showing_the_rejection() -> None:
    snap = PageReading(running=0.0, waiting=0.0, steps=5.0)
    verdict = judge(None, snap, 0.0, T)
    verdict = judge(verdict, snap, 5.0, T)
    assert verdict.state == "idle"
    verdict = record_canary(verdict, REJECTED, 6.0, T)
    again = judge(verdict, snap, 10.0, T)
    assert (again.state, again.reason) == ("idle", "canary_rejected")
    assert "404" in again.detail and "restart cannot fix" in again.detail


def test_a_rejected_canary_is_not_held_against_readiness() -> None:
    # One rotated key must not take every replica out of its Service: the alert asks a human.
    stale = replace(IDLE, last_served=0.0)
    assert not is_ready(stale, T, now=1000.0, draining=False)
    assert is_ready(record_canary(stale, REJECTED, 999.0, T), T, now=1000.0, draining=False)


# -- the I/O edge, against real servers on loopback -----------------------------------------------


def answering(routes: dict[str, Any]) -> web.Application:
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_post(path, handler)
    return app


def status(code: int):
    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "no", "code": code}}, status=code)
    return handler


async def hang(request: web.Request) -> web.Response:
    await asyncio.sleep(5)
    return web.json_response({})


async def reset(request: web.Request) -> web.Response:
    assert request.transport is not None
    request.transport.abort()  # the connection reset mid-request
    await asyncio.sleep(1)
    return web.json_response({})


def body(payload: bytes):
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=payload, content_type="application/json")
    return handler


@pytest.mark.parametrize(("case", "routes", "endpoint", "result", "path"), [
    ("404 model not found", {"/v1/completions": status(404), "/v1/chat/completions": status(404),
                             "/v1/embeddings": status(404)}, "auto", "rejected", None),
    ("401 key", {"/v1/completions": status(401)}, "completions", "rejected", None),
    ("403 key", {"/v1/completions": status(403)}, "completions", "rejected", None),
    ("422 body", {"/v1/completions": status(422)}, "completions", "rejected", None),
    ("400 body", {"/v1/completions": status(400)}, "completions", "rejected", None),
    ("500", {"/v1/completions": status(500)}, "auto", "error", None),
    ("timeout", {"/v1/completions": hang}, "auto", "timeout", None),
    ("reset", {"/v1/completions": reset}, "auto", "error", None),
    ("chat-only server", {"/v1/chat/completions": body(CHOICES)}, "auto", "ok", "/v1/chat/completions"),
    ("embeddings server", {"/v1/embeddings": body(EMBEDDED)}, "auto", "ok", "/v1/embeddings"),
    ("a 5xx on the way stops the ladder", {"/v1/chat/completions": status(503), "/v1/embeddings": body(EMBEDDED)},
     "auto", "error", None),
])
async def test_the_answer_of_a_real_server(aiohttp_server, case, routes, endpoint, result, path) -> None:
    server = await aiohttp_server(answering(routes))
    settings = make_settings([make_target("gpu-a", str(server.make_url("")), canary={"timeout": 0.5, "endpoint": endpoint})])
    async with aiohttp.ClientSession() as session:
        run = await run_canaries(session, settings.targets[0], "tiny")
    assert run.outcome.result == result, run.outcome
    assert run.path == path


async def test_the_learned_endpoint_is_asked_first(aiohttp_server) -> None:
    asked: list[str] = []

    async def chat(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(body=CHOICES, content_type="application/json")

    async def completions(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.json_response({}, status=404)

    server = await aiohttp_server(answering({"/v1/completions": completions, "/v1/chat/completions": chat}))
    settings = make_settings([make_target("gpu-a", str(server.make_url("")))])
    async with aiohttp.ClientSession() as session:
        first = await run_canaries(session, settings.targets[0], "tiny")
        second = await run_canaries(session, settings.targets[0], "tiny", first.path)
    assert (first.outcome.result, second.outcome.result) == ("ok", "ok")
    assert asked == ["/v1/completions", "/v1/chat/completions", "/v1/chat/completions"]
    assert CHAT.path == first.path


# -- end to end: a renamed model is canary_rejected, and the remediator does not restart it --------


async def test_a_renamed_model_is_rejected_shown_and_never_restarted(aiohttp_server, aiohttp_client) -> None:
    upstream = FakeVllm()
    upstream.completion_mode = "rejected"  # the configured model is no longer served: every canary 4xx
    server = await aiohttp_server(upstream.app())
    client = await start_exporter(aiohttp_client, make_settings(
        [make_target("gpu-a", str(server.make_url("")), model="renamed-away",
                     canary={"interval": 0.1, "timeout": 1, "failures_before_unresponsive": 2, "endpoint": "completions"})]))
    rec = record(client, "gpu-a")
    await wait_for(lambda: rec.canaries["rejected"] >= 4, what="four rejected canaries")
    assert rec.canaries["error"] == rec.canaries["timeout"] == 0
    view = await target_json(client, "gpu-a")
    assert (view["state"], view["reason"]) == ("idle", "canary_rejected")
    assert view["ready"] is True
    page = await (await client.get("/metrics")).text()
    assert re.search(r'^llm_vitals_canary_requests_total\{(?=.*target="gpu-a")(?=.*result="rejected").*\} [1-9]', page, re.M)
    # The remediator re-checks through the same JSON: even an Unresponsive alert is refused.
    fleet = FleetView(parse_targets(await (await client.get("/api/v1/targets")).json()))
    alert = AlertFacts("firing", {"alertname": "LLMServerUnresponsive", "target": "gpu-a", "remediation": "restart"},
                       "fp", 0.0)
    policy = GatePolicy(targets=frozenset({"gpu-a"}), global_cooldown=0, max_restarts=3, budget_window=3600,
                        max_unhealthy=1)
    decision = decide(alert, fleet, JournalState(), policy, 1e9)
    assert (decision.allowed, decision.reason) == (False, "not_stuck")


async def test_simulator_drill_a_renamed_model_is_rejected_and_an_unnamed_one_follows_the_server(aiohttp_client) -> None:
    # The simulated vLLM answers 404 "The model `...` does not exist." for a model it does not serve.
    canary = {"interval": 0.2, "timeout": 2, "failures_before_unresponsive": 2}
    async with Fleet(SimConfig(), backends=2) as fleet:
        client = await start_exporter(aiohttp_client, make_settings(
            [make_target("pinned", fleet.backend_urls[0], model="renamed-away", canary=canary),
             make_target("looked-up", fleet.backend_urls[1], canary=canary)], poll_interval=0.2))
        pinned, looked_up = record(client, "pinned"), record(client, "looked-up")
        await wait_for(lambda: pinned.canaries["rejected"] >= 3 and looked_up.canaries["ok"] >= 3,
                       what="three rejected canaries to the pinned model, three answered by the served one")
        assert (pinned.verdict.state, pinned.verdict.reason) == ("idle", "canary_rejected")
        assert pinned.canaries["error"] == pinned.canaries["timeout"] == 0
        assert "HTTP 404" in pinned.verdict.detail
        assert looked_up.verdict.state == "idle" and looked_up.canaries["rejected"] == 0
