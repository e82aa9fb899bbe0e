"""The llama.cpp adapter over the real pages of tests/fixtures/llamacpp/ (llama-server 0c1e570 on CPU).

Each page's values are checked twice: against the table below (what the capture's event log says
the server was doing) and against prometheus-client's own parser. The verdict tests then replay
the capture's sequences through the pure verdict: busy, the frozen engine loop (HTTP alive),
SIGSTOP (/metrics accepted, never answered), SIGKILL and the restart.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llm_vitals.exporter.engines import Page, PageError
from llm_vitals.exporter.engines.llamacpp import ENGINE, RESTART_HEADER, parse, parse_text
from llm_vitals.exporter.engines.table import ENGINES, read_page
from llm_vitals.exporter.settings import TargetSettings
from llm_vitals.exporter.verdict import PollError, judge

FIXTURES = Path(__file__).parent / "fixtures" / "llamacpp"
PREFIX = "llamacpp-0c1e570-cpu-"
STUCK_AFTER = 6.0

# state: running (processing), waiting (deferred), steps (n_decode), tokens predicted, prompt tokens
PAGES = {
    "idle": (0, 0, 0, 0, 0),
    "idle-after-one-request": (0, 0, 64, 64, 6),
    "busy-1": (2, 1, 451, 64, 36),
    "busy-2": (2, 1, 709, 64, 36),
    "engine-thread-frozen": (2, 1, 709, 64, 36),  # ptrace-stopped engine loop: counters as busy-2
    "busy-after-thread-release": (2, 1, 807, 64, 36),
    "busy-after-sigcont": (2, 1, 905, 64, 36),
    # right after the load's clients closed: the cancellations had not reached the slots yet
    "idle-after-busy": (2, 1, 2205, 64, 36),
    "during-prefill": (2, 0, 2205, 64, 36),
    "after-prefill": (0, 0, 2208, 4348, 2837),
    "busy-before-kill": (2, 1, 2249, 4348, 2867),
    "restarted-idle": (0, 0, 0, 0, 0),
}
# What the capture got instead of a page: no answer in 5 s (SIGSTOP), connection refused (SIGKILL).
NO_PAGE = ("sigstop", "after-sigkill")


def body(state: str) -> str:
    return (FIXTURES / f"{PREFIX}metrics-{state}.txt").read_text()


def start_header(state: str) -> dict[str, str]:
    """The /metrics response's Process-Start-Time-Unix header as the capture recorded it."""
    path = FIXTURES / f"{PREFIX}health-{state}.txt"
    found = re.search(r"^Process-Start-Time-Unix: (\S+)$", path.read_text(), re.M) if path.exists() else None
    return {RESTART_HEADER: found.group(1)} if found else {}


def page(state: str) -> Page:
    return Page(body(state).encode(), start_header(state))


def reference(text: str) -> dict[str, float]:
    """Every sample by full name, as prometheus-client's parser reads the page."""
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.mark.parametrize("state", sorted(PAGES))
def test_real_page_reads_as_captured_and_as_prometheus_client_reads_it(state):
    snap = read_page(ENGINE, page(state))
    running, waiting, steps, predicted, prompt = PAGES[state]
    assert (snap.running, snap.waiting, snap.steps, snap.generation_tokens, snap.prompt_tokens) == (
        running, waiting, steps, predicted, prompt
    )
    ref = reference(body(state))
    assert snap.running == ref["llamacpp:requests_processing"]
    assert snap.waiting == ref["llamacpp:requests_deferred"]
    assert snap.steps == ref["llamacpp:n_decode_total"]
    assert snap.generation_tokens == ref["llamacpp:tokens_predicted_total"]
    assert snap.prompt_tokens == ref["llamacpp:prompt_tokens_total"]
    assert snap.pending == (running + waiting > 0)


@pytest.mark.parametrize("state", sorted(PAGES))
def test_restart_token_is_the_header_and_never_a_start_time(state):
    snap = read_page(ENGINE, page(state))
    # Monotonic microseconds since boot: a token for inequality, never published as Unix time.
    assert snap.process_start_time is None
    assert snap.restart_token == start_header(state).get(RESTART_HEADER)


def test_every_page_of_one_lifetime_carries_one_token_and_the_restart_another():
    tokens = {state: read_page(ENGINE, page(state)).restart_token for state in PAGES if state != "during-prefill"}
    assert set(tokens.values()) == {"1571301719", "1860019350"}
    assert [s for s, t in tokens.items() if t == "1860019350"] == ["restarted-idle"]


@pytest.mark.parametrize("state", NO_PAGE)
def test_what_a_stopped_or_killed_server_left_is_no_page(state):
    # The capture wrote a comment where the page would be: there is nothing to read in it.
    with pytest.raises(PageError) as raised:
        parse(Page(body(state).encode()))
    assert raised.value.reason == "bad_metrics"


def test_token_counters_stand_still_while_busy_and_n_decode_moves():
    one, two = parse_text(body("busy-1")), parse_text(body("busy-2"))
    assert (one.generation_tokens, one.prompt_tokens) == (two.generation_tokens, two.prompt_tokens)
    assert two.steps - one.steps == 258


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n", "no llamacpp:n_decode_total"),
        ("llamacpp:requests_deferred 0\nllamacpp:n_decode_total 3\n", "no llamacpp:requests_processing"),
        ("llamacpp:requests_processing NaN\nllamacpp:requests_deferred 0\nllamacpp:n_decode_total 3\n", "is NaN"),
        ("llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\nllamacpp:n_decode_total +Inf\n", "is +Inf"),
        ("llamacpp:requests_processing one\n", "non-numeric"),
    ],
)
def test_a_page_without_what_the_verdict_needs_is_bad_metrics_naming_it(text, why):
    with pytest.raises(PageError) as raised:
        parse_text(text)
    assert raised.value.reason == "bad_metrics"
    assert why in raised.value.detail


def test_a_page_that_is_not_utf8_is_bad_metrics():
    with pytest.raises(PageError, match="not UTF-8"):
        parse(Page(b"llamacpp:requests_processing 1\n\xff\n"))


def test_vllm_page_on_a_llamacpp_target_is_wrong_engine_naming_both():
    vllm_page = (Path(__file__).parent / "fixtures" / "vllm").glob("*.txt")
    text = next(p for p in sorted(vllm_page) if "vllm:num_requests_running" in p.read_text()).read_bytes()
    with pytest.raises(PageError) as raised:
        read_page(ENGINE, Page(text))
    assert raised.value.reason == "wrong_engine"
    assert "llamacpp" in raised.value.detail and "vllm" in raised.value.detail


def test_llamacpp_page_on_a_vllm_target_is_wrong_engine():
    with pytest.raises(PageError) as raised:
        read_page(ENGINES["vllm"], page("busy-1"))
    assert raised.value.reason == "wrong_engine"


def test_the_table_row_says_metrics_unanswered_is_stuck_and_reads_the_header():
    assert ENGINES["llamacpp"] is ENGINE
    assert ENGINE.facts.metrics_unanswered_is_stuck
    assert ENGINE.restart_header == "Process-Start-Time-Unix"
    assert ENGINE.health_paths == ("/health",)
    assert not ENGINES["vllm"].facts.metrics_unanswered_is_stuck


# ---- the capture's sequences through the pure verdict (poll every second, stuck_after 6 s, down_after 2 s) ----

DOWN_AFTER = 2.0
TARGET = TargetSettings(name="llama", url="http://127.0.0.1:8080", engine="llamacpp", stuck_after=STUCK_AFTER,
                        down_after=DOWN_AFTER)
TIMEOUT = PollError("timeout", "/metrics took longer than 2s")
REFUSED = PollError("connect", "/metrics: ClientConnectorError: connection refused")


def replay(steps: list, t0: float = 1000.0):
    """Judge each observation one second after the last; every verdict, in order."""
    verdict, verdicts = None, []
    for i, seen in enumerate(steps):
        observation = read_page(ENGINE, page(seen)) if isinstance(seen, str) else seen
        verdict = judge(verdict, observation, t0 + i, TARGET, ENGINE.facts)
        verdicts.append(verdict)
    return verdicts


def test_busy_pages_with_n_decode_moving_are_busy_though_tokens_stand_still():
    verdicts = replay(["idle", "idle", "busy-1", "busy-2", "busy-after-thread-release", "busy-after-sigcont"])
    assert [v.state for v in verdicts] == ["starting", "idle", "busy", "busy", "busy", "busy"]
    assert verdicts[-1].restarts == 0


def test_frozen_engine_loop_with_http_alive_is_stuck_after_stuck_after():
    # busy-2 then the engine-thread-frozen page again and again: /metrics answers, nothing moves.
    frozen = 2 + int(STUCK_AFTER)
    verdicts = replay(["busy-1", "busy-2"] + ["engine-thread-frozen"] * frozen + ["busy-after-thread-release"])
    states = [v.state for v in verdicts]
    assert states[: 2 + int(STUCK_AFTER) - 1] == ["busy"] * (2 + int(STUCK_AFTER) - 1)
    assert states[2 + int(STUCK_AFTER) - 1] == "stuck"
    assert verdicts[-2].reason == "no_progress"
    assert states[-1] == "busy"  # released: n_decode_total moved on
    assert verdicts[-1].restarts == 0


def test_sigstop_metrics_accepted_never_answered_while_busy_is_stuck_metrics_unanswered():
    verdicts = replay(["busy-1", "busy-2"] + [TIMEOUT] * (int(STUCK_AFTER) + 1) + ["busy-after-sigcont"])
    states = [v.state for v in verdicts]
    assert "down" not in states
    stuck = next(v for v in verdicts if v.state == "stuck")
    assert stuck.reason == "metrics_unanswered"
    # Frozen whole (issue 29): unanswered for down_after over two reads, before stuck_after.
    assert stuck.stuck_seconds >= DOWN_AFTER
    assert states[-1] == "busy" and verdicts[-1].restarts == 0  # SIGCONT: same lifetime, moving again


def test_unanswered_metrics_on_an_idle_server_is_frozen_stuck_not_down():
    # Issue 29: llama.cpp's loop answers /metrics, so a server last seen idle whose /metrics accepts
    # and never answers for down_after is frozen, and restartable; `down` would never be restarted.
    verdicts = replay(["idle", "idle"] + [TIMEOUT] * 10)
    # Unanswered short of down_after keeps idle (no evidence yet); then stuck, never down.
    assert [v.state for v in verdicts[1:]] == ["idle", "idle"] + ["stuck"] * 9
    assert verdicts[-1].reason == "metrics_unanswered"


def test_unanswered_metrics_is_down_for_vllm_whose_metrics_only_gets_slow():
    vllm = TargetSettings(name="v", url="http://127.0.0.1:8000", engine="vllm", stuck_after=STUCK_AFTER,
                          down_after=DOWN_AFTER)
    verdict = judge(None, read_page(ENGINE, page("busy-1")), 0.0, vllm, ENGINES["vllm"].facts)
    for t in range(1, 10):
        verdict = judge(verdict, TIMEOUT, float(t), vllm, ENGINES["vllm"].facts)
    assert verdict.state == "down"


def test_kill_is_down_then_restart_counts_exactly_one_restart():
    verdicts = replay(["busy-before-kill", REFUSED, REFUSED, "restarted-idle", "restarted-idle", "restarted-idle"])
    assert [v.state for v in verdicts[:3]] == ["busy", "busy", "down"]  # down once refused for down_after
    assert verdicts[2].reason == "connect"
    assert (verdicts[3].state, verdicts[3].reason) == ("starting", "restart")
    assert [v.state for v in verdicts[4:]] == ["idle", "idle"]
    assert [v.restarts for v in verdicts] == [0, 0, 0, 1, 1, 1]


def test_restart_is_seen_by_the_header_alone_when_counters_happen_not_to_fall():
    # A restart whose first read already shows as much work as before: only the token tells.
    before = read_page(ENGINE, Page(b"llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n"
                                    b"llamacpp:n_decode_total 5\n", {RESTART_HEADER: "100"}))
    after = read_page(ENGINE, Page(b"llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n"
                                   b"llamacpp:n_decode_total 7\n", {RESTART_HEADER: "900"}))
    verdict = judge(judge(None, before, 0.0, TARGET, ENGINE.facts), after, 1.0, TARGET, ENGINE.facts)
    assert verdict.restarts == 1


def test_counters_reset_without_the_header_is_a_restart_too():
    verdicts = replay([read_page(ENGINE, Page(body("busy-before-kill").encode())), REFUSED,
                       read_page(ENGINE, Page(body("restarted-idle").encode()))])  # fmt: skip
    assert verdicts[-1].restarts == 1


def test_a_long_prefill_within_one_batch_time_is_busy_never_stuck():
    # prefill-samples: n_decode_total stood still for 13 s between batches (-b 2048). With
    # stuck_after above one batch's time, the prefill reads busy throughout.
    target = TargetSettings(name="llama", url="http://127.0.0.1:8080", engine="llamacpp", stuck_after=30.0)
    during = read_page(ENGINE, page("during-prefill"))
    verdict = judge(None, during, 0.0, target, ENGINE.facts)
    for t in range(1, 14):
        verdict = judge(verdict, during, float(t), target, ENGINE.facts)
        assert verdict.state == "busy", (t, verdict)
