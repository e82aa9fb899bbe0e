"""The scripted story, its observer, and the checks that say whether each step went as told.

Four steps, looped (or run once with `--once`):

1. A batch job saturates backend-1: it is `busy` with a queue, and is never restarted.
2. backend-2 hangs with requests in flight: `stuck`, then exactly one restart.
3. backend-1 and backend-3 hang together: one is restarted at once; the other is refused with
   `cooldown` and restarted once the global cooldown has passed.
4. All three hang: no restart, the fleet gate refuses (`fleet_gate`): three stuck at once points
   at something shared. The demo then clears the hang itself, as the fix of the shared cause.

Each step starts once the previous restart's cooldown is over, so that what the gate says is about
the step, not about its predecessor. Outcomes are read back from the remediator's own journal
(`GET /api/v1/actions`), never assumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import re
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import aiohttp

from llm_vitals.demo.configs import backend_name
from llm_vitals.demo.load import HeldRequest, Load
from llm_vitals.demo.ports import BACKENDS
from llm_vitals.demo.timings import Timings
from llm_vitals.targets import RESTARTABLE_STATES

HEALTHY = frozenset({"idle", "busy"})
_TIMEOUT = aiohttp.ClientTimeout(total=3)
# The status page's decisions panel (llm_vitals/exporter/status_page.py): a row per decision, and a
# note when the exporter cannot read the remediator (a wrong token reads as 401 there).
_DECISION_ROW = re.compile(r'<tr class="decision ')
_REMEDIATOR_NOTE = re.compile(r'<p class="note" id="remediator-note">(.*?)</p>', re.S)


def decisions_panel(page: str) -> dict[str, Any]:
    """What the status page shows of the remediator: how many decision rows, and its note (None when it reads fine)."""
    note = _REMEDIATOR_NOTE.search(page)
    return {"decisions": len(_DECISION_ROW.findall(page)), "note": html.unescape(note.group(1)) if note else None}


class StepTimeout(Exception):
    """A step did not reach its outcome within the step timeout."""


class Observer:
    """Polls the exporter's targets and the remediator's journal; keeps the latest of each."""

    def __init__(self, session: aiohttp.ClientSession, exporter_url: str, remediator_url: str | None,
                 on_event: Callable[[str], None], remediator_token: str | None = None) -> None:
        self.session = session
        self.exporter_url = exporter_url
        self.remediator_url = remediator_url
        # The remediator's journal takes the webhook's auth.
        self.remediator_auth = {"Authorization": f"Bearer {remediator_token}"} if remediator_token else {}
        self.on_event = on_event
        self.targets: dict[str, dict[str, Any]] = {}
        self.actions: list[dict[str, Any]] = []  # every action seen since the demo started, oldest first
        self.last_action_id = 0
        self._states: dict[str, str] = {}

    async def refresh(self) -> None:
        try:
            async with self.session.get(f"{self.exporter_url}/api/v1/targets", timeout=_TIMEOUT) as r:
                self.targets = {t["name"]: t for t in (await r.json())["targets"]}
        except (TimeoutError, aiohttp.ClientError, ValueError, KeyError):
            pass  # keep the last reading: the next refresh is half a poll away
        for name, target in self.targets.items():
            previous = self._states.get(name)
            # idle <-> busy is traffic coming and going: not worth a line.
            if previous is not None and previous != target["state"] and {previous, target["state"]} - HEALTHY:
                self.on_event(f"{name}: {previous} -> {target['state']} ({target['reason']})")
            self._states[name] = target["state"]
        if self.remediator_url is None:  # servers of your own watched with no remediator configured
            return
        try:
            async with self.session.get(f"{self.remediator_url}/api/v1/actions", params={"limit": "100"},
                                        headers=self.remediator_auth, timeout=_TIMEOUT) as r:
                newest_first = (await r.json())["actions"]
        except (TimeoutError, aiohttp.ClientError, ValueError, KeyError):
            return
        fresh = sorted((a for a in newest_first if a["id"] > self.last_action_id), key=lambda a: a["id"])
        for action in fresh:
            self.actions.append(action)
            self.last_action_id = action["id"]
            self.on_event(describe_action(action))
        # A restart's result arrives after its decision: update the rows already seen.
        by_id = {a["id"]: a for a in newest_first}
        for i, action in enumerate(self.actions[-100:], start=max(0, len(self.actions) - 100)):
            if action["id"] in by_id:
                self.actions[i] = by_id[action["id"]]

    async def status_page(self) -> dict[str, Any]:
        """The exporter's status page, read as a person's browser reads it: its decisions panel."""
        try:
            async with self.session.get(f"{self.exporter_url}/", timeout=_TIMEOUT) as r:
                return decisions_panel(await r.text())
        except (TimeoutError, aiohttp.ClientError) as exc:
            return {"decisions": 0, "note": f"the status page did not answer: {exc!r}"}

    async def run(self, interval: float) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(interval)

    def last_decision(self, target: str) -> dict[str, Any] | None:
        for action in reversed(self.actions):
            if action.get("target") == target and action.get("decision") != "resolved":
                return action
        return None

    def restarts_of(self, target: str) -> int:
        return sum(1 for a in self.actions if a.get("target") == target and a.get("decision") == "restart")

    def state(self, target: str) -> str | None:
        return self.targets.get(target, {}).get("state")


def describe_action(action: dict[str, Any]) -> str:
    decision = action.get("decision")
    if decision == "restart":
        text = f"{action.get('target')}: RESTART via {action.get('executor')} ({action.get('result') or 'pending'})"
    elif decision == "resolved":
        text = f"{action.get('target')}: {action.get('alertname')} resolved"
    else:
        text = f"{action.get('target')}: {decision} {action.get('reason')}"
        if action.get("detail"):
            text += f" ({action['detail']})"
    return text


@dataclass
class StepResult:
    name: str
    title: str
    started_at: float
    ended_at: float | None = None
    first_action: int = 0  # actions with an id above this belong to the step
    last_action: int | None = None
    checks: list[tuple[str, bool]] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and all(passed for _, passed in self.checks)

    def check(self, text: str, passed: bool) -> None:
        self.checks.append((text, passed))

    def actions(self, observer: Observer) -> list[dict[str, Any]]:
        last = self.last_action if self.last_action is not None else observer.last_action_id
        return [a for a in observer.actions if self.first_action < a["id"] <= last]

    def summary(self, observer: Observer) -> dict[str, Any]:
        actions = self.actions(observer)
        return {
            "name": self.name, "title": self.title, "ok": self.ok, "error": self.error,
            "started_at": round(self.started_at, 3), "ended_at": round(self.ended_at or time.time(), 3),
            "first_action_id": self.first_action, "last_action_id": self.last_action,
            "seconds": round((self.ended_at or time.time()) - self.started_at, 1),
            "restarts": dict(Counter(a["target"] for a in actions if a["decision"] == "restart")),
            "refusals": dict(Counter(a["reason"] for a in actions if a["decision"] == "refused")),
            "decisions": [{k: a.get(k) for k in ("time", "target", "alertname", "decision", "reason", "result")}
                          for a in actions],
            "checks": [{"check": text, "ok": passed} for text, passed in self.checks],
        }


@dataclass
class Status:
    """What the terminal shows about the story right now."""

    loop: int = 0
    step: str = "starting"
    detail: str = ""
    events: deque[tuple[float, str]] = field(default_factory=lambda: deque(maxlen=8))


@dataclass(eq=False)
class Story:
    """Runs the steps against the running demo processes."""

    session: aiohttp.ClientSession
    observer: Observer
    timings: Timings
    control_url: str
    proxy_url: str
    backend_urls: list[str]
    status: Status
    background: list[Load] = field(init=False)
    batch: Load = field(init=False)
    held: list[HeldRequest] = field(init=False, default_factory=list)  # open across a hang (hang())

    def __post_init__(self) -> None:
        # Two clients pinned to each backend keep work in flight on every one of them, so that a hang
        # is "work pending, no progress" (stuck) at once; three more go through the proxy.
        self.background = [Load(self.session, url, workers=2, max_tokens=48) for url in self.backend_urls]
        self.background.append(Load(self.session, self.proxy_url, workers=3, max_tokens=48))
        self.batch = Load(self.session, self.backend_urls[0], workers=16, max_tokens=64)

    # -- plumbing ---------------------------------------------------------------------------

    async def fault(self, index: int, fault: str) -> None:
        """Set a fault through the simulator's control server; retried, since a step depends on it."""
        for _ in range(5):
            with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                async with self.session.post(f"{self.control_url}/backends/{index}/fault", json={"fault": fault},
                                             timeout=aiohttp.ClientTimeout(total=10)) as response:
                    await response.read()
                    if response.status in (200, 409):  # 409: restarting/loading, no fault to set or clear
                        break
            await asyncio.sleep(0.5)  # after an error answer too: five tries, not five at once
        if fault != "none":
            self.observer.on_event(f"story: {fault} {backend_name(index)}")

    async def hang(self, *indices: int) -> None:
        """Hang these backends, each with a long request surely in flight (load.HeldRequest says why)."""
        held = [HeldRequest(self.session, self.backend_urls[i]) for i in indices]
        self.held.extend(held)
        opened = await asyncio.gather(*(request.open(self.timings.step_timeout / 4) for request in held))
        if not all(opened):
            names = ", ".join(backend_name(i) for i, ok in zip(indices, opened, strict=True) if not ok)
            raise StepTimeout(f"no request could be held open on {names} before the hang")
        await asyncio.gather(*(self.fault(i, "hang") for i in indices))

    async def close_held(self) -> None:
        held, self.held = self.held, []
        await asyncio.gather(*(request.close() for request in held))

    async def clear_faults(self) -> None:
        await asyncio.gather(*(self.fault(i, "none") for i in range(BACKENDS)))
        await self.close_held()
        self.observer.on_event("story: hang cleared on every backend")

    async def until(self, what: str, predicate: Callable[[], bool], timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout if timeout is not None else self.timings.step_timeout)
        while not predicate():
            if time.monotonic() > deadline:
                raise StepTimeout(f"timed out waiting for {what}")
            await asyncio.sleep(0.2)

    def step_actions(self, result: StepResult) -> list[dict[str, Any]]:
        return result.actions(self.observer)

    def restarts(self, result: StepResult, target: str | None = None) -> list[dict[str, Any]]:
        return [a for a in self.step_actions(result) if a["decision"] == "restart"
                and (target is None or a["target"] == target)]

    async def wait_out_cooldown(self) -> None:
        """Start a step only once the last restart's global cooldown is over (plus a poll)."""
        restarts = [a["time"] for a in self.observer.actions if a.get("decision") == "restart"]
        if not restarts:
            return
        ready_at = max(restarts) + self.timings.cooldown + self.timings.poll_interval
        while (left := ready_at - time.time()) > 0:
            self.status.detail = f"waiting {left:.0f}s for the global cooldown of the last restart to pass"
            await asyncio.sleep(min(left, 0.5))

    async def healthy(self, names: list[str], newer_than: float) -> None:
        """Wait until the exporter reads each name as idle/busy in a poll after `newer_than`."""
        def ok() -> bool:
            for name in names:
                target = self.observer.targets.get(name, {})
                if target.get("state") not in HEALTHY or (target.get("last_poll") or 0) <= newer_than:
                    return False
            return True
        await self.until(f"{', '.join(names)} to be idle or busy again", ok)

    # -- the steps --------------------------------------------------------------------------

    async def step_batch(self, result: StepResult) -> None:
        b1 = backend_name(0)
        self.batch.start()
        seen_stuck = False
        try:
            self.status.detail = "16 clients on backend-1 (4 slots): a queue builds"
            await self.until("backend-1 busy with a queue",
                             lambda: self.observer.state(b1) == "busy" and (self.observer.targets[b1].get("waiting") or 0) > 0)
            deepest = 0
            end = time.monotonic() + self.timings.batch_seconds
            while (left := end - time.monotonic()) > 0:
                target = self.observer.targets.get(b1, {})
                deepest = max(deepest, int(target.get("waiting") or 0))
                seen_stuck |= target.get("state") in RESTARTABLE_STATES
                self.status.detail = (f"backend-1 {target.get('state')}, {target.get('waiting')} waiting: load, "
                                      f"not a fault ({left:.0f}s left)")
                await asyncio.sleep(0.25)
        finally:
            await self.batch.stop()
        result.check(f"backend-1 was busy with up to {deepest} requests waiting, and never stuck", deepest > 0 and not seen_stuck)
        result.check("backend-1 was not restarted", not self.restarts(result, b1))

    async def step_hang_one(self, result: StepResult) -> None:
        b2 = backend_name(1)
        await self.hang(1)
        self.status.detail = f"backend-2's engine stopped stepping; stuck after {self.timings.stuck_after:g}s without progress"
        await self.until("a restart of backend-2", lambda: bool(self.restarts(result, b2)))
        self.status.detail = "backend-2 restarted; waiting for it to serve again"
        restarted_at = time.time()
        await self.healthy([b2], restarted_at)
        result.check("backend-2 was restarted exactly once", len(self.restarts(result, b2)) == 1)
        result.check("no other backend was restarted", len(self.restarts(result)) == 1)

    async def step_hang_pair(self, result: StepResult) -> None:
        b1, b3 = backend_name(0), backend_name(2)
        await self.hang(0, 2)
        self.status.detail = "backend-1 and backend-3 hung together: one restart now, the other after the cooldown"
        await self.until("a first restart", lambda: len(self.restarts(result)) >= 1)
        first = self.restarts(result)[0]
        other = b3 if first["target"] == b1 else b1
        while not self.restarts(result, other):
            left = first["time"] + self.timings.cooldown - time.time()
            self.status.detail = (f"{first['target']} restarted; {other} waits out the global cooldown"
                                  + (f" ({left:.0f}s left)" if left > 0 else " (over: next alert re-send restarts it)"))
            if time.time() > first["time"] + self.timings.cooldown + self.timings.step_timeout:
                raise StepTimeout(f"timed out waiting for the restart of {other}")
            await asyncio.sleep(0.25)
        second = self.restarts(result, other)[0]
        self.status.detail = f"{other} restarted too; waiting for both to serve again"
        await self.healthy([b1, b3], second["time"])
        refused = [a for a in self.step_actions(result)
                   if a["target"] == other and a["decision"] == "refused" and a["reason"] in ("cooldown", "restart_in_progress")
                   and a["time"] < second["time"]]
        result.check(f"{first['target']} restarted once, then {other} once", len(self.restarts(result, b1)) == 1
                     and len(self.restarts(result, b3)) == 1 and len(self.restarts(result)) == 2)
        result.check(f"{other} was refused (cooldown) before its restart", bool(refused))
        gap = second["time"] - first["time"]
        result.check(f"the two restarts are {gap:.0f}s apart (cooldown {self.timings.cooldown:g}s)", gap >= self.timings.cooldown - 0.5)

    async def step_hang_all(self, result: StepResult) -> None:
        await self.hang(*range(BACKENDS))
        self.status.detail = "all three hung: the fleet gate should refuse (max_unhealthy 2)"

        def gate_refusals() -> list[dict[str, Any]]:
            return [a for a in self.step_actions(result) if a["decision"] == "refused" and a["reason"] == "fleet_gate"]

        try:
            await self.until("a fleet_gate refusal", lambda: bool(gate_refusals()))
            end = time.monotonic() + self.timings.hold_seconds
            while (left := end - time.monotonic()) > 0:
                self.status.detail = (f"fleet gate holding: 3 of 3 unhealthy, nothing restarted "
                                      f"({left:.0f}s, then the shared cause is 'fixed')")
                await asyncio.sleep(0.25)
        finally:
            cleared_at = time.time()
            await self.clear_faults()
        self.status.detail = "hang cleared on all three; waiting for progress"
        await self.healthy([backend_name(i) for i in range(BACKENDS)], cleared_at)
        result.check(f"the fleet gate refused {len(gate_refusals())} time(s)", bool(gate_refusals()))
        result.check("nothing was restarted", not self.restarts(result))

    STEPS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("batch", "A batch job saturates backend-1 (busy, never restarted)", "step_batch"),
        ("hang-one", "backend-2 hangs (stuck, one restart)", "step_hang_one"),
        ("hang-pair", "backend-1 and backend-3 hang together (one restart, the other waits out the cooldown)",
         "step_hang_pair"),
        ("hang-all", "All three hang (no restart: the fleet gate suspects a wider fault)", "step_hang_all"),
    )

    async def run_once(self, on_step: Callable[[StepResult], Awaitable[None]] | None = None) -> list[StepResult]:
        """One pass through the four steps; a step that times out is recorded and the story goes on."""
        self.status.loop += 1
        results = []
        for number, (name, title, method) in enumerate(self.STEPS, start=1):
            self.status.step = f"step {number}/{len(self.STEPS)}: {title}"
            self.status.detail = ""
            await self.wait_out_cooldown()
            await self.observer.refresh()
            result = StepResult(name, title, time.time(), first_action=self.observer.last_action_id)
            try:
                await getattr(self, method)(result)
            except StepTimeout as exc:
                result.error = str(exc)
                await self.clear_faults()
            # Decisions for this step may still be in flight (an alert re-sent once more).
            await asyncio.sleep(self.timings.poll_interval)
            await self.observer.refresh()
            result.last_action = self.observer.last_action_id
            result.ended_at = time.time()
            results.append(result)
            if on_step:
                await on_step(result)
        return results

    async def stop_load(self) -> None:
        await self.close_held()
        for load in (*self.background, self.batch):
            await load.stop()

    async def warm_up(self) -> None:
        """Traffic on, and every backend seen serving before the first step."""
        self.status.step = "warming up"
        self.status.detail = "2 clients on each backend, 3 through the proxy; waiting for the exporter's first verdicts"
        for load in self.background:
            load.start()
        await self.until("all three backends idle or busy",
                         lambda: all(self.observer.state(backend_name(i)) in HEALTHY for i in range(BACKENDS)),
                         timeout=60)
