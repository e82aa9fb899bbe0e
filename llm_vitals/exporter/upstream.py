"""Bounded HTTP reads of an upstream server: a size cap, a hard deadline, and errors turned into data.

A poll's reads are carried out by one call (`carry_out`): the poller hands it a generator that asks
for each GET (`Get`) and works out, from each answer, the next; this module only does the GETs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Mapping
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from llm_vitals.exporter.engines import PageError

MODELS_MAX_BYTES = 1024 * 1024


def auth_headers(api_key) -> dict[str, str]:
    """The bearer header for `/v1/*` routes; `/metrics` and `/health` never get the key."""
    return {"Authorization": f"Bearer {api_key.get_secret_value()}"} if api_key is not None else {}


# What we parse: the classic text format. A server that could also speak OpenMetrics or protobuf
# (vLLM's prometheus-client can) is asked for this one, so the page is what the scanner reads.
METRICS_ACCEPT = "text/plain;version=0.0.4;q=1.0, */*;q=0.1"
# The same, as the mapping aiohttp takes as it is (a dict it first copies into one of these, at each request).
METRICS_HEADERS = CIMultiDictProxy(CIMultiDict({"Accept": METRICS_ACCEPT}))


def parsed_url(url: str) -> URL | None:
    """`url` parsed as aiohttp parses a str at each request; None where it cannot be (aiohttp then
    reports it at each request, as a connect error)."""
    try:
        return URL(url)
    except (ValueError, TypeError):
        return None


async def bounded_get(
    session: aiohttp.ClientSession,
    url: str,
    *,
    timeout: float,
    max_bytes: int,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    """GET `url`, streamed and aborted past `max_bytes` or `timeout` (total, headers to last byte).

    Raises PageError with a poll-error reason: `refused` (no process listens), `connect` (no
    connection within the connect timeout, or any other connection failure), `timeout` (connected,
    and no whole answer within `timeout`), `too_large`. The status is returned,
    not judged: the caller knows what a 503 means for its route.
    """
    status, body, _ = await bounded_get_with_headers(session, url, timeout=timeout, max_bytes=max_bytes,
                                                     headers=headers)
    return status, body


async def bounded_get_with_headers(
    session: aiohttp.ClientSession,
    url: str,
    *,
    timeout: float,
    max_bytes: int,
    headers: Mapping[str, str] | None = None,
    parsed: URL | None = None,
) -> tuple[int, bytes, Mapping[str, str]]:
    """As `bounded_get`, plus the response headers (llama.cpp's restart token is one), read-only.

    `parsed` is `URL(url)`, for a caller that asks the same URL at every poll: given a str, aiohttp
    parses it again at each request (2.7 us: yarl keeps only the last 128 it parsed).
    """
    path = url.split("//", 1)[-1].partition("/")[2]
    deadlines = _connect_within(session, timeout)
    try:
        # One deadline for the whole exchange: a server that trickles a byte a second never trips
        # a per-read timeout, but does trip this one.
        async with asyncio.timeout(timeout):
            async with session.get(parsed if parsed is not None else url, headers=headers, allow_redirects=False,
                                   timeout=deadlines) as response:
                body = await read_capped(response, max_bytes, f"/{path}")
                return response.status, body, response.headers
    except aiohttp.ConnectionTimeoutError:
        # Never connected: unlike `timeout` (connected, no answer), this says nothing about the engine.
        raise PageError("connect", f"/{path}: no connection within the connect timeout") from None
    except TimeoutError:
        raise PageError("timeout", f"/{path} took longer than {timeout:g}s") from None
    except aiohttp.ClientPayloadError as exc:
        raise PageError("connect", f"/{path}: body cut short ({type(exc).__name__})") from None
    except aiohttp.ClientResponseError as exc:
        raise PageError("http_status", f"/{path}: malformed HTTP answer ({exc.status})") from None
    except aiohttp.ClientConnectorError as exc:
        if isinstance(exc.os_error, ConnectionRefusedError):
            # Nothing listens: the process is gone (a frozen one still accepts). The verdict reads
            # it `down` at once; bringing it back is its supervisor's job.
            raise PageError("refused", f"/{path}: connection refused") from None
        raise PageError("connect", f"/{path}: {type(exc).__name__}: {_os_reason(exc)}") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise PageError("connect", f"/{path}: {type(exc).__name__}: {_os_reason(exc)}") from None


@dataclass(frozen=True, slots=True)
class Get:
    """One bounded GET a read asks for: `bounded_get_with_headers`'s arguments."""

    url: str
    timeout: float
    max_bytes: int
    headers: Mapping[str, str] | None = None
    parsed: URL | None = None  # `url` parsed once, for a URL asked at every poll (parsed_url)


# A GET's answer: its status, body and headers (read-only).
Got = tuple[int, bytes, Mapping[str, str]]


async def carry_out(session: aiohttp.ClientSession, gets: Generator[Get, Got, object], get: Get) -> None:
    """Do `get`, then each GET `gets` asks for next, in order, until it returns.

    Each answer is sent back into `gets`; a failed GET's PageError is thrown into it at the `yield`
    that asked, so the asking code handles it where it would an awaited `bounded_get`'s. `gets` is
    already started (`get` is its first request): it is the caller's to start, this one only resumes it.
    """
    while True:
        answer: Got | PageError
        try:
            answer = await bounded_get_with_headers(session, get.url, timeout=get.timeout, max_bytes=get.max_bytes,
                                                    headers=get.headers, parsed=get.parsed)
        except PageError as exc:
            answer = exc
        try:
            get = gets.throw(answer) if isinstance(answer, PageError) else gets.send(answer)
        except StopIteration:
            return  # `gets` asks for nothing more


def _connect_within(session: aiohttp.ClientSession, timeout: float) -> aiohttp.ClientTimeout:
    """The request's aiohttp timeouts: a connect ends before the whole read's deadline does.

    `timeout` must mean "connected, and no answer": a frozen process accepts, a partitioned host
    does not, and only the first may be restarted. So a connect still pending at half the deadline
    is `connect`; the session's own timeouts are kept where its connect timeout is already shorter.
    """
    within = session.timeout.sock_connect
    if within is not None and within < timeout:
        return session.timeout
    return aiohttp.ClientTimeout(total=None, sock_connect=timeout / 2)


async def read_capped(response: aiohttp.ClientResponse, max_bytes: int, what: str) -> bytes:
    """The whole body of `response`; PageError("too_large") past `max_bytes`.

    Reads to the end: a single `content.read(n)` returns only what has arrived so far, which cuts a
    body that comes in more than one piece.
    """
    declared = response.content_length
    if declared is not None and declared > max_bytes:
        response.close()
        raise PageError("too_large", f"{what} declares {declared} bytes, over the {max_bytes}-byte cap")
    # What has arrived, a piece at a time, joined once: a page that came in one piece (most do) is
    # never copied (a bytearray grown chunk by chunk, then copied into bytes, cost 10 us a poll).
    chunks: list[bytes] = []
    size = 0
    while chunk := await response.content.readany():
        size += len(chunk)
        if size > max_bytes:
            # Closing drops the connection rather than draining an endless body.
            response.close()
            raise PageError("too_large", f"{what} is over the {max_bytes}-byte cap")
        chunks.append(chunk)
    return b"".join(chunks)


def _os_reason(exc: BaseException) -> str:
    # Connection errors carry the host:port and the OS reason, never request headers.
    text = str(exc)
    return text[:200] if text else "no detail"
