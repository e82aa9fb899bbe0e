"""The seed incident, replayed in compressed time: naive watchdogs against llm-vitals on the same day.

A 2-slot vLLM server (the simulator's pure `Engine`) serves a batch job that, over a day, keeps 2-4
long requests busy for tens of minutes at a time. Near the end its engine truly hangs. The day is
played twice from the same seeded schedule, on a virtual clock (no sleeping, no sockets), so a
simulated day takes seconds and every run prints the same table:

- **baseline**: the watchdogs of the incident. One sends a real chat request every 5 min with a
  45 s timeout and restarts after 5 failures in a row; a second restarts the server when it counts
  3 HTTP 500s within 10 min (checked every minute). Both watch the same server.
- **llm-vitals**: the exporter's own pure functions (`exporter.verdict.judge`/`record_canary` on a
  snapshot of the engine's counters every 5 s, and the canary rule `canary_due`), the
  LLMServerStuck/Unresponsive rules (`for: 1m`, evaluated every 15 s by `demo.alert_rule.evaluate`,
  as the demo's relay does) and the remediator's own gate (`remediator.gate.decide`, its effects
  applied by `remediator.shared.with_effects`, production defaults: 15 min cooldown, budget 3/h).
  No I/O object is built.

A restart fails every request in flight with a 500 and the server reloads its weights for
`load_seconds`; requests meanwhile are refused (the batch job retries after 30 s).

    .venv/bin/python bench/incident_replay.py [--hours 24] [--seed 7] [--hang-at HOURS]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from llm_vitals.demo.alert_rule import ALERT_FOR_STATE, RuleState, evaluate  # noqa: E402
from llm_vitals.exporter.engines import PageReading  # noqa: E402
from llm_vitals.exporter.settings import TargetSettings  # noqa: E402
from llm_vitals.exporter.verdict import CanaryOutcome, PollError, Verdict, canary_due, initial, judge, record_canary  # noqa: E402
from llm_vitals.remediator import gate, shared  # noqa: E402
from llm_vitals.sim.config import SimConfig  # noqa: E402
from llm_vitals.sim.engine import Engine, SimRequest  # noqa: E402

TARGET = "gpu-a"


# ---------------------------------------------------------------------------------------------
# Configuration and the shared schedule
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Episode:
    """The batch job runs from `start` to `end` (seconds), keeping `concurrency` requests outstanding."""

    start: float
    end: float
    concurrency: int


@dataclass(frozen=True)
class ReplayConfig:
    hours: float = 24.0
    seed: int = 7
    hang_at_hours: float | None = None  # default: 1.5 h before the end
    # True: the batch job is running when the engine hangs (-> stuck). False: the server is idle
    # then, and only the canary can tell (-> unresponsive).
    busy_at_hang: bool = True
    # The server. A slow virtual decode (4 tokens/s: one engine step per 0.25 s) keeps a day cheap
    # to simulate; what matters is that a batch request holds its slot for minutes, as in the incident.
    slots: int = 2
    tokens_per_second: float = 4.0
    load_seconds: float = 180.0  # a restart reloads ~20 GB of weights
    # The batch job.
    episode_minutes: tuple[float, float] = (15.0, 60.0)
    gap_minutes: tuple[float, float] = (40.0, 150.0)
    batch_prompt_tokens: tuple[int, int] = (200, 1000)
    batch_max_tokens: tuple[int, int] = (240, 720)  # 1-3 min each at 4 tokens/s
    batch_retry_seconds: float = 30.0
    # Baseline watchdog 1: a real chat request.
    chat_interval: float = 300.0
    chat_timeout: float = 45.0
    chat_failures_to_restart: int = 5
    chat_prompt_tokens: int = 24
    chat_max_tokens: int = 16
    # Baseline watchdog 2: counts 500s.
    errors_threshold: int = 3
    errors_window: float = 600.0
    errors_check_interval: float = 60.0
    # llm-vitals: exporter defaults (poll 5 s, stuck_after 60 s, canary every 30 s with a 10 s
    # timeout), Prometheus evaluating every 15 s, the shipped `for: 1m`, Alertmanager's 1 h repeat.
    poll_interval: float = 5.0
    stuck_after: float = 60.0
    canary_interval: float = 30.0
    canary_timeout: float = 10.0
    eval_interval: float = 15.0
    alert_for: float = 60.0
    repeat_interval: float = 3600.0
    global_cooldown: float = 900.0

    @property
    def duration(self) -> float:
        return self.hours * 3600.0

    @property
    def hang_at(self) -> float:
        return (self.hours - 1.5 if self.hang_at_hours is None else self.hang_at_hours) * 3600.0


def batch_schedule(config: ReplayConfig) -> list[Episode]:
    """Episodes of 2-4 outstanding requests over the day, and (busy_at_hang) one running through the hang."""
    rng = random.Random(config.seed)
    episodes: list[Episode] = []
    last_start = config.hang_at - 20 * 60  # the final episode: busy when the engine hangs
    t = 20 * 60.0
    while True:
        length = rng.uniform(*config.episode_minutes) * 60
        if t + length > last_start - 10 * 60:
            break
        episodes.append(Episode(t, t + length, rng.choice((2, 3, 4))))
        t += length + rng.uniform(*config.gap_minutes) * 60
    if config.busy_at_hang:
        episodes.append(Episode(last_start, config.duration, 2))
    return episodes


# ---------------------------------------------------------------------------------------------
# The virtual clock and the server
# ---------------------------------------------------------------------------------------------


class Clock:
    """A discrete-event loop: callbacks at virtual times, FIFO among equal times."""

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def at(self, when: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (max(when, self.now), next(self._seq), callback))

    def every(self, interval: float, callback: Callable[[], None], first: float | None = None) -> None:
        def tick() -> None:
            callback()
            self.at(self.now + interval, tick)

        self.at(interval if first is None else first, tick)

    def run_until(self, end: float) -> None:
        while self._queue and self._queue[0][0] <= end:
            self.now, _, callback = heapq.heappop(self._queue)
            callback()
        self.now = end


Done = Callable[[str], None]  # called with "ok", "500" (failed by a restart) or "refused" (not listening)


@dataclass
class Restart:
    time: float
    by: str
    killed: int  # requests in flight that got a 500
    server_hung: bool


class Server:
    """One vLLM server across its lifetimes: the engine stepped on the virtual clock, hang, restart."""

    def __init__(self, clock: Clock, config: ReplayConfig) -> None:
        self.clock = clock
        self.config = config
        self.sim = SimConfig(max_num_seqs=config.slots, tokens_per_second=config.tokens_per_second)
        self.engine: Engine | None = Engine(self.sim)
        self.start_time = 0.0
        self.hung = False
        self.lifetime = 0  # bumps on every restart: stale step/loading events are ignored
        self.stepping = False
        self.waiters: dict[str, Done] = {}  # requests inside the engine
        self.held: dict[str, Done] = {}  # requests a hung engine never took in
        self.restarts: list[Restart] = []
        self.errors_500: list[float] = []  # times clients got a 500: what watchdog 2 counts
        self._ids = itertools.count()

    # -- what the clients do ---------------------------------------------------------------------
    @property
    def serving(self) -> bool:
        return self.engine is not None

    @property
    def in_flight(self) -> int:
        if self.engine is None:
            return 0
        return self.engine.num_running + self.engine.num_waiting + len(self.held)

    @property
    def busy(self) -> bool:
        return self.in_flight > 0

    def submit(self, prompt_tokens: int, max_tokens: int, done: Done) -> str:
        request_id = f"r{next(self._ids)}"
        if self.engine is None:
            self.clock.at(self.clock.now, lambda: done("refused"))
        elif self.hung:
            self.held[request_id] = done
        else:
            self.engine.add_request(SimRequest(request_id, prompt_tokens, max_tokens), self.clock.now)
            self.waiters[request_id] = done
            self._kick()
        return request_id

    def abort(self, request_id: str) -> None:
        """The client went away (its timeout): vLLM aborts the request."""
        self.held.pop(request_id, None)
        if self.waiters.pop(request_id, None) is not None and self.engine is not None:
            self.engine.abort(request_id, self.clock.now)

    # -- the engine ------------------------------------------------------------------------------
    def _kick(self) -> None:
        if not self.stepping and not self.hung and self.engine is not None and self.engine.has_work:
            self.stepping = True
            lifetime = self.lifetime
            self.clock.at(self.clock.now, lambda: self._step(lifetime))

    def _step(self, lifetime: int) -> None:
        self.stepping = False
        if lifetime != self.lifetime or self.hung or self.engine is None or not self.engine.has_work:
            return
        out = self.engine.step(self.clock.now)
        for request in out.finished:
            done = self.waiters.pop(request.request_id, None)
            if done is not None:
                self.clock.at(self.clock.now, lambda done=done: done("ok"))
        if self.engine.has_work:
            self.stepping = True
            self.clock.at(self.clock.now + max(out.cost_seconds, 1e-3), lambda: self._step(lifetime))

    def hang(self) -> None:
        self.hung = True

    def restart(self, by: str) -> None:
        """Kill the process: everything in flight gets a 500; refused while the weights load."""
        now = self.clock.now
        victims = list(self.waiters.values()) + list(self.held.values())
        self.restarts.append(Restart(now, by, len(victims), self.hung))
        self.waiters.clear()
        self.held.clear()
        for done in victims:
            self.errors_500.append(now)
            self.clock.at(now, lambda done=done: done("500"))
        self.engine = None
        self.hung = False
        self.stepping = False
        self.lifetime += 1
        lifetime = self.lifetime
        self.start_time = now  # the new process starts as the loading begins (process_start_time)
        self.clock.at(now + self.config.load_seconds, lambda: self._loaded(lifetime))

    def _loaded(self, lifetime: int) -> None:
        if lifetime == self.lifetime:
            self.engine = Engine(self.sim)

    # -- what the exporter reads -----------------------------------------------------------------
    def observe(self) -> PageReading | PollError:
        """One `/metrics` read, reduced to the exporter's snapshot (the vLLM adapter's fields)."""
        if self.engine is None:
            return PollError("connect", "connection refused (loading)")
        engine, stats = self.engine, self.engine.stats
        return PageReading(
            running=engine.num_running, waiting=engine.num_waiting, steps=stats.iteration_steps,
            generation_tokens=stats.generation_tokens, prompt_tokens=stats.prompt_tokens,
            finished=stats.finished, kv_usage=engine.kv_cache_usage, process_start_time=self.start_time,
        )


# ---------------------------------------------------------------------------------------------
# The batch job (the same in both worlds)
# ---------------------------------------------------------------------------------------------


class BatchJob:
    """Keeps `concurrency` long requests outstanding during each episode; retries failures after 30 s."""

    def __init__(self, clock: Clock, server: Server, config: ReplayConfig, episodes: list[Episode]) -> None:
        self.clock, self.server, self.config = clock, server, config
        self.rng = random.Random(config.seed + 1)
        self.completed = 0
        self.failed = 0
        self.episode: Episode | None = None
        for episode in episodes:
            clock.at(episode.start, lambda e=episode: self._begin(e))

    def _begin(self, episode: Episode) -> None:
        self.episode = episode
        for _ in range(episode.concurrency):
            self._send()

    def _active(self) -> bool:
        return self.episode is not None and self.clock.now < self.episode.end

    def _send(self) -> None:
        if not self._active():
            return
        prompt = self.rng.randint(*self.config.batch_prompt_tokens)
        tokens = self.rng.randint(*self.config.batch_max_tokens)
        self.server.submit(prompt, tokens, self._done)

    def _done(self, result: str) -> None:
        if result == "ok":
            self.completed += 1
            self._send()
        else:
            self.failed += 1
            self.clock.at(self.clock.now + self.config.batch_retry_seconds, self._send)


# ---------------------------------------------------------------------------------------------
# Baseline: the incident's two watchdogs
# ---------------------------------------------------------------------------------------------


@dataclass
class ProbeCount:
    sent: int = 0
    sent_to_busy: int = 0
    failed: int = 0


class ChatWatchdog:
    """A real chat request every 5 min, 45 s timeout; 5 failures in a row -> restart."""

    def __init__(self, clock: Clock, server: Server, config: ReplayConfig) -> None:
        self.clock, self.server, self.config = clock, server, config
        self.failures = 0
        self.pending: str | None = None
        self.count = ProbeCount()
        clock.every(config.chat_interval, self._check)

    def _check(self) -> None:
        self.count.sent += 1
        self.count.sent_to_busy += self.server.busy
        request_id = self.server.submit(self.config.chat_prompt_tokens, self.config.chat_max_tokens, self._done)
        self.pending = request_id
        self.clock.at(self.clock.now + self.config.chat_timeout, lambda: self._timeout(request_id))

    def _done(self, result: str) -> None:
        self.pending = None
        if result == "ok":
            self.failures = 0
        else:
            self._failed()

    def _timeout(self, request_id: str) -> None:
        if self.pending == request_id:
            self.pending = None
            self.server.abort(request_id)
            self._failed()

    def _failed(self) -> None:
        self.count.failed += 1
        self.failures += 1
        if self.failures >= self.config.chat_failures_to_restart:
            self.failures = 0
            self.server.restart("chat watchdog")


class ErrorWatchdog:
    """Restarts on 3 HTTP 500s within 10 min, checked every minute (and forgets what it acted on)."""

    def __init__(self, clock: Clock, server: Server, config: ReplayConfig) -> None:
        self.clock, self.server, self.config = clock, server, config
        self.acted_at = 0.0
        clock.every(config.errors_check_interval, self._check)

    def _check(self) -> None:
        since = max(self.clock.now - self.config.errors_window, self.acted_at)
        recent = sum(1 for t in self.server.errors_500 if t > since)
        if recent >= self.config.errors_threshold:
            self.acted_at = self.clock.now
            self.server.restart("500s watchdog")


# ---------------------------------------------------------------------------------------------
# llm-vitals: the exporter's verdict and canary rule, the alert rules, the remediator's gate
# ---------------------------------------------------------------------------------------------


class Vitals:
    """The exporter, Prometheus + Alertmanager, and the remediator, on the virtual clock: pure functions only."""

    # The two rules labelled remediation="restart", by the verdict state they alert on.
    RULES = ALERT_FOR_STATE

    def __init__(self, clock: Clock, server: Server, config: ReplayConfig) -> None:
        self.clock, self.server, self.config = clock, server, config
        self.target = TargetSettings.model_validate({
            "name": TARGET, "url": "http://127.0.0.1:8000", "stuck_after": config.stuck_after,
            "canary": {"interval": config.canary_interval, "timeout": config.canary_timeout},
        })
        self.verdict: Verdict = initial(0.0)
        self.last_canary_sent: float | None = None
        self.canary_in_flight = False
        self.count = ProbeCount()
        self.states: list[tuple[float, str]] = []  # (time, state) at each change
        self.rule = RuleState()  # the target's restartable alert, as Prometheus + Alertmanager hold it
        self.decisions: list[tuple[float, str, str]] = []  # (time, alertname, reason)
        self.policy = gate.GatePolicy(
            targets=frozenset({TARGET}), global_cooldown=config.global_cooldown, max_restarts=3,
            budget_window=3600.0, max_unhealthy=1,
        )
        self.journal = gate.JournalState()
        clock.every(config.poll_interval, self._poll)
        clock.every(config.eval_interval, self._evaluate)

    # -- exporter --------------------------------------------------------------------------------
    def _poll(self) -> None:
        now = self.clock.now
        observation = self.server.observe()
        self.verdict = judge(self.verdict, observation, now, self.target)
        if not self.states or self.states[-1][1] != self.verdict.state:
            self.states.append((now, self.verdict.state))
        if canary_due(self.verdict, observation, self.last_canary_sent, now, self.target,
                      poll_interval=self.config.poll_interval, in_flight=self.canary_in_flight):
            self._canary()

    def _canary(self) -> None:
        self.last_canary_sent = self.clock.now
        self.canary_in_flight = True
        self.count.sent += 1
        self.count.sent_to_busy += self.server.busy
        outcome: dict[str, str] = {}

        def finish(result: Literal["ok", "error", "timeout"], detail: str = "") -> None:
            if outcome:
                return
            outcome["result"] = result
            self.canary_in_flight = False
            self.count.failed += result != "ok"
            self.verdict = record_canary(self.verdict, CanaryOutcome(result, detail), self.clock.now, self.target)

        request_id = self.server.submit(1, 1, lambda r: finish("ok" if r == "ok" else "error", r))

        def timed_out() -> None:
            if not outcome:
                self.server.abort(request_id)
                finish("timeout")

        self.clock.at(self.clock.now + self.config.canary_timeout, timed_out)

    # -- Prometheus rules + Alertmanager ---------------------------------------------------------
    def _evaluate(self) -> None:
        self.rule, sent = evaluate(self.rule, self.verdict.state, self.clock.now, self.config.alert_for,
                                   self.config.repeat_interval)
        for notification in sent:
            if notification.status == "firing":  # a resolved alert is `not_firing` to the gate: nothing to replay
                self._webhook(notification.alertname, starts_at=notification.starts_at)

    # -- remediator ------------------------------------------------------------------------------
    def _webhook(self, alertname: str, starts_at: float) -> None:
        now, verdict = self.clock.now, self.verdict
        alert = gate.AlertFacts(
            status="firing", labels={"alertname": alertname, "target": TARGET, "remediation": "restart"},
            fingerprint=f"{alertname}:{TARGET}", starts_at=starts_at,
        )
        fleet = gate.FleetView({TARGET: gate.TargetStatus(
            state=verdict.state, process_start_time=verdict.process_start_time,
            last_restart_time=verdict.last_restart_at)})
        decision = gate.decide(alert, fleet, self.journal, self.policy, now)
        self.decisions.append((now, alertname, decision.reason))
        effects = gate.effects_of(decision, alert, fleet, self.journal, self.policy, now)
        intent = shared.Intent("replay", TARGET, now + self.config.load_seconds) if effects.intent else None
        self.journal = shared.with_effects(self.journal, effects, alert, now, intent)
        if decision.allowed:
            self.server.restart(f"llm-vitals ({alertname})")
            # The restart is instant on the virtual clock; the server then loads its weights.
            self.journal = shared.finished(self.journal, "replay")


# ---------------------------------------------------------------------------------------------
# Running and reporting
# ---------------------------------------------------------------------------------------------


@dataclass
class WorldResult:
    name: str
    restarts: list[Restart]
    probes: ProbeCount
    batch_completed: int
    batch_failed: int
    hang_restart_latency: float | None  # hang -> first restart after it
    hang_detect_latency: float | None = None  # hang -> first `stuck`/`unresponsive` verdict (llm-vitals)
    decisions: list[tuple[float, str, str]] = field(default_factory=list)

    def restarts_before(self, t: float) -> int:
        return sum(1 for r in self.restarts if r.time < t)

    def restarts_from(self, t: float) -> int:
        return sum(1 for r in self.restarts if r.time >= t)

    @property
    def errors_from_restarts(self) -> int:
        return sum(r.killed for r in self.restarts)


@dataclass
class ReplayResult:
    config: ReplayConfig
    episodes: list[Episode]
    baseline: WorldResult
    vitals: WorldResult
    wall_seconds: float


def _first_after(times: list[float], t: float) -> float | None:
    later = [x for x in times if x >= t]
    return min(later) - t if later else None


def run_baseline(config: ReplayConfig, episodes: list[Episode]) -> WorldResult:
    clock = Clock()
    server = Server(clock, config)
    batch = BatchJob(clock, server, config, episodes)
    chat = ChatWatchdog(clock, server, config)
    ErrorWatchdog(clock, server, config)
    clock.at(config.hang_at, server.hang)
    clock.run_until(config.duration)
    return WorldResult(
        "baseline", server.restarts, chat.count, batch.completed, batch.failed,
        _first_after([r.time for r in server.restarts], config.hang_at),
    )


def run_vitals(config: ReplayConfig, episodes: list[Episode]) -> WorldResult:
    clock = Clock()
    server = Server(clock, config)
    batch = BatchJob(clock, server, config, episodes)
    vitals = Vitals(clock, server, config)
    clock.at(config.hang_at, server.hang)
    clock.run_until(config.duration)
    detected = [t for t, state in vitals.states if state in Vitals.RULES]
    return WorldResult(
        "llm-vitals", server.restarts, vitals.count, batch.completed, batch.failed,
        _first_after([r.time for r in server.restarts], config.hang_at),
        _first_after(detected, config.hang_at), vitals.decisions,
    )


def replay(config: ReplayConfig = ReplayConfig()) -> ReplayResult:
    """Play the same day twice, baseline and llm-vitals; deterministic for a given config."""
    started = time.perf_counter()
    episodes = batch_schedule(config)
    baseline = run_baseline(config, episodes)
    vitals = run_vitals(config, episodes)
    return ReplayResult(config, episodes, baseline, vitals, time.perf_counter() - started)


def _clock_time(seconds: float) -> str:
    return f"{int(seconds // 3600):02d}:{int(seconds % 3600 // 60):02d}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    return f"{int(seconds // 60)}m {int(seconds % 60):02d}s" if seconds >= 60 else f"{seconds:.0f}s"


def format_table(result: ReplayResult) -> str:
    config, b, v = result.config, result.baseline, result.vitals
    hang = config.hang_at
    busy = sum(min(e.end, config.duration) - e.start for e in result.episodes)
    rows = [
        ("restarts, total", len(b.restarts), len(v.restarts)),
        ("  of a healthy server (before the hang)", b.restarts_before(hang), v.restarts_before(hang)),
        ("  at or after the hang", b.restarts_from(hang), v.restarts_from(hang)),
        ("probe requests sent (chat checks / canaries)", b.probes.sent, v.probes.sent),
        ("  sent to a busy server", b.probes.sent_to_busy, v.probes.sent_to_busy),
        ("  failed or timed out", b.probes.failed, v.probes.failed),
        ("HTTP 500s caused by restarts", b.errors_from_restarts, v.errors_from_restarts),
        ("batch requests completed", b.batch_completed, v.batch_completed),
        ("hang -> stuck/unresponsive verdict", "-", _duration(v.hang_detect_latency)),
        ("hang -> restart", _duration(b.hang_restart_latency), _duration(v.hang_restart_latency)),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [
        (
            f"incident replay: {config.hours:g} h compressed into {result.wall_seconds:.1f} s (seed {config.seed}); "
            f"a {config.slots}-slot server, batch job busy {busy / 3600:.1f} h in {len(result.episodes)} episodes "
            f"of 2-4 requests; engine hangs at {_clock_time(hang)}"
        ),
        f"{'':<{width}}  {'baseline':>12}  {'llm-vitals':>12}",
    ]
    lines += [f"{label:<{width}}  {bv!s:>12}  {vv!s:>12}" for label, bv, vv in rows]
    lines.append("baseline restarts: " + ", ".join(f"{_clock_time(r.time)} {r.by} ({r.killed} x 500)"
                                                  for r in b.restarts))
    lines.append("llm-vitals restarts: " + ", ".join(f"{_clock_time(r.time)} {r.by} ({r.killed} x 500)"
                                                    for r in v.restarts))
    return "\n".join(lines)


def expectations(result: ReplayResult) -> list[str]:
    """What the replay must show; an empty list means it did."""
    b, v, hang = result.baseline, result.vitals, result.config.hang_at
    problems = []
    if b.restarts_before(hang) < 2:
        problems.append(f"baseline restarted a healthy server only {b.restarts_before(hang)} times (expected several)")
    if v.restarts_before(hang) != 0:
        problems.append(f"llm-vitals restarted a healthy server {v.restarts_before(hang)} times (expected 0)")
    if v.restarts_from(hang) != 1:
        problems.append(f"llm-vitals restarted {v.restarts_from(hang)} times after the hang (expected exactly 1)")
    if v.probes.sent_to_busy != 0:
        problems.append(f"llm-vitals sent {v.probes.sent_to_busy} canaries to a busy server (expected 0)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=24.0, help="length of the replayed day (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="batch schedule seed (default: %(default)s)")
    parser.add_argument("--hang-at", type=float, help="hours into the day when the engine hangs (default: 1.5 h before the end)")
    parser.add_argument("--idle-hang", action="store_true", help="hang while the server is idle (only the canary can tell)")
    args = parser.parse_args(argv)
    if args.hours < 3:
        parser.error("--hours must be at least 3 (the hang needs a busy episode and time to be seen)")
    config = ReplayConfig(hours=args.hours, seed=args.seed, hang_at_hours=args.hang_at, busy_at_hang=not args.idle_hang)
    if not 0 < config.hang_at < config.duration:
        parser.error("--hang-at must fall within the replayed day")
    result = replay(config)
    print(format_table(result))
    problems = expectations(result)
    for problem in problems:
        print(f"UNEXPECTED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
