"""The backtest's only I/O: Prometheus's HTTP API, read in chunks that stay within its limits.

Raw samples, not `query_range`: a range selector (`family{...}[3600000ms]`, an instant query at the
chunk's end) returns every sample as scraped, with its own timestamp, and no stale markers, so a
gap in the scrapes stays a gap (query_range would fill it with the last value for 5 minutes and
hide it). A chunk holds at most CHUNK_POINTS reads per series, far under Prometheus's 11,000 points
per series and its sample limit, and one family is read at a time, so memory stays bounded by one
chunk of one family whatever the window's length.

Every failure is a `PrometheusError` whose message is a line a person can act on: what was asked,
what came back (HTTP status and Prometheus's own `error`), and what the backtest does about it.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
import urllib.error
import urllib.request
from array import array
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlencode

from llm_vitals.backtest.history import Series

# Reads per series in one chunk: a week at 15 s is 28 chunks of 6 h; Prometheus refuses over 11,000 a series.
CHUNK_POINTS = 1440
RETRIES = 2  # on 503, 429 and timeouts: Prometheus busy or restarting
MIN_SPLIT_SECONDS = 60.0  # a 422 range is halved down to this


class PrometheusError(Exception):
    """A question Prometheus did not answer; the message says what was asked and what came back."""


class TooLarge(PrometheusError):
    """A 422 `execution` error: the query would load more samples than Prometheus's --query.max-samples."""


def selector_matchers(selector: str | None) -> str:
    """The matchers inside `{...}` of a `--selector`, '' for none; ValueError for anything else."""
    if selector is None or not selector.strip():
        return ""
    text = selector.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"--selector must be a label matcher list in braces, like '{{job=\"vllm\"}}': {selector!r}")
    return text[1:-1].strip().rstrip(",")


def name_selector(names: Sequence[str], matchers: str) -> str:
    """`{__name__="a",job="x"}` for one name, `{__name__=~"a|b",job="x"}` for several."""
    # Metric names hold no regex metacharacters: an alternation of them needs no escaping.
    head = f'__name__="{names[0]}"' if len(names) == 1 else '__name__=~"' + "|".join(names) + '"'
    return "{" + head + (f",{matchers}" if matchers else "") + "}"


class Prometheus:
    """A synchronous client of one Prometheus, safe to share between threads (each request its own connection).

    The standard library's client: the reading threads (run.py) need a blocking one, and the
    project's one HTTP client library, aiohttp's, is asynchronous. Proxies from the environment
    are not used: the Prometheus asked for is the one named.
    """

    def __init__(self, url: str, *, timeout: float = 60.0, sleep: Callable[[float], None] = time.sleep) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._sleep = sleep
        self.splits = 0  # queries Prometheus refused as too large (422), read again in halves
        self._lock = threading.Lock()  # the reading threads (run.py) share one client

    def close(self) -> None:
        """Nothing held between requests: kept so that a caller may close what it opened."""

    def _answer(self, path: str, params: list[tuple[str, str]]) -> tuple[int, bytes]:
        """The status and body of one GET; an error status is an answer too. Raises TimeoutError or OSError."""
        try:
            with self._opener.open(f"{self.url}{path}?{urlencode(params)}", timeout=self.timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.read()
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise exc.reason from None
            raise

    def _get(self, path: str, params: list[tuple[str, str]], what: str) -> Any:
        last = ""
        for attempt in range(RETRIES + 1):
            if attempt:
                self._sleep(min(2.0 ** attempt, 10.0))
            try:
                status, content = self._answer(path, params)
            except TimeoutError:
                last = f"no answer within {self.timeout:g}s"
                continue
            except (OSError, http.client.HTTPException) as exc:  # URLError (refused, unknown host), a broken answer
                raise PrometheusError(f"{what}: cannot reach Prometheus at {self.url}: {_reason(exc)}") from None
            if status in (429, 502, 503, 504):
                last = f"HTTP {status} {_error_of(content)}".strip()
                continue
            if status == 422 and _error_type(content) == "execution":
                # Prometheus's only 422 on a well-formed instant query: it would load too many samples.
                raise TooLarge(f"{what}: Prometheus answered HTTP 422 {_error_of(content)}".rstrip())
            if status != 200:
                raise PrometheusError(f"{what}: Prometheus answered HTTP {status} {_error_of(content)}".rstrip())
            try:
                body = json.loads(content)
            except ValueError:
                raise PrometheusError(f"{what}: Prometheus's answer is not JSON") from None
            if not isinstance(body, dict) or body.get("status") != "success":
                raise PrometheusError(f"{what}: Prometheus answered {str(body)[:300]}")
            return body.get("data")
        raise PrometheusError(f"{what}: {last} (after {RETRIES + 1} tries)")

    def series(self, selector: str, start: float, end: float) -> list[dict[str, str]]:
        """The label sets of the series matching `selector` within [start, end] (no samples)."""
        data = self._get("/api/v1/series", [("match[]", selector), ("start", _ts(start)), ("end", _ts(end))],
                         f"listing the series {selector}")
        if not isinstance(data, list):
            raise PrometheusError(f"listing the series {selector}: unexpected answer {str(data)[:200]}")
        return [labels for labels in data if isinstance(labels, dict)]

    def samples(self, selector: str, start: float, end: float) -> list[Series]:
        """Every raw sample of the series matching `selector` within (start, end].

        A 422 (Prometheus's `--query.max-samples`: "query processing would load too many samples
        into memory") is read again in two halves, down to MIN_SPLIT_SECONDS; `splits` counts them.
        """
        try:
            return self._samples(selector, start, end)
        except TooLarge as exc:
            if end - start < 2 * MIN_SPLIT_SECONDS:
                raise PrometheusError(f"{exc}, even for {end - start:g}s (split down to {MIN_SPLIT_SECONDS:g}s; "
                                      f"raise its --query.max-samples)") from None
        with self._lock:
            self.splits += 1
        middle = start + (end - start) / 2
        merged: dict[tuple[tuple[str, str], ...], Series] = {}
        for part in (self.samples(selector, start, middle), self.samples(selector, middle, end)):
            for one in part:
                key = (("__name__", one.name), *sorted(one.labels.items()))
                before = merged.get(key)
                merged[key] = one if before is None else Series(one.name, one.labels, array("d", before.times) +
                                                                array("d", one.times),
                                                                array("d", before.values) + array("d", one.values))
        return list(merged.values())

    def _samples(self, selector: str, start: float, end: float) -> list[Series]:
        millis = max(1, round((end - start) * 1000))
        query = f"{selector}[{millis}ms]"
        data = self._get("/api/v1/query", [("query", query), ("time", _ts(end))], f"reading {query} at {_ts(end)}")
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise PrometheusError(f"reading {query}: expected a matrix, got {str(data)[:200]}")
        found: list[Series] = []
        for item in data.get("result") or []:
            labels = dict(item.get("metric") or {})
            name = labels.pop("__name__", "")
            pairs = item.get("values") or []
            # [[time, "value"], ...] split into its two columns by zip, in C (two comprehensions took twice as long).
            stamps, texts = zip(*pairs, strict=True) if pairs else ((), ())
            times = array("d", stamps)
            try:
                # Prometheus writes every value as float() reads it (NaN, +Inf, -Inf included): in C, at once.
                values = array("d", map(float, texts))
            except (TypeError, ValueError):
                values = array("d", map(_float, texts))
            found.append(Series(name, labels, times, values))
        return found


def _float(value: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _ts(seconds: float) -> str:
    return f"{seconds:.3f}"


def _reason(exc: OSError | http.client.HTTPException) -> str:
    """What a failed connection was, in words: a URLError's reason, else the error itself."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return str(getattr(reason, "strerror", None) or reason)


def _error_type(content: bytes) -> str:
    try:
        body = json.loads(content)
    except ValueError:
        return ""
    return str(body.get("errorType", "")) if isinstance(body, dict) else ""


def _error_of(content: bytes) -> str:
    try:
        body = json.loads(content)
    except ValueError:
        return content.decode("utf-8", "replace")[:200]
    if isinstance(body, dict) and body.get("error"):
        return f"({body.get('errorType', 'error')}: {str(body['error'])[:300]})"
    return ""
