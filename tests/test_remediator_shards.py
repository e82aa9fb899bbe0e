"""The remediator over sharded exporters (`exporter_urls`): the pure merge of their views as a table,
the reader over loopback exporters, and two real exporter apps sharded 0/2 and 1/2 behind the real
remediator app."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

import aiohttp
import pytest
from test_exporter_helpers import BUSY_PAGE, FakeVllm, make_target, record, start_exporter, wait_for
from test_exporter_helpers import make_settings as exporter_settings
from test_remediator_helpers import AUTH, Clock, FakeExporter, alert_payload, make_settings
from test_remediator_webhook import restarter  # noqa: F401 -- a fixture

from llm_vitals.exporter.discovery.targetset import shard_of
from llm_vitals.remediator.app import SERVICE, create_app
from llm_vitals.remediator.exporter_client import ExporterClient, FleetReader
from llm_vitals.remediator.gate import FleetView, TargetStatus
from llm_vitals.remediator.shards import merge_views

A, B, C = "http://exporter-0:9471", "http://exporter-1:9471", "http://exporter-2:9471"
IDLE = TargetStatus("idle", 1.0)
STUCK = TargetStatus("stuck", 1.0)
DOWN = TargetStatus("down", None)
WAS_SICK = TargetStatus("busy", 1.0, recently_unhealthy=True)


def view(**targets: TargetStatus) -> FleetView:
    return FleetView(dict(targets))


# (case, [(exporter, its view)], targets kept, {withheld name: the copy counted}, duplicates)
MERGES = [
    ("one exporter: its view", [(A, view(a=IDLE, b=STUCK))], {"a": IDLE, "b": STUCK}, {}, {}),
    ("disjoint shards: the union", [(A, view(a=IDLE)), (B, view(b=STUCK)), (C, view(c=DOWN))],
     {"a": IDLE, "b": STUCK, "c": DOWN}, {}, {}),
    ("an empty shard adds nothing", [(A, view(a=IDLE)), (B, view())], {"a": IDLE}, {}, {}),
    ("no targets anywhere", [(A, view()), (B, view())], {}, {}, {}),
    ("a target in two shards is withheld", [(A, view(a=IDLE, b=IDLE)), (B, view(b=IDLE, c=IDLE))],
     {"a": IDLE, "c": IDLE}, {"b": IDLE}, {"b": (A, B)}),
    ("withheld at its least healthy copy", [(A, view(b=IDLE)), (B, view(b=STUCK))], {}, {"b": STUCK}, {"b": (A, B)}),
    ("recently unhealthy counts as unhealthy", [(A, view(b=IDLE)), (B, view(b=WAS_SICK))], {},
     {"b": WAS_SICK}, {"b": (A, B)}),
    ("the first unhealthy copy, in exporter order", [(A, view(b=DOWN)), (B, view(b=STUCK))], {}, {"b": DOWN},
     {"b": (A, B)}),
    ("in three shards: every URL named", [(A, view(b=IDLE)), (B, view(b=IDLE)), (C, view(b=IDLE, c=IDLE))],
     {"c": IDLE}, {"b": IDLE}, {"b": (A, B, C)}),
    ("two unsharded exporters: everything withheld", [(A, view(a=IDLE, b=STUCK)), (B, view(a=IDLE, b=STUCK))],
     {}, {"a": IDLE, "b": STUCK}, {"a": (A, B), "b": (A, B)}),
]


@pytest.mark.parametrize("views, targets, withheld, duplicates", [m[1:] for m in MERGES], ids=[m[0] for m in MERGES])
def test_merge_views(views, targets, withheld, duplicates):
    merged, found = merge_views(views)
    assert dict(merged.targets) == targets
    assert dict(merged.withheld) == withheld
    # `is`, not ==: the copy counted is one of the exporters' own objects (its evidence too).
    assert all(merged.withheld[name] is status for name, status in withheld.items())
    assert found == duplicates
    assert set(merged.targets).isdisjoint(merged.withheld)


# -- the reader, over loopback exporters ----------------------------------------------------------


@pytest.fixture
async def two_exporters(aiohttp_server):
    """Two loopback exporters serving the documented JSON; their URLs carry userinfo (never logged)."""
    fakes = [FakeExporter({"a": "stuck", "b": "idle"}), FakeExporter({"c": "idle"})]
    for fake in fakes:
        server = await aiohttp_server(fake.app())
        fake.url = f"http://user:pw@127.0.0.1:{server.port}"
        fake.shown = f"http://127.0.0.1:{server.port}"
    return fakes


async def test_the_reader_joins_every_exporter_and_knows_where_each_target_came_from(two_exporters):
    one, two = two_exporters
    async with aiohttp.ClientSession() as http:
        reader = FleetReader.of([one.url, two.url], http, timeout=2, max_age=60)
        fleet = await reader.fleet()
        assert fleet is not None and sorted(fleet.targets) == ["a", "b", "c"] and not fleet.withheld
        assert {n: s.source for n, s in fleet.targets.items()} == {"a": one.shown, "b": one.shown, "c": two.shown}
        assert fleet.targets["c"].raw == two.targets["c"]
        # Within max_age: no read, and the same merged view (a storm merges once).
        assert await reader.fleet() is fleet and (one.requests, two.requests) == (1, 1)


async def test_one_exporter_that_cannot_be_read_makes_the_whole_view_none(two_exporters):
    one, two = two_exporters
    two.fail_with = 500
    async with aiohttp.ClientSession() as http:
        reader = FleetReader.of([one.url, two.url], http, timeout=2, max_age=0)
        assert await reader.fleet() is None
        two.fail_with = None
        assert (await reader.fleet()) is not None  # a failure is not cached: the next alert asks again


async def test_a_target_two_exporters_report_is_withheld_and_logged_once_with_both_urls(two_exporters, caplog):
    one, two = two_exporters
    two.targets["a"] = dict(one.targets["a"])
    caplog.set_level(logging.WARNING, logger="llm_vitals.remediator.exporter")
    async with aiohttp.ClientSession() as http:
        reader = FleetReader.of([one.url, two.url], http, timeout=2, max_age=0)
        for _ in range(3):
            fleet = await reader.fleet()
            assert fleet is not None and sorted(fleet.targets) == ["b", "c"] and list(fleet.withheld) == ["a"]
    logged = [r for r in caplog.records if "more than one exporter" in r.getMessage()]
    assert len(logged) == 1
    assert logged[0].fields == {"target": "a", "exporters": [one.shown, two.shown]}
    assert "pw" not in caplog.text


# -- two real exporters, sharded 0/2 and 1/2, behind the real remediator ----------------------


NAMES = [f"gpu-{i}" for i in range(6)]
# The stuck target lives in shard 1: with one exporter_url (shard 0) its alert would be refused forever.
STUCK_NAME = next(name for name in NAMES if shard_of(name, 2) == 1)


@pytest.fixture
async def sharded(aiohttp_server, aiohttp_client):
    """Two real exporter apps over one static target list, sharded 0/2 and 1/2: their test clients."""
    idle, busy = FakeVllm(), FakeVllm(page=BUSY_PAGE)  # BUSY_PAGE: work waiting, nothing moving
    urls = {"idle": str((await aiohttp_server(idle.app())).make_url("")),
            "busy": str((await aiohttp_server(busy.app())).make_url(""))}
    targets = [make_target(name, urls["busy" if name == STUCK_NAME else "idle"], stuck_after=0.3) for name in NAMES]
    exporters = [await start_exporter(aiohttp_client, exporter_settings(targets, shard={"index": i, "count": 2}))
                 for i in range(2)]
    for client in exporters:
        client.url = str(client.make_url("")).rstrip("/")
    return exporters


async def test_every_target_of_two_real_shards_is_found_exactly_once_and_one_stopped_shard_means_none(sharded):
    async with aiohttp.ClientSession() as http:
        clients = [ExporterClient(c.url, http, timeout=2, max_age=0) for c in sharded]
        reader = FleetReader(clients)
        fleet = await reader.fleet()
        assert {shard_of(name, 2) for name in NAMES} == {0, 1}  # both shards hold some
        assert fleet is not None and not fleet.withheld
        assert sorted(fleet.targets) == NAMES
        for shard, client in enumerate(clients):
            own = await client.fleet()
            assert own is not None and sorted(own.targets) == [n for n in NAMES if shard_of(n, 2) == shard]
            assert all(fleet.targets[n].source == client.source for n in own.targets)

        await sharded[1].close()  # shard 1 stops
        assert await reader.fleet() is None


async def test_the_remediator_restarts_a_target_of_the_other_shard_and_nothing_once_a_shard_is_gone(
        sharded, restarter, aiohttp_client, tmp_path):  # noqa: F811 -- the imported fixture
    await wait_for(lambda: (r := record(sharded[1], STUCK_NAME)) and r.verdict.state == "stuck", what="stuck")
    settings = make_settings(
        tmp_path, None, {n: {"executor": "http", "url": restarter.url, "timeout": "5s"} for n in NAMES},
        exporter_urls=[c.url for c in sharded], exporter_max_age=0)
    now = time.time()
    client = await aiohttp_client(create_app(settings, clock=Clock(now)))
    service = client.server.app[SERVICE]

    def alert(fingerprint: str) -> dict:
        starts_at = datetime.fromtimestamp(now - 60, UTC).isoformat().replace("+00:00", "Z")
        return alert_payload(STUCK_NAME, fingerprint=fingerprint, starts_at=starts_at)

    answer = await client.post("/webhook", json=alert("f1"), headers=AUTH)
    assert answer.status == 200 and (await answer.json())["decisions"][0]["reason"] == "allowed"
    await service.wait_idle()
    assert restarter.calls == 1
    [row] = (await (await client.get("/api/v1/actions", headers=AUTH)).json())["actions"]
    found = await (await client.get(f"/api/v1/actions/{row['id']}", headers=AUTH)).json()
    # The evidence is the owning shard's own TARGET object, and says which shard that was.
    assert found["evidence_from"] == sharded[1].url
    assert found["evidence"]["name"] == STUCK_NAME and found["evidence"]["state"] == "stuck"
    assert set(found["evidence"]) == set((await (await sharded[1].get("/api/v1/targets")).json())["targets"][0])

    # Shard 0 stops: the fleet gate cannot be judged on half the fleet. No restart; 503, so Alertmanager retries.
    await sharded[0].close()
    answer = await client.post("/webhook", json=alert("f2"), headers=AUTH)
    assert answer.status == 503
    assert [d["reason"] for d in (await answer.json())["decisions"]] == ["exporter_unreachable"]
    await service.wait_idle()
    assert restarter.calls == 1
