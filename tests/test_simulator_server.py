"""The simulator as real HTTP servers on 127.0.0.1: routes, faults, restart, proxy, control server."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from waits import wait_until

from llm_vitals.sim.config import SimConfig
from llm_vitals.sim.fleet import Fleet

# Slow enough that 1000-token requests stay in flight for the whole test, fast enough to see steps.
LOADED = SimConfig(max_num_seqs=2, tokens_per_second=100, startup_seconds=0.3, die_close_delay=0.05)
LONG = {"model": "tiny", "prompt": "def main():", "max_tokens": 1000, "ignore_eos": True}
CANARY = {"model": "tiny", "prompt": "ping", "max_tokens": 1, "temperature": 0}


def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 10.0, what: str = "condition") -> Awaitable[Any]:
    """Poll `check` until it returns something truthy (no fixed sleeps); a connection refused while
    the server loads, or reset while it dies, is not yet."""
    return wait_until(check, timeout, what, interval=0.02, retry_on=(httpx.TransportError,))


def sample_values(page: str) -> dict[str, float]:
    """Sample name -> value, for the unlabelled-beyond-engine/model series (and process_*)."""
    out = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if set(sample.labels) <= {"engine", "model_name"}:
                out[sample.name] = sample.value
            elif sample.name == "vllm:request_success_total":
                out[f"request_success:{sample.labels['finished_reason']}"] = sample.value
    return out


async def scrape(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    response = await client.get(f"{url}/metrics")
    assert response.status_code == 200
    return sample_values(response.text)


def fire(client: httpx.AsyncClient, url: str, count: int, body: dict[str, Any] = LONG) -> list[asyncio.Task]:
    return [asyncio.create_task(client.post(f"{url}/v1/completions", json=body)) for _ in range(count)]


async def cancel(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def refused(client: httpx.AsyncClient, url: str) -> bool:
    try:
        await client.get(f"{url}/v1/models")
    except httpx.ConnectError:
        return True
    return False


@pytest.fixture
async def client():
    async with httpx.AsyncClient(timeout=10) as http:
        yield http


# -- routes -----------------------------------------------------------------------------------------
async def test_vllm_routes_answer_like_vllm(client):
    async with Fleet(SimConfig(), backends=1, control=False) as fleet:
        url = fleet.backend_urls[0]
        health = await client.get(f"{url}/health")
        assert health.status_code == 200 and health.content == b""
        assert (await client.get(f"{url}/version")).json() == {"version": "0.32.0"}
        models = (await client.get(f"{url}/v1/models")).json()
        assert models["object"] == "list" and models["data"][0]["id"] == "tiny"
        assert models["data"][0]["max_model_len"] == 2048
        assert (await client.get(f"{url}/admin/state")).json()["phase"] == "serving"


async def test_canary_on_an_idle_backend_is_fast_and_exact(client):
    async with Fleet(SimConfig(), backends=1, control=False) as fleet:
        started = time.monotonic()
        response = await client.post(f"{fleet.backend_urls[0]}/v1/completions", json=CANARY)
        assert time.monotonic() - started < 1.0
        body = response.json()
        assert response.status_code == 200
        assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] == 1
        assert body["choices"][0]["finish_reason"] == "length"


async def test_completion_honours_max_tokens_with_ignore_eos(client):
    async with Fleet(SimConfig(tokens_per_second=2000), backends=1, control=False) as fleet:
        body = {"model": "tiny", "prompt": [1, 2, 3, 4, 5], "max_tokens": 37, "ignore_eos": True}
        answer = (await client.post(f"{fleet.backend_urls[0]}/v1/completions", json=body)).json()
        assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 37, "total_tokens": 42,
                                   "prompt_tokens_details": None}
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        answer = (await client.post(f"{fleet.backend_urls[0]}/v1/chat/completions", json=chat)).json()
        assert answer["object"] == "chat.completion"
        assert answer["choices"][0]["message"]["role"] == "assistant"
        assert answer["usage"]["completion_tokens"] == 4


async def test_streaming_chat_sends_sse_chunks_then_done(client):
    async with Fleet(SimConfig(tokens_per_second=2000), backends=1, control=False) as fleet:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True,
                "stream_options": {"include_usage": True}}
        response = await client.post(f"{fleet.backend_urls[0]}/v1/chat/completions", json=body)
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = [line[len("data: "):] for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) == 5
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize(("path", "body", "status", "fragment"), [
    ("/v1/completions", b"{not json", 400, "JSON decode error"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "at least 1"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": "ten"}, 400, "must be an integer"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 5000}, 400, "maximum context length"),
    ("/v1/completions", {"model": "gpt-9", "prompt": "x"}, 404, "does not exist"),
    ("/v1/completions", {"model": "tiny"}, 400, "'prompt' is required"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "true or false"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", [1, 2], 400, "JSON object"),
])
async def test_bad_completion_input_gets_a_vllm_style_4xx(client, path, body, status, fragment):
    async with Fleet(SimConfig(), backends=1, control=False) as fleet:
        kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
        response = await client.post(f"{fleet.backend_urls[0]}{path}", **kwargs)
    assert response.status_code == status
    error = response.json()["error"]
    assert fragment in error["message"] and error["code"] == status


@pytest.mark.parametrize(("body", "fragment"), [
    ({"fault": "explode"}, "unknown fault 'explode': use one of hang, freeze, die, restart, slow, none, peer"),
    (b"{nope", "not valid JSON"),
    (b"", "empty body"),
    (["hang"], "JSON object"),
    ({"fault": "slow", "factor": 0.5}, "factor"),
    ({"fault": "hang", "colour": "red"}, "unknown field 'colour'"),
    ({}, "fault"),
])
async def test_bad_admin_input_gets_a_4xx_with_a_clear_message(client, body, fragment):
    async with Fleet(SimConfig(), backends=1) as fleet:
        for url in (f"{fleet.backend_urls[0]}/admin/fault", f"{fleet.control_url}/backends/0/fault"):
            kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
            response = await client.post(url, **kwargs)
            assert response.status_code == 400, url
            assert fragment in response.json()["error"], url
        assert fleet.backends[0].fault == "none"
        unknown = await client.post(f"{fleet.control_url}/backends/7/fault", json={"fault": "hang"})
        assert unknown.status_code == 404 and "unknown backend '7'" in unknown.json()["error"]
        bad_restart = await client.post(f"{fleet.backend_urls[0]}/admin/restart", json={"startup_seconds": -1})
        assert bad_restart.status_code == 400


# -- engine behaviour over HTTP --------------------------------------------------------------------
async def test_saturation_shows_running_at_max_num_seqs_the_rest_waiting_and_steps_advancing(client):
    async with Fleet(LOADED, backends=1, control=False) as fleet:
        url = fleet.backend_urls[0]
        tasks = fire(client, url, 6)
        try:
            first = await eventually(
                lambda: _when(scrape(client, url), lambda v: v["vllm:num_requests_running"] == 2
                              and v["vllm:num_requests_waiting"] == 4), what="running 2 / waiting 4")
            later = await eventually(
                lambda: _when(scrape(client, url), lambda v: v["vllm:iteration_tokens_total_count"]
                              > first["vllm:iteration_tokens_total_count"]), what="steps advancing")
            assert later["vllm:generation_tokens_total"] > first["vllm:generation_tokens_total"]
            assert (later["vllm:num_requests_running"], later["vllm:num_requests_waiting"]) == (2, 4)
        finally:
            await cancel(tasks)
        # The clients went away: their requests are aborted, as vLLM does.
        await eventually(lambda: _when(scrape(client, url), lambda v: v["request_success:abort"] == 6),
                         what="aborts counted")


async def test_long_prefill_grows_kv_usage_without_counting_steps(client):
    config = SimConfig(max_num_batched_tokens=64, prefill_tokens_per_second=640, max_model_len=4096,
                       kv_cache_tokens=8192)
    async with Fleet(config, backends=1, control=False) as fleet:
        url = fleet.backend_urls[0]
        tasks = fire(client, url, 1, {"prompt": list(range(3000)), "max_tokens": 1})  # ~4.7 s of prefill
        try:
            seen = await eventually(lambda: _when(scrape(client, url), lambda v: v["vllm:kv_cache_usage_perc"] > 0),
                                    what="kv usage growing")
            grown = await eventually(lambda: _when(scrape(client, url), lambda v: v["vllm:kv_cache_usage_perc"]
                                                   > seen["vllm:kv_cache_usage_perc"]), what="kv usage growing more")
            for values in (seen, grown):
                assert values["vllm:iteration_tokens_total_count"] == 0
                assert values["vllm:prompt_tokens_total"] == 0
                assert values["vllm:num_requests_running"] == 1
            assert fleet.backends[0].engine.steps >= 2  # the engine is stepping all along
        finally:
            await cancel(tasks)


# -- faults ------------------------------------------------------------------------------------------
async def test_hang_keeps_the_api_answering_with_frozen_counters(client):
    async with Fleet(LOADED, backends=1, control=False) as fleet:
        url = fleet.backend_urls[0]
        tasks = fire(client, url, 3)
        try:
            await eventually(lambda: _when(scrape(client, url), lambda v: v["vllm:generation_tokens_total"] > 0))
            state = (await client.post(f"{url}/admin/fault", json={"fault": "hang"})).json()
            assert state["fault"] == "hang"
            frozen = await scrape(client, url)
            # A request sent now gets no answer: this is also the time the counters must stay frozen.
            with pytest.raises(httpx.ReadTimeout):
                await client.post(f"{url}/v1/completions", json=CANARY, timeout=0.5)
            assert (await client.get(f"{url}/health")).status_code == 200
            assert (await client.get(f"{url}/v1/models")).status_code == 200
            still = await scrape(client, url)
            for name in ("vllm:generation_tokens_total", "vllm:iteration_tokens_total_count",
                         "vllm:prompt_tokens_total", "vllm:num_requests_running", "vllm:num_requests_waiting"):
                assert still[name] == frozen[name], name
            assert still["vllm:num_requests_running"] == 2 and still["vllm:num_requests_waiting"] == 1
            # Clearing the fault resumes the engine where it stopped.
            await client.post(f"{url}/admin/fault", json={"fault": "none"})
            await eventually(lambda: _when(scrape(client, url), lambda v: v["vllm:generation_tokens_total"]
                                           > frozen["vllm:generation_tokens_total"]), what="progress after hang")
        finally:
            await cancel(tasks)


async def test_die_fails_in_flight_requests_with_500_then_stops_listening(client):
    async with Fleet(LOADED, backends=2) as fleet:
        url = fleet.backend_urls[0]
        tasks = fire(client, url, 3)
        await eventually(lambda: _when(scrape(client, url), lambda v: v["vllm:num_requests_running"] == 2))
        await client.post(f"{url}/admin/fault", json={"fault": "die"})
        answers = await asyncio.gather(*tasks)
        for answer in answers:
            assert answer.status_code == 500
            assert answer.json() == {"error": {"message": "EngineCore encountered an issue. See stack trace (above) "
                                                          "for the root cause.", "type": "InternalServerError",
                                               "param": None, "code": 500}}
        await eventually(lambda: refused(client, url), what="port closed")
        state = (await client.get(f"{fleet.control_url}/backends/0/state")).json()
        assert state["phase"] == "dead" and state["listening"] is False
        # The other backend is untouched; the dead one accepts only a restart.
        assert (await client.get(f"{fleet.backend_urls[1]}/health")).status_code == 200
        conflict = await client.post(f"{fleet.control_url}/backends/0/fault", json={"fault": "hang"})
        assert conflict.status_code == 409 and "dead" in conflict.json()["error"]
        # The control server brings it back.
        await client.post(f"{fleet.control_url}/backends/0/restart", json={"startup_seconds": 0.1})
        await eventually(lambda: _when(client.get(f"{url}/v1/models"), lambda r: r.status_code == 200),
                         what="back after restart")


async def test_health_answers_503_while_the_dead_engine_is_noticed(client):
    config = SimConfig(max_num_seqs=2, die_close_delay=5.0)
    async with Fleet(config, backends=1) as fleet:
        url = fleet.backend_urls[0]
        await client.post(f"{url}/admin/fault", json={"fault": "die"})
        assert (await client.get(f"{url}/health")).status_code == 503
        late = await client.post(f"{url}/v1/completions", json=CANARY)
        assert late.status_code == 500
        assert (await client.get(f"{url}/admin/state")).json()["phase"] == "dying"


async def test_die_mid_stream_sends_the_error_in_the_stream(client):
    async with Fleet(LOADED, backends=1) as fleet:
        url = fleet.backend_urls[0]
        async with client.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True}) as response:
            assert response.status_code == 200
            lines = response.aiter_lines()
            assert (await anext(lines)).startswith("data: {")
            await client.post(f"{url}/admin/fault", json={"fault": "die"})
            rest = [line async for line in lines if line.startswith("data: ")]
        assert any('"InternalServerError"' in line for line in rest)
        assert rest[-1] == "data: [DONE]"


async def test_restart_refuses_connections_while_loading_then_resets_counters_and_start_time(client):
    async with Fleet(LOADED, backends=1) as fleet:
        url = fleet.backend_urls[0]
        await client.post(f"{url}/v1/completions", json={**CANARY, "max_tokens": 5})
        before = await scrape(client, url)
        assert before["vllm:generation_tokens_total"] == 5
        # A loading period long enough to be seen even on a loaded machine: with 1 s the test
        # failed once in a busy parallel run (seeing the refusal and the phase must both fit in it).
        answer = await client.post(f"{url}/admin/restart", json={"startup_seconds": 3.0})
        assert answer.status_code == 200 and answer.json() == {"restarting": True}
        await eventually(lambda: refused(client, url), what="connections refused while loading")
        assert (await client.get(f"{fleet.control_url}/backends/0/state")).json()["phase"] == "loading"
        after = await eventually(lambda: _when(scrape(client, url), lambda v: True), what="serving again")
        assert after["process_start_time_seconds"] > before["process_start_time_seconds"]
        for name in ("vllm:generation_tokens_total", "vllm:iteration_tokens_total_count", "vllm:prompt_tokens_total",
                     "request_success:length"):
            assert after[name] == 0, name
        state = fleet.backends[0].state()
        assert state["restarts"] == 1 and state["fault"] == "none" and state["port"] == int(url.rsplit(":", 1)[1])


async def test_restart_fault_through_admin_fault_behaves_like_the_shortcut(client):
    async with Fleet(LOADED, backends=1) as fleet:
        url = fleet.backend_urls[0]
        start = fleet.backends[0].state()["process_start_time"]
        answer = await client.post(f"{url}/admin/fault", json={"fault": "restart", "startup_seconds": 0.05})
        assert answer.status_code == 200
        await eventually(lambda: _when(client.get(f"{url}/admin/state"),
                                       lambda r: r.json()["process_start_time"] > start), what="new process")
        assert fleet.backends[0].restarts == 1


async def test_slow_divides_the_token_rate(client):
    config = SimConfig(tokens_per_second=200)
    async with Fleet(config, backends=1, control=False) as fleet:
        url = fleet.backend_urls[0]
        body = {**CANARY, "max_tokens": 20, "ignore_eos": True}
        started = time.monotonic()
        await client.post(f"{url}/v1/completions", json=body)
        normal = time.monotonic() - started
        state = (await client.post(f"{url}/admin/fault", json={"fault": "slow", "factor": 10})).json()
        assert state["fault"] == "slow" and state["slow_factor"] == 10
        started = time.monotonic()
        await client.post(f"{url}/v1/completions", json=body)
        slow = time.monotonic() - started
        assert slow >= 0.8 > normal  # 20 steps at 20 steps/s is 1 s (a lower bound: sleeps never run short)
        assert (await client.post(f"{url}/admin/fault", json={"fault": "none"})).json()["slow_factor"] == 1.0


# -- proxy and control ---------------------------------------------------------------------------
async def test_proxy_spreads_metrics_reads_across_backends(client):
    async with Fleet(SimConfig(tokens_per_second=2000), backends=3, proxy=True) as fleet:
        # Mark each backend by how many requests it finished: backend i finished i + 1.
        for index, url in enumerate(fleet.backend_urls):
            for _ in range(index + 1):
                await client.post(f"{url}/v1/completions", json=CANARY)
        seen = set()
        for _ in range(12):
            values = await scrape(client, fleet.proxy_url)
            seen.add(values["request_success:length"])
        assert seen == {1.0, 2.0, 3.0}
        # /v1/* goes through too; other paths do not.
        assert (await client.get(f"{fleet.proxy_url}/v1/models")).json()["data"][0]["id"] == "tiny"
        assert (await client.get(f"{fleet.proxy_url}/admin/state")).status_code == 404


async def test_proxy_prefers_the_least_busy_backend_and_skips_dead_ones(client):
    async with Fleet(LOADED, backends=2, proxy=True) as fleet:
        tasks = fire(client, fleet.proxy_url, 2)  # one long request on each backend
        try:
            await eventually(lambda: _when(asyncio.gather(*(scrape(client, u) for u in fleet.backend_urls)),
                                           lambda vs: [v["vllm:num_requests_running"] for v in vs] == [1, 1]),
                             what="one request per backend")
        finally:
            await cancel(tasks)
        await fleet.backends[0].die()
        for _ in range(4):
            response = await client.post(f"{fleet.proxy_url}/v1/completions", json=CANARY)
            assert response.status_code == 200
        await fleet.backends[1].die()
        response = await client.get(f"{fleet.proxy_url}/v1/models")
        assert response.status_code == 502 and "no backend available" in response.json()["error"]


async def test_control_server_lists_backends_and_applies_faults(client):
    async with Fleet(SimConfig(), backends=2) as fleet:
        listing = (await client.get(f"{fleet.control_url}/backends")).json()["backends"]
        assert [b["url"] for b in listing] == fleet.backend_urls
        state = (await client.post(f"{fleet.control_url}/backends/1/fault", json={"fault": "hang"})).json()
        assert state["fault"] == "hang" and fleet.backends[1].fault == "hang"
        assert (await client.get(f"{fleet.backend_urls[1]}/admin/state")).json()["fault"] == "hang"
        assert (await client.get(f"{fleet.control_url}/backends/x/state")).status_code == 404


async def test_python_api_faults_and_engine_access():
    async with Fleet(LOADED, backends=1, control=False) as fleet:
        backend = fleet.backends[0]
        assert backend.engine is not None and backend.listening
        assert backend.set_fault("hang")["fault"] == "hang"
        assert backend.set_fault("none")["fault"] == "none"
        await backend.die()
        assert backend.phase == "dead" and not backend.listening
        await backend.restart(startup_seconds=0)
        assert backend.phase == "serving" and backend.engine.stats.generation_tokens == 0


async def _when(awaitable: Awaitable[Any], predicate: Callable[[Any], bool]) -> Any:
    value = await awaitable
    return value if predicate(value) else None


async def test_a_restart_that_overtakes_a_die_leaves_no_task_behind_after_stop():
    async with Fleet(SimConfig(startup_seconds=0.05, die_close_delay=0.3)) as fleet:
        backend = fleet.backends[0]
        backend.set_fault("die")
        backend.set_fault("restart")  # while still dying: the die's close is still pending
        await backend.wait_phase("serving")
    leftover = [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("sim-backend-")]
    assert leftover == []
