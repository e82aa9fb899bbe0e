"""The /metrics page joined from each target's kept lines (llm_vitals/exporter/page.py) against the page
rendered whole (`collector.render_vitals`, itself checked byte for byte against prometheus-client
in tests/test_exporter_exposition.py).

The differential test plays generated histories on a small fleet: polls and canaries that
re-render as the poller does, and writers that change a target without re-rendering (a drain, a
GPU fault, an error counted in place, a reload's new settings, a poll or canary that forgot),
targets dropped and added, and scrapes at times that cross the values that move with `now` alone
(stuck seconds, readiness freshness, liveness budget).
Every scrape's page must equal the whole render of the same store at the same `now`.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import example, given
from hypothesis import strategies as st
from property import property_settings, record_examples

from llm_vitals.exporter.app import create_app
from llm_vitals.exporter.collector import render_vitals
from llm_vitals.exporter.engines import Snapshot
from llm_vitals.exporter.gpu_faults import GpuFault
from llm_vitals.exporter.keys import STORE
from llm_vitals.exporter.page import current, page_pieces, refresh, render_page
from llm_vitals.exporter.settings import TargetSettings, parse_settings
from llm_vitals.exporter.state import CANARY_RESULTS, STANDARD_ERROR_REASONS, StateStore, TargetRecord
from llm_vitals.exporter.verdict import STATES, Verdict
from llm_vitals.exposition import TEXT_CONTENT_TYPE

NOW = 1_800_000_000.25
EXAMPLES = 400
RUNS = {"examples": 0}

# Targets in the shapes that matter to the page: a canary with a short freshness (readiness
# turns with time), a short liveness budget, no canary, a proxy with credentials in its URL,
# label values to escape.
FLEET = [
    {"name": "fresh", "url": "http://10.0.0.1:8000", "canary": {"fresh_for": "20s"}},
    {"name": "live", "url": "http://10.0.0.2:8000/v1", "stuck_after": "10s", "liveness_budget": "30s"},
    {"name": "quiet", "url": "http://10.0.0.3:8000", "canary": {"enabled": False}},
    {"name": "lb", "url": "https://user:pw@lb.example:443/", "role": "proxy", "engine": "openai"},
    {"name": "odd", "url": 'http://10.0.0.5:8000/a"b\\c', "engine": "sglang"},
    {"name": "t6", "url": "http://10.0.0.6:8000"},
]
ODD_NUMBERS = [0.0, 1.0, -0.0, 0.5, 1e12, 123456789.123, 1e-9, float("inf"), float("nan"), 3]


def fleet_store() -> StateStore:
    return StateStore(parse_settings({"targets": FLEET}, environ={}), NOW - 600)


def set_gpu_fault(record: TargetRecord, detail: str | None) -> None:
    record.node_fault = GpuFault("node", detail) if detail else None  # as the node watch does, between polls


def _maybe(rng: random.Random, value):
    return value if rng.random() < 0.7 else None


def _verdict(rng: random.Random, previous: Verdict, now: float) -> Verdict:
    """A verdict a poll could leave: any state, times around `now`, odd numbers in the rates."""
    def when() -> float:
        return now - rng.choice([0.0, 0.25, 5.0, 19.5, 20.0, 29.0, 31.0, 90.0, 400.0])

    snapshot = Snapshot(running=rng.choice([0, 1, 3]), waiting=rng.choice([0, 2, 12]),
                        process_start_time=_maybe(rng, rng.choice([NOW - 3600.5, NOW - 1e6])))
    return replace(
        previous,
        state=rng.choice(STATES), up=rng.random() < 0.7, started=rng.random() < 0.8,
        snapshot=_maybe(rng, snapshot), last_poll=now,
        last_progress=_maybe(rng, when()), last_served=_maybe(rng, when()),
        stuck_seconds=rng.choice(ODD_NUMBERS), restarts=rng.randrange(4),
        last_canary_ok=_maybe(rng, when()),
        steps_per_second=_maybe(rng, rng.choice(ODD_NUMBERS)),
        generation_tokens_per_second=_maybe(rng, rng.choice(ODD_NUMBERS)),
    )


def play(seed: int) -> int:
    """One generated history on a fresh fleet; asserts every scrape. Returns how many scrapes it made."""
    rng = random.Random(seed)
    store = fleet_store()
    now = NOW
    scrapes = 0
    spare = [TargetSettings(name=f"new{i}", url=f"http://10.0.1.{i}:8000") for i in range(3)]
    for _ in range(rng.randrange(5, 40)):
        records = list(store)
        record = rng.choice(records) if records else None
        step = rng.random()
        if record is None or step < 0.3:  # a scrape, a little or a lot later (or a clock set back)
            now += rng.choice([0.0, 0.5, 1.0, 9.5, 10.0, 15.0, 30.0, -1.0])
            assert render_page(list(store), now) == render_vitals(store, now).encode(), f"seed {seed}"
            scrapes += 1
        elif step < 0.6:  # a poll, as the poller does it
            record.verdict = _verdict(rng, record.verdict, now)
            record.poll_duration = rng.choice([None, 0.0123, 1.0, 0.25])
            if rng.random() < 0.3:
                record.poll_errors[rng.choice([*STANDARD_ERROR_REASONS, "internal", 'we"ird\\reason\n'])] += 1
            if rng.random() < 0.8:  # else a writer that forgot to render
                refresh(record, now)
        elif step < 0.65:  # a canary's result, as the poller records it
            record.canaries[rng.choice(CANARY_RESULTS)] += 1
            if rng.random() < 0.5:
                record.verdict = replace(record.verdict, last_canary_ok=now, last_served=now)
            if rng.random() < 0.7:
                refresh(record, now)
        elif step < 0.72:  # a drain, not always followed by a render
            record.draining = not record.draining
            if rng.random() < 0.5:
                refresh(record, now)
        elif step < 0.78:  # a GPU fault set by a watch that does not render
            set_gpu_fault(record, rng.choice([None, "Xid 79", "node condition GpuXid"]))
        elif step < 0.84:  # a counter bumped in place (the poll loop's `internal`), or a duration set, alone
            if rng.random() < 0.5:
                record.poll_errors[rng.choice(["internal", "timeout"])] += 1
            else:
                record.poll_duration = rng.choice([None, 0.5, 2.0])
        elif step < 0.9:  # a reload gives the target new settings
            record.settings = TargetSettings(name=record.name, url=rng.choice(["http://10.0.2.1:8000", "http://h:1/p"]),
                                             engine=rng.choice(["vllm", "sglang"]), stuck_after=rng.choice([5.0, 60.0]))
        elif step < 0.95:  # discovery drops a target (through the store's one way out)
            store.remove(record.name)
        elif spare:  # discovery adds one, not polled yet
            added = store.add(spare.pop(), now)
            if rng.random() < 0.5:
                refresh(added, now)
    now += rng.choice([0.0, 12.0])
    assert render_page(list(store), now) == render_vitals(store, now).encode(), f"seed {seed}"
    return scrapes + 1


@given(st.integers(0, 2**64))
@example(0)
@property_settings(EXAMPLES)
def _one_history(seed: int) -> None:
    RUNS["examples"] += 1
    play(seed)


def test_the_joined_page_equals_the_page_rendered_whole_over_generated_histories(request) -> None:
    RUNS["examples"] = 0
    _one_history()
    record_examples(request, RUNS["examples"], EXAMPLES)


def test_a_scrape_reuses_the_lines_a_poll_rendered() -> None:
    store = fleet_store()
    record = store.get("quiet")
    record.verdict = replace(record.verdict, state="busy", up=True, started=True, last_poll=NOW, last_progress=NOW)
    refresh(record, NOW)
    kept = record.rendered
    render_page(list(store), NOW + 14)
    assert record.rendered is kept


def test_a_stuck_target_shows_its_stuck_seconds_at_the_scrape_not_at_the_poll() -> None:
    store = fleet_store()
    record = store.get("live")
    record.verdict = replace(record.verdict, state="stuck", up=True, started=True, last_poll=NOW,
                             last_progress=NOW - 20)
    refresh(record, NOW)
    page = render_page(list(store), NOW + 15).decode()
    assert 'llm_vitals_stuck_seconds{target="live"} 35.0\n' in page
    assert 'llm_vitals_live{target="live"} 0.0\n' in page  # 35 s stuck, past the 30 s budget


def test_readiness_ends_with_the_canary_freshness_between_two_polls() -> None:
    store = fleet_store()
    record = store.get("fresh")
    record.verdict = replace(record.verdict, state="idle", up=True, started=True, last_poll=NOW, last_served=NOW - 5)
    refresh(record, NOW)
    assert 'llm_vitals_ready{target="fresh"} 1.0\n' in render_page(list(store), NOW + 15).decode()
    assert 'llm_vitals_ready{target="fresh"} 0.0\n' in render_page(list(store), NOW + 15.5).decode()


def test_a_change_no_one_rendered_is_on_the_next_page() -> None:
    store = fleet_store()
    record = store.get("t6")
    refresh(record, NOW)
    record.draining = True  # a writer that does not call refresh
    assert 'llm_vitals_draining{target="t6"} 1.0\n' in render_page(list(store), NOW).decode()
    assert record.rendered is not None and record.rendered.reading.draining


def test_a_dropped_target_takes_its_lines_with_it() -> None:
    store = fleet_store()
    for record in store:
        refresh(record, NOW)
    store.remove("odd")
    page = render_page(list(store), NOW).decode()
    assert 'target="odd"' not in page
    assert "llm_vitals_exporter_targets 5.0\n" in page
    assert page.encode() == render_vitals(store, NOW).encode()


def test_a_poll_landing_mid_page_does_not_change_the_page() -> None:
    store = fleet_store()
    for record in store:
        refresh(record, NOW)
    before = render_page(list(store), NOW)
    pieces = page_pieces(list(store), NOW, group=2)
    first = next(pieces)
    record = store.get("live")  # a poll runs while the page is sent
    record.verdict = replace(record.verdict, state="stuck", up=True, started=True, last_poll=NOW, last_progress=NOW - 99)
    record.poll_errors["timeout"] += 1
    refresh(record, NOW)
    store.get("t6").draining = True
    assert first + b"".join(pieces) == before
    assert render_page(list(store), NOW) != before  # the next scrape sees the poll


def test_reading_every_target_hands_the_loop_back_within_the_budget() -> None:
    store = StateStore(parse_settings({"targets": [{"name": f"t{i}", "url": f"http://10.0.0.1:{8000 + i}"}
                                                   for i in range(200)]}, environ={}), NOW)
    ticks = iter(range(10**6))
    pieces = list(page_pieces(list(store), NOW, budget=0.5, clock=lambda: float(next(ticks))))
    # The fake clock moves 1 s a reading of it; it is read every 32 targets: a step ends each time.
    assert pieces[:6] == [b""] * 6
    assert b"" not in pieces[6:]
    assert b"".join(pieces) == render_vitals(store, NOW).encode()


def test_current_keeps_what_it_renders() -> None:
    store = fleet_store()
    record = store.get("t6")
    assert record.rendered is None
    kept = current(record, NOW)
    assert record.rendered is kept and current(record, NOW) is kept


async def test_the_metrics_route_sends_the_page_rendered_whole(aiohttp_client) -> None:
    # Through the real route (streamed in pieces) and the benchmark's baseline route: the same vitals.
    settings = parse_settings({"targets": FLEET}, environ={})
    pages = []
    for full_render in (False, True):
        client = await aiohttp_client(create_app(settings, clock=lambda: NOW, poll=False, full_render=full_render))
        store = client.app[STORE]
        store.get("live").verdict = replace(store.get("live").verdict, state="stuck", started=True, last_progress=NOW - 40)
        response = await client.get("/metrics")
        assert response.status == 200
        assert response.headers["Content-Type"] == TEXT_CONTENT_TYPE
        text = await response.text()
        vitals, process = text.split("# HELP process_", 1)
        assert vitals.encode() == render_vitals(store, NOW).encode()
        assert "process_resident_memory_bytes" in process
        pages.append(vitals)
    assert pages[0] == pages[1]
