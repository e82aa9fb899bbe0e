"""The backstop's channel end to end on loopback: the real remediator's GET /api/v1/backstop, read with
the read token by the shim's ask (exporter/backstop_ask.py), and the shim's `/probe/<t>/live`.

Before, the shim's liveness read only its own verdict: a paused remediator, a paged workload or a
storm held the remediator, and the kubelet restarted the stuck server a few minutes later anyway.
"""

from __future__ import annotations

import aiohttp
from pydantic import SecretStr
from test_remediator_helpers import AUTH
from test_remediator_webhook import exporter, metric, remediator, restarter  # noqa: F401

from llm_vitals.exporter.app import create_app as create_exporter
from llm_vitals.exporter.backstop_ask import ask, ask_once
from llm_vitals.exporter.clock import Clock
from llm_vitals.exporter.keys import STORE
from llm_vitals.exporter.settings import parse_settings
from llm_vitals.exporter.verdict import Verdict
from llm_vitals.remediator.gate_word import UNKNOWN_HOLD

READ_TOKEN = "read-only-s3cret"
READ = {"Authorization": f"Bearer {READ_TOKEN}"}


class Mono:
    """The shim's clock, advanced by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def shim_settings(remediator_url: str):
    return parse_settings({
        "remediator_url": remediator_url, "backstop": {"after": "10m"},
        "targets": [{"name": "vllm", "url": "http://127.0.0.1:9", "workload": "a", "stuck_after": "120s"}],
    }, environ={})


async def remediator_with_read_token(remediator, tmp_path):  # noqa: F811
    token_file = tmp_path / "read.token"
    token_file.write_text(READ_TOKEN + "\n")
    return await remediator(auth={"bearer_token_env": "LLM_VITALS_WEBHOOK_TOKEN", "read_token_file": str(token_file)})


async def test_the_remediator_says_hold_for_a_paused_workload_and_act_once_resumed(remediator, tmp_path):  # noqa: F811
    client = await remediator_with_read_token(remediator, tmp_path)
    answer = await client.get("/api/v1/backstop?workload=a&workload=Deployment/llm/vllm", headers=READ)
    assert answer.status == 200
    body = await answer.json()
    # `a` is a static target; the Deployment is nothing this remediator ever heard of (unknown_workload).
    assert [(w["workload"], w["word"], w["reason"]) for w in body["words"]] == [
        ("a", "act", ""), ("Deployment/llm/vllm", "hold", "unknown_workload")]
    until = client.clock.now + 3600
    assert (await client.post("/api/v1/pause", json={"until": until, "reason": "upgrade"}, headers=AUTH)).status == 200
    body = await (await client.get("/api/v1/backstop?workload=a", headers=READ)).json()
    assert body["words"] == [{"workload": "a", "word": "hold", "reason": "paused", "since": None,
                              "detail": f"the remediator is paused until {until:.0f}: upgrade"}]
    assert (await client.get("/api/v1/backstop", headers=READ)).status == 400
    assert (await client.get("/api/v1/backstop?workload=a")).status == 401


async def test_a_paused_remediator_holds_the_shims_liveness_and_silence_arms_it(remediator, tmp_path, aiohttp_client):  # noqa: F811
    client = await remediator_with_read_token(remediator, tmp_path)
    until = client.clock.now + 3600
    await client.post("/api/v1/pause", json={"until": until, "reason": "upgrade"}, headers=AUTH)
    mono = Mono()
    settings = shim_settings(str(client.make_url("/")))
    shim = await aiohttp_client(create_exporter(settings, clock=mono, poll=False))
    record = shim.server.app[STORE].get("vllm")
    stuck = Verdict(state="stuck", reason="no_progress", detail="", since=mono.now, first_seen=mono.now, started=True,
                    up=True, last_progress=mono.now - 300)  # stuck past its 240 s budget
    record.record_poll(stuck, mono.now, 0.01)
    assert (await shim.get("/probe/vllm/live")).status == 503  # not asked yet: as always

    async with aiohttp.ClientSession() as session:
        await ask_once(shim.server.app[STORE], session, str(client.make_url("/")), SecretStr(READ_TOKEN),
                       settings.backstop, Clock(mono, mono))
    live = await shim.get("/probe/vllm/live")
    assert live.status == 200
    assert (await live.json())["backstop"] == {"mode": "hold", "reason": "paused"}
    assert (await shim.get("/probe/vllm/ready")).status == 503  # readiness is not the backstop's
    view = (await (await shim.get("/api/v1/targets/vllm")).json())["backstop"]
    assert (view["mode"], view["reason"], view["word_age_seconds"]) == ("hold", "paused", 0.0)

    # The remediator goes away: held until backstop.after has passed, then the budget counts from there.
    base = str(client.make_url("/"))
    await client.close()
    async with aiohttp.ClientSession() as session:
        mono.now += 300
        await ask_once(shim.server.app[STORE], session, base, SecretStr(READ_TOKEN),
                       settings.backstop, Clock(mono, mono))
    assert (await shim.get("/probe/vllm/live")).status == 200
    mono.now += 300 + 240  # 600 s since the last answer, and the budget after it
    assert (await shim.get("/probe/vllm/live")).status == 200
    mono.now += 1
    live = await shim.get("/probe/vllm/live")
    assert live.status == 503 and (await live.json())["backstop"] == {"mode": "armed", "reason": "remediator_silent"}


async def test_a_wrong_token_is_an_answer_that_cannot_be_read(remediator, tmp_path):  # noqa: F811
    client = await remediator_with_read_token(remediator, tmp_path)
    async with aiohttp.ClientSession() as session:
        base = str(client.make_url("/"))
        assert await ask(session, base, SecretStr("wrong"), ["a"], 5.0) == {"a": "the remediator answered HTTP 401"}
        assert await ask(session, base, None, ["a"], 5.0) == {"a": "the remediator answered HTTP 401"}
        assert await ask(session, "http://127.0.0.1:9", None, ["a"], 5.0) is None  # nothing listens: no answer


async def test_a_shim_watching_many_workloads_asks_in_parts_the_remediator_takes(remediator, tmp_path):  # noqa: F811
    from llm_vitals.exporter.backstop_ask import ASK_LIMIT
    from llm_vitals.exporter.state import StateStore

    client = await remediator_with_read_token(remediator, tmp_path)
    settings = parse_settings({
        "remediator_url": str(client.make_url("/")), "backstop": {},
        "targets": [{"name": f"t{i}", "url": f"http://127.0.0.1:{9000 + i}", "workload": f"w{i}"}
                    for i in range(ASK_LIMIT + 5)],
    }, environ={})
    mono = Mono()
    store = StateStore(settings, mono.now)
    async with aiohttp.ClientSession() as session:
        await ask_once(store, session, str(client.make_url("/")), SecretStr(READ_TOKEN), settings.backstop,
                       Clock(mono, mono))
    # Every workload got its own word, read (not `word_unreadable`): unknown to this remediator, held.
    assert {(r.backstop(mono.now).mode, r.backstop(mono.now).reason) for r in store} == {("hold", "unknown_workload")}


async def test_an_unknown_workload_is_held_for_a_bounded_time_counted_and_never_a_silent_act(remediator, tmp_path,  # noqa: F811
                                                                                              exporter):  # noqa: F811
    exporter.targets["b"] = {**exporter.targets["b"], "workload": "Deployment/llm/discovered"}
    client = await remediator_with_read_token(remediator, tmp_path)

    async def word(workload):
        body = await (await client.get(f"/api/v1/backstop?workload={workload}", headers=READ)).json()
        return body["words"][0]

    asked = client.clock.now
    typo = await word("Deployment/llm/vlm")
    assert (typo["word"], typo["reason"], typo["since"]) == ("hold", "unknown_workload", asked)
    client.clock.advance(UNKNOWN_HOLD - 1)
    assert (await word("Deployment/llm/vlm"))["reason"] == "unknown_workload"  # its first ask still counts
    client.clock.advance(1)
    assert (await word("Deployment/llm/vlm"))["word"] == "act"  # bounded: the kubelet acts alone then
    assert await metric(client, "llm_vitals_remediator_backstop_unknown_workload_total") == 3
    assert await metric(client, "llm_vitals_remediator_backstop_unknown_workload_total") == 3
    # A workload the exporter reports is known: the remediator reads the exporter before it calls one unknown.
    assert (await word("Deployment/llm/discovered"))["word"] == "act"
    assert await metric(client, "llm_vitals_remediator_backstop_unknown_workload_total") == 3
