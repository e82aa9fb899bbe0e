"""The dynamic target set on a live exporter: file_sd targets appear and go, a removed target leaves no
series, a broken file keeps the last targets, and reload (POST /-/reload, SIGHUP) refuses a broken config."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_exporter_helpers import FakeVllm, make_settings, make_target, record, start_exporter, wait_for

from llm_vitals.demo.ports import free_port
from llm_vitals.exporter.keys import STORE


async def upstreams(aiohttp_server, n: int) -> list[str]:
    """n fake vLLMs on loopback: their `host:port`."""
    found = []
    for _ in range(n):
        server = await aiohttp_server(FakeVllm().app())
        found.append(f"127.0.0.1:{server.port}")
    return found


def write_sd(path: Path, groups: list[dict]) -> None:
    # Written aside and renamed, as a file_sd writer should: a reader never sees half a file.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, path)


def file_source(path: Path, **more) -> dict:
    return {"file": {"paths": [str(path)], "refresh_interval": 0.05, "template": {"stuck_after": 1.5, "startup_grace": 0}, **more}}


async def series_of(client, name: str) -> list[str]:
    text = await (await client.get("/metrics")).text()
    return [line for line in text.splitlines() if f'target="{name}"' in line]


async def test_file_sd_targets_appear_starting_and_a_removed_one_leaves_nothing_behind(aiohttp_client, aiohttp_server, tmp_path) -> None:
    a, b = await upstreams(aiohttp_server, 2)
    sd = tmp_path / "targets.json"
    write_sd(sd, [{"targets": [a, b], "labels": {"__llm_vitals_engine": "vllm"}}])
    client = await start_exporter(aiohttp_client, make_settings([], discovery=[file_source(sd)]))

    await wait_for(lambda: record(client, a) and record(client, b), what="both file_sd targets")
    await wait_for(lambda: record(client, a).verdict.state == "idle", what="a's first good read")
    assert await series_of(client, a)

    kept = record(client, b)
    write_sd(sd, [{"targets": [b]}])
    await wait_for(lambda: record(client, a) is None, timeout=2, what="a dropped")
    assert await series_of(client, a) == []
    listed = (await (await client.get("/api/v1/targets")).json())["targets"]
    assert [t["name"] for t in listed] == [b]
    assert (await client.get(f"/api/v1/targets/{a}")).status == 404
    assert a not in await (await client.get("/")).text()
    assert record(client, b) is kept  # b was untouched: its record (state, polls) kept


async def test_a_broken_file_keeps_its_last_targets_and_says_why(aiohttp_client, aiohttp_server, tmp_path) -> None:
    (a,) = await upstreams(aiohttp_server, 1)
    sd = tmp_path / "targets.json"
    write_sd(sd, [{"targets": [a]}])
    client = await start_exporter(aiohttp_client, make_settings([], discovery=[file_source(sd)]))
    await wait_for(lambda: record(client, a), what="the target")

    sd.write_text('[{"targets": ["half')
    async def status() -> dict:
        return (await (await client.get("/api/v1/discovery")).json())["sources"][0]
    deadline = time.monotonic() + 3
    while (await status())["up"] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    answer = await status()
    assert answer["up"] is False and "not valid JSON or YAML" in answer["error"] and str(sd) in answer["error"]
    assert record(client, a) is not None  # kept
    families = {f.name: f for f in text_string_to_metric_families(await (await client.get("/metrics")).text())}
    assert families["llm_vitals_discovery_up"].samples[0].value == 0
    assert families["llm_vitals_discovered_targets"].samples[0].value == 1


async def test_a_new_target_is_starting_until_its_first_good_read(aiohttp_client, tmp_path) -> None:
    port = free_port()  # nothing listens yet
    sd = tmp_path / "targets.json"
    write_sd(sd, [{"targets": [f"127.0.0.1:{port}"], "labels": {"__llm_vitals_name": "later"}}])
    settings = make_settings([], discovery=[{"file": {"paths": [str(sd)], "refresh_interval": 0.05}}])
    client = await start_exporter(aiohttp_client, settings)
    rec = await wait_for(lambda: record(client, "later"), what="the target")
    await wait_for(lambda: rec.polls >= 2, what="two failed polls")
    assert rec.verdict.state == "starting"  # within startup_grace: never up, so not down


async def test_the_shard_keeps_only_its_targets(aiohttp_client, tmp_path) -> None:
    sd = tmp_path / "targets.json"
    names = [f"t{i}" for i in range(12)]
    write_sd(sd, [{"targets": [f"127.0.0.1:{9000 + i}"], "labels": {"__llm_vitals_name": n}} for i, n in enumerate(names)])
    seen = []
    for index in range(2):
        settings = make_settings([], discovery=[file_source(sd)], shard={"index": index, "count": 2})
        client = await start_exporter(aiohttp_client, settings)
        await wait_for(lambda c=client: c.app[STORE].records, what="targets")
        seen.append(set(client.app[STORE].records))
    assert seen[0].isdisjoint(seen[1]) and seen[0] | seen[1] == set(names)


def write_config(path: Path, config: dict) -> None:
    path.write_text(yaml.safe_dump(config))


async def test_reload_applies_a_good_file_and_refuses_a_broken_one(aiohttp_client, aiohttp_server, tmp_path) -> None:
    a, b = await upstreams(aiohttp_server, 2)
    config = tmp_path / "exporter.yaml"
    base = {"listen": "127.0.0.1:0", "poll_interval": 0.2, "targets": [make_target("a", f"http://{a}")]}
    write_config(config, base)
    from llm_vitals.exporter.settings import load_settings

    client = await start_exporter(aiohttp_client, load_settings(config, environ={}), config_path=config)
    await wait_for(lambda: record(client, "a").polls, what="a polled")
    first = record(client, "a")

    config.write_text("targets: [unclosed")
    answer = await client.post("/-/reload")
    assert answer.status == 500
    assert "not valid YAML" in (await answer.json())["error"]
    text = await (await client.get("/metrics")).text()
    assert "llm_vitals_config_last_reload_successful 0.0" in text
    assert record(client, "a") is first  # the old config runs on

    write_config(config, {**base, "targets": [make_target("a", f"http://{a}"), make_target("b", f"http://{b}")]})
    before = time.time()
    answer = await client.post("/-/reload")
    assert answer.status == 200, await answer.text()
    assert (await answer.json())["targets"] == 2
    assert record(client, "a") is first  # unchanged: its state kept
    await wait_for(lambda: record(client, "b").polls, what="b polled")
    families = {f.name: f for f in text_string_to_metric_families(await (await client.get("/metrics")).text())}
    assert families["llm_vitals_config_last_reload_successful"].samples[0].value == 1
    assert families["llm_vitals_config_last_reload_success_timestamp_seconds"].samples[0].value >= before


async def test_reload_needs_the_drain_token_when_one_is_configured(aiohttp_client, tmp_path) -> None:
    config = tmp_path / "exporter.yaml"
    write_config(config, {"listen": "127.0.0.1:0", "drain_token_env": "TOK",
                          "targets": [make_target("a", "http://127.0.0.1:9")]})
    settings = make_settings([make_target("a", "http://127.0.0.1:9")], environ={"TOK": "s3cret"}, drain_token_env="TOK")
    client = await start_exporter(aiohttp_client, settings, config_path=config, poll=False)
    assert (await client.post("/-/reload")).status == 401
    assert (await client.post("/-/reload", headers={"Authorization": "Bearer nope"})).status == 401


async def test_routes_take_a_namespace_slash_pod_name(aiohttp_client, aiohttp_server, tmp_path) -> None:
    (a,) = await upstreams(aiohttp_server, 1)
    sd = tmp_path / "targets.json"
    write_sd(sd, [{"targets": [a], "labels": {"__llm_vitals_name": "llm/vllm-0"}}])
    client = await start_exporter(aiohttp_client, make_settings([], discovery=[file_source(sd)]))
    await wait_for(lambda: record(client, "llm/vllm-0") and record(client, "llm/vllm-0").polls, what="polled")
    assert (await (await client.get("/api/v1/targets/llm/vllm-0")).json())["name"] == "llm/vllm-0"
    assert (await client.get("/api/v1/targets/llm/vllm-0/history")).status == 200
    assert (await client.get("/probe/llm/vllm-0/live")).status in (200, 503)
    assert (await (await client.post("/probe/llm/vllm-0/drain")).json())["draining"] is True
    assert (await client.get("/probe/llm/vllm-0/nosuch")).status == 404


def test_sighup_reloads_a_running_exporter(tmp_path) -> None:
    port = free_port()
    config = tmp_path / "exporter.yaml"
    write_config(config, {"listen": f"127.0.0.1:{port}", "targets": [{"name": "a", "url": "http://127.0.0.1:9"}]})
    log = open(tmp_path / "exporter.log", "wb")  # noqa: SIM115 -- the child's whole life
    proc = subprocess.Popen([sys.executable, "-m", "llm_vitals.exporter.cli", "--config", str(config)], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"

        def names() -> list[str]:
            return [t["name"] for t in httpx.get(f"{url}/api/v1/targets", timeout=2).json()["targets"]]

        deadline = time.monotonic() + 30
        while True:
            try:
                assert names() == ["a"]
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "exporter.log").read_text()
                time.sleep(0.1)
        write_config(config, {"listen": f"127.0.0.1:{port}", "targets": [{"name": "b", "url": "http://127.0.0.1:9"}]})
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while names() != ["b"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        config.write_text("targets: [unclosed")
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "llm_vitals_config_last_reload_successful 0.0" not in httpx.get(f"{url}/metrics", timeout=2).text:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert names() == ["b"] and proc.poll() is None
        assert "config reload refused" in (tmp_path / "exporter.log").read_text()
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


async def test_a_late_report_from_a_stopped_source_brings_nothing_back(aiohttp_client, tmp_path) -> None:
    from llm_vitals.exporter.discovery.manager import SourceStatus
    from llm_vitals.exporter.discovery.targetset import build_target
    from llm_vitals.exporter.keys import DISCOVERY

    sd = tmp_path / "targets.json"
    write_sd(sd, [{"targets": ["127.0.0.1:9"], "labels": {"__llm_vitals_name": "x"}}])
    client = await start_exporter(aiohttp_client, make_settings([make_target("s", "http://127.0.0.1:9")],
                                                                discovery=[file_source(sd)]))
    await wait_for(lambda: record(client, "x"), what="x")
    discovery = client.app[DISCOVERY]
    await discovery.stop()
    discovery.sync()
    assert record(client, "x") is None
    late = build_target({}, {}, name="x", url="http://127.0.0.1:9", source="file[0]")
    discovery.report([late], SourceStatus("file[0]", "file", up=True))
    assert record(client, "x") is None and "file[0]" not in discovery.status
