"""The /metrics page joined from each target's kept lines (llm_vitals/exporter/page.py) against the page
rendered whole (tests/whole_page.py's `render_vitals`, itself checked byte for byte against
prometheus-client in tests/test_exporter_exposition.py).

The differential test plays generated histories on a small fleet: every change a writer makes
through the record's methods (a poll, a canary and its task, a drain, a GPU fault of each source, an
error counted alone, a model looked up), a reload's new settings, targets dropped and added, and
scrapes at times that cross the values that move with `now` alone (stuck seconds, readiness
freshness, liveness budget). Every scrape's page must equal the whole render of the same store at
the same `now`.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import example, given
from hypothesis import strategies as st
from property import property_settings, record_examples
from whole_page import render_vitals

from llm_vitals.exporter.app import create_app
from llm_vitals.exporter.engines import PageReading
from llm_vitals.exporter.gpu_faults import DcgmState, GpuFault, SourceRead
from llm_vitals.exporter.keys import PAGES, STORE
from llm_vitals.exporter.page import PageCache
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


def set_gpu_fault(record: TargetRecord, source: str, detail: str | None) -> None:
    """A GPU fault flagged or cleared by one source, as a poll's aggregate writes it."""
    fault = GpuFault(source, detail) if detail else None
    error = None if fault or source in ("file", "dcgm") else {"node": "node n1 not found in the API server",
                                                              "nvml": "NVML not loaded"}[source]
    memory = DcgmState() if source == "dcgm" else None
    record.set_gpu_faults(record.gpu_faults.with_read(source, SourceRead(fault, error, memory)))


def poll(record: TargetRecord, now: float, duration: float = 0.0021, **verdict) -> None:
    """A poll that leaves the record's verdict with these fields changed."""
    record.record_poll(replace(record.verdict, **verdict), now, duration)


def _maybe(rng: random.Random, value):
    return value if rng.random() < 0.7 else None


def _verdict(rng: random.Random, previous: Verdict, now: float) -> Verdict:
    """A verdict a poll could leave: any state, times around `now`, odd numbers in the rates."""
    def when() -> float:
        return now - rng.choice([0.0, 0.25, 5.0, 19.5, 20.0, 29.0, 31.0, 90.0, 400.0])

    snapshot = PageReading(running=rng.choice([0, 1, 3]), waiting=rng.choice([0, 2, 12]),
                           process_start_time=_maybe(rng, rng.choice([NOW - 3600.5, NOW - 1e6])))
    return replace(
        previous,
        state=rng.choice(STATES), up=rng.random() < 0.7, started=rng.random() < 0.8,
        error_reason=rng.choice([None, None, None, *STANDARD_ERROR_REASONS, 'we"ird\\reason\n']),
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
    pages = PageCache()
    now = NOW
    scrapes = 0
    spare = [TargetSettings(name=f"new{i}", url=f"http://10.0.1.{i}:8000") for i in range(3)]
    for _ in range(rng.randrange(5, 40)):
        records = list(store)
        record = rng.choice(records) if records else None
        step = rng.random()
        if record is None or step < 0.3:  # a scrape, a little or a lot later (or a clock set back)
            now += rng.choice([0.0, 0.5, 1.0, 9.5, 10.0, 15.0, 30.0, -1.0])
            assert pages.page(list(store), now) == render_vitals(store, now).encode(), f"seed {seed}"
            scrapes += 1
        elif step < 0.6:  # a poll, as the poller does it
            record.record_poll(_verdict(rng, record.verdict, now), now, rng.choice([0.0123, 1.0, 0.25, 0.0]))
        elif step < 0.65:  # a canary's result, as the poller records it
            verdict = replace(record.verdict, last_canary_ok=now, last_served=now) if rng.random() < 0.5 else record.verdict
            record.record_canary(rng.choice(CANARY_RESULTS), verdict)
        elif step < 0.68:  # the canary task ends, or the canary's model is looked up (neither is on the page)
            if rng.random() < 0.5:
                record.canary_ended()
            else:
                record.set_model(rng.choice([None, "tiny"]))
        elif step < 0.72:  # a drain or an undrain
            record.set_draining(not record.draining)
        elif step < 0.78:  # a GPU fault set or cleared by one of its sources
            set_gpu_fault(record, rng.choice(["node", "file", "dcgm", "nvml"]), rng.choice([None, "Xid 79", "node condition GpuXid"]))
        elif step < 0.84:  # an error counted alone (the poll loop's `internal`), or a dcgm page that cannot be read
            if rng.random() < 0.7:
                record.count_poll_error(rng.choice(["internal", "timeout"]))
            else:
                dcgm = record.gpu_faults.of("dcgm")
                record.set_gpu_faults(record.gpu_faults.with_read("dcgm", replace(
                    dcgm, error=rng.choice([None, "timeout: no answer"]))))
        elif step < 0.9:  # a reload gives the target new settings: a fresh record, as discovery's changed set does
            store.add(TargetSettings(name=record.name, url=rng.choice(["http://10.0.2.1:8000", "http://h:1/p"]),
                                     engine=rng.choice(["vllm", "sglang"]), stuck_after=rng.choice([5.0, 60.0])), now)
        elif step < 0.95:  # discovery drops a target (through the store's one way out)
            store.remove(record.name)
        elif spare:  # discovery adds one, not polled yet
            store.add(spare.pop(), now)
    now += rng.choice([0.0, 12.0])
    assert pages.page(list(store), now) == render_vitals(store, now).encode(), f"seed {seed}"
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


def test_a_scrape_renders_again_only_the_targets_that_changed_since_the_last() -> None:
    store, pages = fleet_store(), PageCache()
    for record in store:
        poll(record, NOW, state="busy", up=True, started=True, last_poll=NOW, last_progress=NOW)
    first = pages.page(list(store), NOW + 1)
    assert pages.renders == 6
    record = store.get("quiet")
    kept = pages.kept(record)
    assert pages.page(list(store), NOW + 2) == first and pages.renders == 6  # nothing changed: nothing rendered
    assert pages.kept(record) is kept
    poll(record, NOW + 3, last_poll=NOW + 3)
    poll(record, NOW + 4, last_poll=NOW + 4)  # two polls between two scrapes: one render
    store.get("t6").set_draining(True)
    page = pages.page(list(store), NOW + 5).decode()
    assert pages.renders == 8
    assert 'llm_vitals_last_poll_timestamp_seconds{target="quiet"} 1.80000000425e+09\n' in page


def test_polls_render_nothing() -> None:
    store, pages = fleet_store(), PageCache()
    pages.page(list(store), NOW)
    for record in store:
        poll(record, NOW + 1, state="idle", up=True, last_poll=NOW + 1)
    assert pages.renders == 6  # the first scrape's; the polls only bumped versions


def test_a_stuck_target_shows_its_stuck_seconds_at_the_scrape_not_at_the_poll() -> None:
    store, pages = fleet_store(), PageCache()
    record = store.get("live")
    poll(record, NOW, state="stuck", up=True, started=True, last_poll=NOW, last_progress=NOW - 20)
    pages.page(list(store), NOW)
    page = pages.page(list(store), NOW + 15).decode()
    assert 'llm_vitals_stuck_seconds{target="live"} 35.0\n' in page
    assert 'llm_vitals_live{target="live"} 0.0\n' in page  # 35 s stuck, past the 30 s budget


def test_readiness_ends_with_the_canary_freshness_between_two_polls() -> None:
    store, pages = fleet_store(), PageCache()
    record = store.get("fresh")
    poll(record, NOW, state="idle", up=True, started=True, last_poll=NOW, last_served=NOW - 5)
    pages.page(list(store), NOW)
    assert 'llm_vitals_ready{target="fresh"} 1.0\n' in pages.page(list(store), NOW + 15).decode()
    assert 'llm_vitals_ready{target="fresh"} 0.0\n' in pages.page(list(store), NOW + 15.5).decode()


def test_a_change_between_two_scrapes_is_on_the_next_page() -> None:
    store, pages = fleet_store(), PageCache()
    record = store.get("t6")
    pages.page(list(store), NOW)
    record.set_draining(True)  # the drain route, between two scrapes
    set_gpu_fault(record, "node", "node condition GpuXid")  # the node watch, between two polls
    page = pages.page(list(store), NOW).decode()
    assert 'llm_vitals_draining{target="t6"} 1.0\n' in page
    assert 'llm_vitals_gpu_fault{target="t6"} 1.0\n' in page
    kept = pages.kept(record)
    assert kept is not None and kept.version == record.version


def test_a_dropped_target_takes_its_lines_with_it() -> None:
    store, pages = fleet_store(), PageCache()
    pages.page(list(store), NOW)
    odd = store.remove("odd")
    page = pages.page(list(store), NOW).decode()
    assert 'target="odd"' not in page
    assert "llm_vitals_exporter_targets 5.0\n" in page
    assert page.encode() == render_vitals(store, NOW).encode()
    assert odd is not None and pages.kept(odd) is None  # forgotten by the scrape after it left


def test_a_poll_landing_mid_page_does_not_change_the_page() -> None:
    store, pages = fleet_store(), PageCache()
    before = pages.page(list(store), NOW)
    pieces = pages.pieces(list(store), NOW, group=2)
    first = next(pieces)
    record = store.get("live")  # a poll runs while the page is sent
    poll(record, NOW, state="stuck", up=True, started=True, last_poll=NOW, last_progress=NOW - 99, error_reason="timeout")
    store.get("t6").set_draining(True)
    assert first + b"".join(pieces) == before
    assert pages.page(list(store), NOW) != before  # the next scrape sees the poll


def test_reading_every_target_hands_the_loop_back_within_the_budget() -> None:
    store = StateStore(parse_settings({"targets": [{"name": f"t{i}", "url": f"http://10.0.0.1:{8000 + i}"}
                                                   for i in range(200)]}, environ={}), NOW)
    ticks = iter(range(10**6))
    pieces = list(PageCache().pieces(list(store), NOW, budget=0.5, clock=lambda: float(next(ticks))))
    # The fake clock moves 1 s a reading of it; it is read every 8 targets: a step ends each time.
    assert pieces[:25] == [b""] * 25
    assert b"" not in pieces[25:]
    assert b"".join(pieces) == render_vitals(store, NOW).encode()


def test_current_keeps_what_it_renders() -> None:
    store, pages = fleet_store(), PageCache()
    record = store.get("t6")
    assert pages.kept(record) is None
    kept = pages.current(record, NOW)
    assert pages.kept(record) is kept and pages.current(record, NOW) is kept


async def test_the_metrics_route_sends_the_page_rendered_whole(aiohttp_client) -> None:
    # Through the real route, streamed in pieces, twice: the second scrape from the lines kept by the first.
    settings = parse_settings({"targets": FLEET}, environ={})
    client = await aiohttp_client(create_app(settings, clock=lambda: NOW, poll=False))
    store = client.app[STORE]
    poll(store.get("live"), NOW, state="stuck", started=True, last_progress=NOW - 40)
    pages = []
    for _ in range(2):
        response = await client.get("/metrics")
        assert response.status == 200
        assert response.headers["Content-Type"] == TEXT_CONTENT_TYPE
        text = await response.text()
        vitals, process = text.split("# HELP process_", 1)
        assert vitals.encode() == render_vitals(store, NOW).encode()
        assert "process_resident_memory_bytes" in process
        pages.append(vitals)
    assert pages[0] == pages[1]
    assert client.app[PAGES].renders == len(FLEET)
