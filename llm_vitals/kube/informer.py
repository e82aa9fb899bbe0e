"""The one informer: list, then watch from the list's resourceVersion, resume, relist on 410 with backoff.

Pod discovery and the node watch both follow the API server through it, by the rules of client-go's
reflector (tools/cache/reflector.go):

- a list (from etcd: the newest state), then a watch from its `resourceVersion`, asking for
  BOOKMARK events: a bookmark moves the resourceVersion on without an object, so that a quiet
  watch resumes from a recent version instead of one the server may have compacted away;
- a watch the server ends (its `timeoutSeconds`, [5, 10) min), or whose connection breaks, is
  resumed at once from the last resourceVersion seen;
- 410 Gone (that version is compacted, or the API server restarted and its watch cache begins
  later) relists, after a jittered exponential backoff;
- a watch that cannot be opened because the API server is away or says 429 is retried from the
  same resourceVersion after a backoff of its own (client-go's `initConnBackoffManager`);
- any other failure (403, 5xx, a config that cannot be used) relists after the backoff;
- a watch that ends within a second with no event is retried as a failure is, so that a proxy that
  closes every watch at once is never a busy loop.

Nothing raises out of `run` but cancellation: every failure is kept as the informer's `health`
(up, and the last error as a `KubeError`), reported to its user on each change, and the objects
last seen stay meanwhile. `next_step` decides what to do after each outcome; it is pure and
table-tested (tests/test_kube_informer_rules.py), the loop around it only does the I/O.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from llm_vitals.logs import log_event

from .backoff import SHORT_WATCH_SECONDS, Backoff, next_wait, watch_seconds
from .client import KubeClient
from .errors import ApiError, KubeError, KubeUnavailable
from .objects import Query, list_objects, watch_objects

log = logging.getLogger("llm_vitals.kube")

T = TypeVar("T")


# -- the pure rules ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WatchEnded:
    """The server ended a watch (or its connection broke) after `seconds`, with `events` events (bookmarks too)."""

    seconds: float
    events: int


@dataclass(frozen=True)
class Failed:
    """A list or a watch failed: its HTTP status (a watch ERROR event's code), or None for no answer at all."""

    stage: str  # "list" | "watch"
    status: int | None = None
    unreachable: bool = False  # no answer: refused, reset, timed out (not a config error)


@dataclass(frozen=True)
class Step:
    """What to do next: wait this long, then list again (relist) or watch again from the last resourceVersion."""

    wait: float
    relist: bool
    failure: bool  # the outcome is a failure to report (health down), not a normal turn of the loop
    why: str  # resume | gone | short_watch | reconnect | failed


@dataclass(frozen=True)
class Backoffs:
    """The two backoffs of client-go's reflector: before a relist, and before re-opening a watch."""

    relist: Backoff = field(default_factory=Backoff)
    reconnect: Backoff = field(default_factory=Backoff)


def next_step(outcome: WatchEnded | Failed, backoffs: Backoffs, now: float, random: float) -> tuple[Step, Backoffs]:
    """After `outcome`: the next step and the backoffs after it (time and the random draw in [0, 1) given)."""
    if isinstance(outcome, WatchEnded):
        if outcome.events > 0 or outcome.seconds >= SHORT_WATCH_SECONDS:
            return Step(0.0, relist=False, failure=False, why="resume"), backoffs
        wait, relist = next_wait(backoffs.relist, now, random)
        return Step(wait, relist=True, failure=False, why="short_watch"), Backoffs(relist, backoffs.reconnect)
    if outcome.status == 410:
        wait, relist = next_wait(backoffs.relist, now, random)
        return Step(wait, relist=True, failure=False, why="gone"), Backoffs(relist, backoffs.reconnect)
    if outcome.stage == "watch" and (outcome.unreachable or outcome.status == 429):
        # The API server is away or busy: what we hold is still good, and the resourceVersion
        # either resumes or earns a 410 (and so a relist) once it answers again.
        wait, reconnect = next_wait(backoffs.reconnect, now, random)
        return Step(wait, relist=False, failure=True, why="reconnect"), Backoffs(backoffs.relist, reconnect)
    wait, relist = next_wait(backoffs.relist, now, random)
    return Step(wait, relist=True, failure=True, why="failed"), Backoffs(relist, backoffs.reconnect)


def outcome_of(stage: str, error: KubeError) -> Failed:
    """A KubeError as the plain data `next_step` reads."""
    return Failed(stage, error.status if isinstance(error, ApiError) else None, isinstance(error, KubeUnavailable))


# -- the loop ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Health:
    """Whether the last list or watch worked, and if not, why (a KubeError: its status and sentence)."""

    up: bool = False
    error: KubeError | None = None


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _version(obj: Mapping[str, Any]) -> str | None:
    version = (obj.get("metadata") or {}).get("resourceVersion")
    return str(version) if version else None


@dataclass
class Informer(Generic[T]):
    """Follows `query` on the API server, keeping `objects` (name -> `view(object)`) as last seen.

    `on_change(name)` is called after each event on one object, and `on_change(None)` after a list
    replaced them all; `on_health(health)` after each change of `health`. Both run on the loop and
    must not block. `clock`, `sleep` and `draw` are injected for tests.
    """

    kube: KubeClient
    query: Query
    view: Callable[[Mapping[str, Any]], T]
    on_change: Callable[[str | None], None]
    on_health: Callable[[Health], None] = lambda health: None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    draw: Callable[[], float] = random.random  # a uniform draw in [0, 1): the backoff's jitter
    watch_seconds: int | None = None  # None: [5, 10) min as client-go; tests ask for seconds

    objects: dict[str, T] = field(default_factory=dict)
    health: Health = field(default_factory=Health)
    resource_version: str | None = None
    synced: bool = False  # a list has succeeded
    relists: int = 0  # lists after the first
    bookmarks: int = 0
    steps: list[Step] = field(default_factory=list)  # the last few, newest last: what the loop did and why
    _backoffs: Backoffs = field(default_factory=Backoffs)

    async def run(self) -> None:
        """Until cancelled; never raises otherwise."""
        while True:
            outcome: WatchEnded | Failed
            error: KubeError | None = None
            if self.resource_version is None:
                stage = "list"
                try:
                    await self._list()
                    continue
                except KubeError as exc:
                    error, outcome = exc, outcome_of(stage, exc)
                except Exception as exc:  # a bug here must not end the informer for good
                    error, outcome = self._bug(exc), Failed(stage)
            else:
                stage = "watch"
                try:
                    outcome = await self._watch(self.resource_version)
                except KubeError as exc:
                    error, outcome = exc, outcome_of(stage, exc)
                except Exception as exc:
                    error, outcome = self._bug(exc), Failed(stage)
            step, self._backoffs = next_step(outcome, self._backoffs, self.clock(), self.draw())
            self.steps = [*self.steps[-19:], step]
            if step.failure and error is not None:
                self._set_health(Health(False, error))
            if step.why in ("gone", "short_watch"):
                log_event(log, "watch ended: relisting after a backoff", query=self.query.describe(), why=step.why,
                          wait=round(step.wait, 2), error=str(error) if error else None)
            if step.relist:
                self.resource_version = None
            if step.wait > 0:
                await self.sleep(step.wait)

    async def _list(self) -> None:
        listed = await list_objects(self.kube, self.query)
        self.objects = {_name(item): self.view(item) for item in listed.get("items") or []}
        self.relists += self.synced
        self.synced = True
        self.resource_version = _version(listed) or ""
        self.on_change(None)  # before the health: a user that re-applies on both sees the new objects each time
        self._set_health(Health(True))

    async def _watch(self, resource_version: str) -> WatchEnded:
        started, events = self.clock(), 0
        seconds = self.watch_seconds or watch_seconds(self.draw())
        async with watch_objects(self.kube, self.query, resource_version, seconds) as stream:
            self._set_health(Health(True))
            try:
                async for event in stream:
                    events += 1
                    self._apply(event)
            except KubeUnavailable:
                pass  # the connection broke: as an end of the watch, resumed from the last resourceVersion
        return WatchEnded(self.clock() - started, events)

    def _apply(self, event: Mapping[str, Any]) -> None:
        obj = event.get("object") or {}
        version = _version(obj)
        if version:
            self.resource_version = version
        kind = event.get("type")
        if kind == "BOOKMARK":
            self.bookmarks += 1
            return
        name = _name(obj)
        if kind == "DELETED":
            self.objects.pop(name, None)
        elif kind in ("ADDED", "MODIFIED"):
            self.objects[name] = self.view(obj)
        else:
            return
        self.on_change(name)

    def _bug(self, exc: Exception) -> KubeError:
        log.exception("the informer failed unexpectedly", extra={"fields": {"query": self.query.describe()}})
        return KubeError(f"following {self.query.describe()} failed: {type(exc).__name__}")

    def _set_health(self, health: Health) -> None:
        if health != self.health:
            self.health = health
            self.on_health(health)
