"""The informer's pure rules: the backoff schedule, the watch timeout, what to do after each outcome, error answers."""

from __future__ import annotations

import pytest

from llm_vitals.kube.backoff import CAP_SECONDS, Backoff, next_wait, watch_seconds
from llm_vitals.kube.errors import ApiError, KubeConfigError, KubeUnavailable, api_error
from llm_vitals.kube.informer import Backoffs, Failed, Step, WatchEnded, next_step, outcome_of


def schedule(draws: list[float], gaps: list[float] | None = None) -> list[float]:
    """The waits of successive backoffs, each `gap` seconds after the previous one began (default: right after)."""
    backoff, now, waits = Backoff(), 1000.0, []
    for i, draw in enumerate(draws):
        wait, backoff = next_wait(backoff, now, draw)
        waits.append(round(wait, 3))
        now += gaps[i] if gaps else wait
    return waits


@pytest.mark.parametrize(("draws", "gaps", "expected"), [
    # No jitter: 0.8 s doubling to the 30 s cap, then staying there.
    ([0.0] * 8, None, [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]),
    # Full jitter: each wait up to twice its base, the cap too ([30, 60) s, client-go's 0.22 QPS).
    ([0.5, 0.999, 0.25], None, [1.2, 3.198, 4.0]),
    ([0.999] * 8, None, [1.599, 3.198, 6.397, 12.794, 25.587, 51.174, 59.97, 59.97]),
    # Two minutes without a wait: the next starts over at 0.8 s.
    ([0.0] * 4, [1.0, 1.0, 121.0, 1.0], [0.8, 1.6, 3.2, 0.8]),
    # Exactly two minutes is not yet a reset (client-go: strictly more than the reset duration).
    ([0.0] * 3, [1.0, 120.0, 1.0], [0.8, 1.6, 3.2]),
])
def test_the_backoff_doubles_from_0_8_s_to_a_jittered_30_s_cap_and_resets_after_two_quiet_minutes(draws, gaps, expected):
    assert schedule(draws, gaps) == expected


def test_the_backoff_never_overflows_after_very_many_failures():
    wait, backoff = next_wait(Backoff(attempt=10_000, last=0.0), 1.0, 0.0)
    assert wait == CAP_SECONDS and backoff == Backoff(10_001, 1.0)


@pytest.mark.parametrize(("draw", "seconds"), [(0.0, 300), (0.5, 450), (0.9999, 599)])
def test_each_watch_asks_for_five_to_ten_minutes(draw, seconds):
    assert watch_seconds(draw) == seconds


FRESH = Backoffs()
RELIST_TWICE = Backoffs(relist=Backoff(2, 999.0))


@pytest.mark.parametrize(("outcome", "backoffs", "expected", "after"), [
    # The server ended the watch (its timeout): resume at once, no backoff used.
    (WatchEnded(300.0, 0), FRESH, Step(0.0, relist=False, failure=False, why="resume"), FRESH),
    (WatchEnded(0.2, 3), FRESH, Step(0.0, relist=False, failure=False, why="resume"), FRESH),
    # Ended at once with nothing: not a normal end (a proxy closing every watch); relist after the backoff.
    (WatchEnded(0.2, 0), FRESH, Step(0.8, relist=True, failure=False, why="short_watch"),
     Backoffs(relist=Backoff(1, 1000.0))),
    # 410 Gone, from the watch (its ERROR event) or a list: relist after the relist backoff, not a failure.
    (Failed("watch", 410), FRESH, Step(0.8, relist=True, failure=False, why="gone"), Backoffs(relist=Backoff(1, 1000.0))),
    (Failed("watch", 410), RELIST_TWICE, Step(3.2, relist=True, failure=False, why="gone"),
     Backoffs(relist=Backoff(3, 1000.0))),
    # The API server away, or 429, while opening the watch: resume from the same version after the
    # reconnect backoff, which is counted apart from the relist backoff.
    (Failed("watch", None, unreachable=True), RELIST_TWICE, Step(0.8, relist=False, failure=True, why="reconnect"),
     Backoffs(relist=Backoff(2, 999.0), reconnect=Backoff(1, 1000.0))),
    (Failed("watch", 429), FRESH, Step(0.8, relist=False, failure=True, why="reconnect"),
     Backoffs(reconnect=Backoff(1, 1000.0))),
    # Anything else fails: a list that fails (unreachable, 429, 403), a watch refused (403, 500), a config error.
    (Failed("list", None, unreachable=True), FRESH, Step(0.8, relist=True, failure=True, why="failed"),
     Backoffs(relist=Backoff(1, 1000.0))),
    (Failed("list", 429), FRESH, Step(0.8, relist=True, failure=True, why="failed"), Backoffs(relist=Backoff(1, 1000.0))),
    (Failed("list", 403), RELIST_TWICE, Step(3.2, relist=True, failure=True, why="failed"),
     Backoffs(relist=Backoff(3, 1000.0))),
    (Failed("watch", 403), FRESH, Step(0.8, relist=True, failure=True, why="failed"), Backoffs(relist=Backoff(1, 1000.0))),
    (Failed("watch", 500), FRESH, Step(0.8, relist=True, failure=True, why="failed"), Backoffs(relist=Backoff(1, 1000.0))),
    (Failed("watch", None), FRESH, Step(0.8, relist=True, failure=True, why="failed"), Backoffs(relist=Backoff(1, 1000.0))),
])
def test_what_the_informer_does_after_each_outcome(outcome, backoffs, expected, after):
    assert next_step(outcome, backoffs, 1000.0, 0.0) == (expected, after)


@pytest.mark.parametrize(("stage", "error", "expected"), [
    ("watch", ApiError(410, "Expired", "too old resource version: 5 (90)"), Failed("watch", 410)),
    ("list", ApiError(403, "Forbidden"), Failed("list", 403)),
    ("watch", KubeUnavailable("the API server cannot be reached: ..."), Failed("watch", None, unreachable=True)),
    ("list", KubeConfigError("cannot use the kubeconfig /x"), Failed("list", None)),
])
def test_a_kube_error_becomes_the_plain_outcome_the_rule_reads(stage, error, expected):
    assert outcome_of(stage, error) == expected


@pytest.mark.parametrize(("status", "body", "expected", "text"), [
    (403, b'{"kind":"Status","status":"Failure","message":"pods is forbidden: User \\"x\\" cannot list",'
          b'"reason":"Forbidden","code":403}',
     (403, "Forbidden", 'pods is forbidden: User "x" cannot list'), 'HTTP 403: pods is forbidden: User "x" cannot list'),
    # A watch ERROR event's object: its own code wins over the stream's 200/500.
    (500, {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version: 1 (5)"},
     (410, "Expired", "too old resource version: 1 (5)"), "HTTP 410: too old resource version: 1 (5)"),
    (401, "Unauthorized", (401, "", "Unauthorized"), "HTTP 401: Unauthorized"),
    (502, "<html>\n<body>Bad   gateway</body></html>", (502, "", "<html> <body>Bad gateway</body></html>"),
     "HTTP 502: <html> <body>Bad gateway</body></html>"),
    (500, b"", (500, "", ""), "HTTP 500: no message"),
    (503, b"[1, 2]", (503, "", ""), "HTTP 503: no message"),
    (404, {"kind": "Status", "reason": "NotFound"}, (404, "NotFound", ""), "HTTP 404: NotFound"),
])
def test_an_error_answer_is_its_status_reason_and_message(status, body, expected, text):
    error = api_error(status, body)
    assert (error.status, error.reason, error.message) == expected
    assert str(error) == text


def test_an_error_body_is_capped():
    assert len(api_error(500, "x" * 10_000).message) == 500
