"""A webhook storm: an HA Alertmanager pair and repeat_interval deliver the same alert many times,
and a second target fails at the same moment. Exactly one restart may come out of it."""

from __future__ import annotations

import asyncio
from collections import Counter

from aiohttp import web
from test_remediator_helpers import AUTH, Clock, FakeExporter, alert_payload, make_settings

from llm_vitals.remediator.app import SERVICE, create_app


class SlowRestartCounter:
    """A restart endpoint that counts calls and takes a while, so the storm overlaps the restart."""

    def __init__(self) -> None:
        self.calls = 0

    async def restart(self, request: web.Request) -> web.Response:
        self.calls += 1
        await asyncio.sleep(0.3)
        return web.json_response({"restarting": True})


async def test_storm_of_400_posts_for_two_stuck_targets_runs_exactly_one_restart(
    aiohttp_server, aiohttp_client, tmp_path
):
    exporter = FakeExporter({"a": "stuck", "b": "stuck", "c": "idle", "d": "idle", "e": "idle"})
    exporter_server = await aiohttp_server(exporter.app())
    counter = SlowRestartCounter()
    restart_app = web.Application()
    restart_app.router.add_post("/admin/restart", counter.restart)
    restart_server = await aiohttp_server(restart_app)
    url = str(restart_server.make_url("/admin/restart"))
    settings = make_settings(
        tmp_path,
        str(exporter_server.make_url("")).rstrip("/"),
        {name: {"executor": "http", "url": url} for name in "abcde"},
        max_unhealthy="40%",  # 2 of 5: the fleet gate holds
    )
    client = await aiohttp_client(create_app(settings, clock=Clock()))

    async def post(payload):
        response = await client.post("/webhook", json=payload, headers=AUTH)
        return response.status, (await response.json())["decisions"][0]

    same_a = [alert_payload("a", fingerprint="fa") for _ in range(200)]
    same_b = [alert_payload("b", fingerprint="fb") for _ in range(200)]
    storm = [p for pair in zip(same_a, same_b, strict=True) for p in pair]
    answers = await asyncio.gather(*(post(p) for p in storm))

    assert {status for status, _ in answers} == {200}
    reasons = Counter((d["target"], d["reason"]) for _, d in answers)
    assert sum(n for (_, reason), n in reasons.items() if reason == "allowed") == 1, reasons
    winner = next(target for (target, reason) in reasons if reason == "allowed")
    loser = "b" if winner == "a" else "a"
    assert reasons[(winner, "duplicate")] == 199
    assert set(r for (t, r) in reasons if t == loser) <= {"restart_in_progress", "cooldown"}

    await client.server.app[SERVICE].wait_idle()
    assert counter.calls == 1
    # The exporter was read far fewer times than there were posts (shared in-flight reads).
    assert exporter.requests < 100
    # After the restart finished the cooldown still holds, for both targets.
    for payload in (alert_payload(loser, fingerprint="f" + loser), alert_payload(winner, fingerprint="new")):
        status, decision = await post(payload)
        assert (status, decision["reason"]) == (200, "cooldown")
    assert counter.calls == 1
    rows = (await (await client.get("/api/v1/actions?limit=1000", headers=AUTH)).json())["actions"]
    assert len(rows) == 402
    assert [r["result"] for r in rows if r["decision"] == "restart"] == ["ok"]
