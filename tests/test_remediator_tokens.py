"""Two tokens, one guard: every route but /healthz and /metrics needs a token; the read token reads
(the journal, the pause, the state) and can never act; the act token does everything.

Before, `GET /api/v1/pause` needed no token (and read the Lease on every request), and the one token
the exporter's status page needed to show decisions could also restart, pause and reset.
"""

from __future__ import annotations

import base64
import re

import aiohttp
import pytest
from pydantic import SecretStr
from test_remediator_helpers import AUTH, TOKEN, alert_payload, make_settings
from test_remediator_webhook import exporter, remediator, restarter  # noqa: F401

from llm_vitals.exporter.status_page import fetch_decisions
from llm_vitals.remediator.app import create_app
from llm_vitals.remediator.settings import ConfigError, build_settings

READ_TOKEN = "read-only-s3cret"
READ = {"Authorization": f"Bearer {READ_TOKEN}"}

# Every route the app serves, with what it needs; a route added without a line here fails below.
ROUTES = [
    ("POST", "/webhook", "act"),
    ("GET", "/api/v1/actions", "read"),
    ("GET", "/api/v1/actions/1", "read"),
    ("POST", "/api/v1/circuit/reset", "act"),
    ("POST", "/api/v1/nodes/n1/release", "act"),
    ("POST", "/api/v1/workloads/release", "act"),
    ("GET", "/api/v1/pause", "read"),
    ("POST", "/api/v1/pause", "act"),
    ("DELETE", "/api/v1/pause", "act"),
    ("GET", "/api/v1/state", "read"),
    ("GET", "/api/v1/backstop", "read"),
    ("POST", "/api/v1/state/reinit", "act"),
    ("GET", "/metrics", None),
    ("GET", "/healthz", None),
]


def test_the_table_names_every_route_the_app_serves(tmp_path):
    settings = make_settings(tmp_path, "http://127.0.0.1:9", {"a": {"executor": "http", "url": "http://127.0.0.1:9/r"}})
    served = {(r.method, r.resource.canonical) for r in create_app(settings).router.routes() if r.method != "HEAD"}
    canonical = {(m, p.replace("/1", "/{id}").replace("/n1/", "/{node}/")) for m, p, _ in ROUTES}
    assert served == canonical


@pytest.mark.parametrize("method, path, needs", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
async def test_each_route_takes_exactly_the_tokens_it_needs(remediator, tmp_path, method, path, needs):  # noqa: F811
    token_file = tmp_path / "read.token"
    token_file.write_text(READ_TOKEN + "\n")
    client = await remediator(auth={"bearer_token_env": "LLM_VITALS_WEBHOOK_TOKEN", "read_token_file": str(token_file)})
    none = await client.request(method, path)
    read = await client.request(method, path, headers=READ)
    act = await client.request(method, path, headers=AUTH)
    if needs is None:
        assert (none.status, read.status, act.status) == (200, 200, 200)
        return
    assert none.status == 401 and none.headers["WWW-Authenticate"].startswith("Bearer")
    if needs == "read":
        assert read.status not in (401, 403) and act.status not in (401, 403)
    else:
        assert read.status == 403 and "read token cannot act" in (await read.json())["error"]
        assert act.status not in (401, 403)


async def test_the_read_token_never_restarts_and_the_status_page_reads_with_it(remediator, restarter, tmp_path):  # noqa: F811
    token_file = tmp_path / "read.token"
    token_file.write_text(READ_TOKEN)
    client = await remediator(auth={"bearer_token_env": "LLM_VITALS_WEBHOOK_TOKEN", "read_token_file": str(token_file)})
    refused = await client.post("/webhook", json=alert_payload("a"), headers=READ)
    assert refused.status == 403
    await client.service.wait_idle()
    assert restarter.calls == 0
    base = str(client.make_url("/"))
    async with aiohttp.ClientSession() as session:
        page = await fetch_decisions(session, base, SecretStr(READ_TOKEN))
        none = await fetch_decisions(session, base)
    assert page.note is None and page.pause is not None
    assert "read token" in (none.note or "")


async def test_an_old_config_with_one_token_keeps_working_for_reads_and_acts(remediator):  # noqa: F811
    client = await remediator()  # auth: bearer_token_env only, as before
    assert (await client.get("/api/v1/pause", headers=AUTH)).status == 200
    assert (await client.get("/api/v1/state", headers=AUTH)).status == 200
    assert (await client.get("/api/v1/pause")).status == 401  # before: 200 without any token
    assert (await client.post("/api/v1/pause", json={"until": client.clock.now + 60, "reason": "r"},
                              headers=AUTH)).status == 200


@pytest.mark.parametrize("auth, environ, message", [
    ({"bearer_token_env": "T", "read_token_env": "T"}, {"T": "same"}, "the read token must differ from the act token"),
    ({"bearer_token_env": "T", "read_token_env": "R", "read_token_file": "/x"}, {"T": "a", "R": "b"},
     "set at most one of read_token_env and read_token_file"),
    ({"none": True, "read_token_env": "R"}, {"R": "b"}, "`none: true` contradicts a read token"),
    ({"bearer_token_env": "T", "read_token_env": "R"}, {"T": "a"}, "environment variable R is not set"),
])
def test_a_read_token_that_cannot_be_right_is_a_config_error(tmp_path, auth, environ, message):
    data = {"listen": "127.0.0.1:0", "exporter_url": "http://127.0.0.1:9", "auth": auth,
            "state_path": str(tmp_path / "j.db"), "targets": {"a": {"executor": "http", "url": "http://127.0.0.1:9/r"}}}
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_settings(data, environ)


async def test_basic_auth_is_the_act_token_and_a_read_token_reads_beside_it(remediator, tmp_path):  # noqa: F811
    token_file = tmp_path / "read.token"
    token_file.write_text(READ_TOKEN)
    password = tmp_path / "password"
    password.write_text("pw")
    client = await remediator(auth={"basic_auth": {"username": "am", "password_file": str(password)},
                                    "read_token_file": str(token_file)})
    basic = {"Authorization": "Basic " + base64.b64encode(b"am:pw").decode()}
    assert (await client.get("/api/v1/actions", headers=READ)).status == 200
    assert (await client.delete("/api/v1/pause", headers=READ)).status == 403
    assert (await client.delete("/api/v1/pause", headers=basic)).status == 200
    assert TOKEN not in (await (await client.get("/api/v1/state", headers=READ)).text())


async def test_a_lost_state_is_answered_by_one_middleware_and_refuses_the_webhook(remediator, restarter):  # noqa: F811
    from llm_vitals.remediator.store import StateLost

    client = await remediator()

    async def lost():
        raise StateLost("Lease llm/llm-vitals-remediator is gone (it held epoch e1)")

    client.service.store.read = lost
    for method, path, body in [("POST", "/api/v1/pause", {"until": client.clock.now + 60, "reason": "r"}),
                               ("DELETE", "/api/v1/pause", None), ("POST", "/api/v1/circuit/reset", {"all": True}),
                               ("POST", "/api/v1/nodes/n1/release", None),
                               ("POST", "/api/v1/workloads/release", {"workload": "a"})]:
        answer = await client.request(method, path, json=body, headers=AUTH)
        assert answer.status == 503 and (await answer.json())["state_lost"] is True, path
    answer = await client.post("/webhook", json=alert_payload("a"), headers=AUTH)
    assert answer.status == 503 and (await answer.json())["decisions"][0]["reason"] == "state_lost"
    await client.service.wait_idle()
    assert restarter.calls == 0


async def test_reinit_says_where_from_and_why_and_one_replica_has_nothing_to_reinitialise(remediator):  # noqa: F811
    client = await remediator()
    for body in ({}, {"from": "empty"}, {"from": "elsewhere", "reason": "x"}, {"from": "empty", "reason": " "}):
        assert (await client.post("/api/v1/state/reinit", json=body, headers=AUTH)).status == 422, body
    alone = await client.post("/api/v1/state/reinit", json={"from": "empty", "reason": "drill"}, headers=AUTH)
    assert alone.status == 409 and "own SQLite file" in (await alone.json())["error"]
