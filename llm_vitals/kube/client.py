"""One client for the API server: connects on first use, sends a request, turns the answer into JSON or a KubeError.

Requests are kubernetes-asyncio's generated calls (they build the URLs), sent with
`_preload_content=False` so that every answer, good or bad, is read here and only here: a 2xx is its
JSON, anything else an `ApiError` from `errors.api_error`, a transport failure `KubeUnavailable`.
Objects stay plain JSON dicts: the callers read a few fields, and the API server's own JSON has
no model round trip to lose a field or a MicroTime's digits in.

The client connects lazily, so that a kubeconfig that cannot be used yet (an exec plugin that
fails, a token file not mounted yet) is an error of each request, retried at the next one, never
a process that fails to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Generic, TypeVar

import aiohttp
from kubernetes_asyncio.client import ApiClient

from llm_vitals.config import KubeAccess

from .connect import Credentials, open_api_client
from .errors import KubeTimeout, KubeUnavailable, api_error

# One generated call, given the ApiClient and the options this client adds (`_preload_content`,
# `_request_timeout`): e.g. `lambda api, options: CoreV1Api(api).read_node(name, **options)`.
Operation = Callable[[ApiClient, dict[str, Any]], Awaitable[Any]]
_TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)
T = TypeVar("T")


@dataclass(frozen=True)
class Dated(Generic[T]):
    """An answer's value and the API server's time when it answered (its `Date` header: whole seconds),
    None when the answer carried no readable Date."""

    value: T
    server_time: float | None


def server_time(date: str | None) -> float | None:
    """The unix time in an HTTP `Date` header, or None when there is none or it cannot be read."""
    if not date:
        return None
    try:
        return parsedate_to_datetime(date).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


def unreachable(exc: BaseException, timeout: float) -> KubeUnavailable:
    """A transport failure as one sentence (a TLS failure keeps its reason: CERTIFICATE_VERIFY_FAILED...)."""
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return KubeTimeout(f"the API server did not answer within {timeout:g}s")
    return KubeUnavailable(f"the API server cannot be reached: {type(exc).__name__}: {exc}"[:300])


class KubeClient:
    """The API server, reached as `access` says. Shared by every informer and action of a process; close it once."""

    def __init__(self, access: KubeAccess):
        self.access = access
        self.timeout = access.timeout
        self._api: ApiClient | None = None
        self._credentials = Credentials()
        self._connecting = asyncio.Lock()

    async def _connected(self) -> ApiClient:
        if self._api is None:
            async with self._connecting:
                if self._api is None:
                    self._api, self._credentials = await open_api_client(self.access)
        return self._api

    async def close(self) -> None:
        if self._api is not None:
            api, self._api = self._api, None
            await api.close()

    async def call(self, operation: Operation, timeout: float | None = None) -> dict[str, Any]:
        """Send one request: its JSON answer ({} when empty), else a KubeError. A 401 renews exec credentials once."""
        return (await self.call_dated(operation, timeout)).value

    async def call_dated(self, operation: Operation, timeout: float | None = None) -> Dated[dict[str, Any]]:
        """As `call`, with the API server's time of its answer (for what must be judged by one clock)."""
        api = await self._connected()
        limit = timeout or self.timeout
        for attempt in (1, 2):
            await self._credentials.before_request(api.configuration)
            try:
                response = await operation(api, {"_preload_content": False, "_request_timeout": limit})
                try:
                    body = await response.read()
                finally:
                    response.release()
            except _TRANSPORT_ERRORS as exc:
                raise unreachable(exc, limit) from None
            if response.status == 401 and attempt == 1 and await self._credentials.after_unauthorized(api.configuration):
                continue
            if not 200 <= response.status < 300:
                raise api_error(response.status, body)
            try:
                value = json.loads(body) if body else {}
            except ValueError:
                raise api_error(502, body) from None  # a 2xx that is not JSON: a proxy's page, not the API server
            return Dated(value, server_time(response.headers.get("Date")))
        raise AssertionError("unreachable")

    @contextlib.asynccontextmanager
    async def watch(self, operation: Operation, seconds: float) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """Open a watch (`operation` asks for `watch=True`): its events, as dicts, until the server ends it.

        Opening fails with a KubeError. While reading, an ERROR event is raised as its ApiError (410
        Gone among them), and a stream that breaks is KubeUnavailable.
        """
        api = await self._connected()
        await self._credentials.before_request(api.configuration)
        # Connect and the first answer within the request timeout; then silence for longer than the
        # watch asked for means a dead connection.
        limit = aiohttp.ClientTimeout(connect=self.timeout, sock_connect=self.timeout, sock_read=seconds + self.timeout)
        try:
            response = await operation(api, {"_preload_content": False, "_request_timeout": limit})
        except _TRANSPORT_ERRORS as exc:
            raise unreachable(exc, self.timeout) from None
        try:
            if response.status != 200:
                try:
                    body = await response.read()
                except _TRANSPORT_ERRORS as exc:
                    raise unreachable(exc, self.timeout) from None
                if response.status == 401:
                    await self._credentials.after_unauthorized(api.configuration)  # the next try uses the new ones
                raise api_error(response.status, body)
            yield _events(response, seconds + self.timeout)
        finally:
            response.close()


async def _events(response: aiohttp.ClientResponse, limit: float) -> AsyncIterator[dict[str, Any]]:
    while True:
        try:
            line = await response.content.readline()
        except (*_TRANSPORT_ERRORS, ValueError) as exc:  # ValueError: a line over aiohttp's buffer
            raise unreachable(exc, limit) from None
        if not line:
            return
        try:
            event = json.loads(line)
        except ValueError:
            raise KubeUnavailable(f"the watch sent a line that is not JSON: {line[:100]!r}") from None
        if not isinstance(event, dict) or "type" not in event:
            raise KubeUnavailable(f"the watch sent something that is not an event: {line[:100]!r}")
        if event["type"] == "ERROR":
            raise api_error(500, event.get("object"))
        yield event

