"""The background loops: one task per target polls on a fixed interval with jitter, judges, caches.

Nothing here can end a loop except cancellation: every upstream failure becomes a PollError, and an
unexpected exception is logged and counted as `internal` so a bug is visible but not fatal.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import NamedTuple

import aiohttp
from yarl import URL

from llm_vitals.exporter.canary import ModelRejected, resolve_model, run_canaries
from llm_vitals.exporter.clock import Clock, as_clock
from llm_vitals.exporter.decoupled import CONFIG_RETRY_SECONDS, config_due, unjudged
from llm_vitals.exporter.discovery.targetset import Changes
from llm_vitals.exporter.engines import Engine, Page, PageError, PageReading
from llm_vitals.exporter.engines.openai import parse_models
from llm_vitals.exporter.engines.table import engine_of, read_page
from llm_vitals.exporter.gpu_faults import GpuFaultState
from llm_vitals.exporter.gpu_faults.dcgm import DcgmSource, SharedPages, fetch_page
from llm_vitals.exporter.gpu_faults.file import FileSource
from llm_vitals.exporter.gpu_faults.node import NodeCache, NodeSource
from llm_vitals.exporter.gpu_faults.nvml import NvmlRules
from llm_vitals.exporter.gpu_faults.nvml_pynvml import PynvmlBackend
from llm_vitals.exporter.gpu_faults.nvml_source import NvmlFaultSource, NvmlSource
from llm_vitals.exporter.gpu_faults.reader import GpuFaultReader
from llm_vitals.exporter.keep_warm import warm_times
from llm_vitals.exporter.loop_lag import LoopLag
from llm_vitals.exporter.settings import ExporterSettings
from llm_vitals.exporter.state import StateStore, TargetRecord
from llm_vitals.exporter.upstream import (
    METRICS_HEADERS,
    MODELS_MAX_BYTES,
    Get,
    Got,
    auth_headers,
    bounded_get,
    carry_out,
    parsed_url,
)
from llm_vitals.exporter.verdict import (
    AskHealth,
    AskNow,
    AskReady,
    CanaryOutcome,
    Conclusion,
    Failed,
    ModelsOk,
    Moment,
    Observation,
    PollError,
    Probed,
    ReadPage,
    SecondProbe,
    read,
    record_canary,
)
from llm_vitals.logs import log_event
from llm_vitals.targets import UNHEALTHY_STATES

log = logging.getLogger("llm_vitals.exporter")


class Reach(NamedTuple):
    """How a record's target is read: its engine table entry, where its page is (parsed once), and the
    headers its model list is asked with (its API key)."""

    entry: Engine
    metrics_url: str
    parsed: URL | None  # `metrics_url` as aiohttp would parse it at each request (upstream.parsed_url)
    models_headers: dict[str, str]  # upstream.auth_headers


@dataclass(slots=True)
class PauseAsk:
    """One ask of a target's pause route (vLLM's GET /is_paused), sent in the background after a read.

    Its answer is for the next read only (`fresh_for`): asked after the read that judged the
    verdict now held. In the background, so a hung vLLM EngineCore, which never answers it, costs
    the verdict of a real hang no time: the next read finds no answer and judges without one.
    """

    asked_at: float
    task: asyncio.Task[None] | None = None
    answer: bool | None = None

    def fresh_for(self, last_poll: float | None) -> bool | None:
        """The answer, when it came in and was asked at or after the read at `last_poll`; else None."""
        if self.task is not None or last_poll is None or self.asked_at < last_poll:
            return None
        return self.answer


class Poller:
    """Owns the per-target tasks; writes each target's record in the StateStore."""

    def __init__(
        self,
        settings: ExporterSettings,
        store: StateStore,
        session: aiohttp.ClientSession,
        clock: Clock | Callable[[], float] | None = None,
        nodes: NodeCache | None = None,
        nvml: NvmlSource | None = None,
        lag: LoopLag | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.session = session
        # Monotonic for the verdict and every interval, wall for what is shown (llm_vitals/exporter/clock.py).
        self.clock = as_clock(clock if clock is not None else Clock())
        # The event loop's own lateness: a read that timed out while it was high is `exporter_late`.
        self.lag = lag
        self.tasks: dict[str, asyncio.Task[None]] = {}  # one poll loop per watched target, by name
        self._reaches: dict[TargetRecord, Reach] = {}  # how each record is read, worked out at its first poll
        self._pause_asks: dict[TargetRecord, PauseAsk] = {}  # each record's last ask of its pause route
        # The GPU-fault sources (llm_vitals/exporter/gpu_faults/), read through one aggregate per poll.
        gpu = settings.gpu_faults
        self.node_source = NodeSource(nodes, gpu.node_rules)  # its `cache`: the node watch's, while it runs (app.py sets it)
        # Targets on one node share its dcgm-exporter page: one read per URL per poll interval (a
        # tenth less, so that two polls one interval apart never both reuse one read).
        self._dcgm_source = DcgmSource(SharedPages(
            lambda url: fetch_page(session, url, self.settings.gpu_faults.dcgm_timeout, self.settings.max_page_bytes),
            fresh_for=0.9 * settings.poll_interval), gpu.dcgm_xid_rules)
        # The NVML source, made and started when a target first names `gpus` (a reload or discovery
        # may add one); its threads read the GPUs, a poll only copies what they left.
        self.nvml_source = NvmlFaultSource(self._new_nvml, NvmlRules(gpu.nvml_xid_rules), self.clock.mono)
        self.nvml_source.source = nvml  # its threads, once a target names `gpus`
        self.gpu_faults = GpuFaultReader([FileSource(), self.node_source, self._dcgm_source, self.nvml_source])

    def reconfigure(self, settings: ExporterSettings) -> None:
        """A reloaded config's poll settings and GPU-fault rules, used from each loop's next poll."""
        self.settings = settings
        self._dcgm_source.rules = settings.gpu_faults.dcgm_xid_rules
        self.node_source.rules = settings.gpu_faults.node_rules
        # The NVML source's interval and bounds stay those it was started with; its Xid rules follow.
        self.nvml_source.rules = NvmlRules(settings.gpu_faults.nvml_xid_rules)

    def _new_nvml(self) -> NvmlSource:
        nvml = self.settings.gpu_faults.nvml
        return NvmlSource(PynvmlBackend(), interval=nvml.interval, call_timeout=nvml.call_timeout,
                          init_timeout=nvml.init_timeout, clock=self.clock.mono, wall=self.clock.wall)

    @property
    def dcgm_pages(self) -> SharedPages:
        return self._dcgm_source.pages

    def start(self) -> None:
        for record in self.store:
            self._start(record)

    def _start(self, record: TargetRecord) -> None:
        self.tasks[record.name] = asyncio.create_task(self._loop(record), name=f"poll:{record.name}")

    async def stop(self) -> None:
        canaries = [r.canary_task for r in self.store if r.canary_task is not None]
        asks = [ask.task for ask in self._pause_asks.values() if ask.task is not None]
        tasks = [*self.tasks.values(), *canaries, *asks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.tasks.clear()
        await self.dcgm_pages.close()
        if self.nvml_source.source is not None:
            await asyncio.to_thread(self.nvml_source.stop)  # joins its threads for up to 3 s: not on the loop

    def apply(self, changes: Changes) -> None:
        """Follow a change of the target set (llm_vitals/exporter/discovery/targetset.py): stop the loops of the
        removed and changed targets and drop their records, then start fresh ones for the added and
        changed (each `starting` until its first good read).

        Synchronous on purpose: between this call and the next scrape there is no await, so no page
        shows a removed target. A cancelled loop may still be awaiting its upstream; it writes only
        to its own record, which is no longer in the store.
        """
        now = self.clock.mono()
        for name in (*changes.removed, *(target.name for target in changes.changed)):
            self._drop(name)
        for target in (*changes.added, *changes.changed):
            self._start(self.store.add(target, now))

    def _drop(self, name: str) -> None:
        task = self.tasks.pop(name, None)
        if task is not None:
            task.cancel()
        record = self.store.remove(name)
        if record is not None:
            self._reaches.pop(record, None)
            ask = self._pause_asks.pop(record, None)
            if ask is not None and ask.task is not None:
                ask.task.cancel()
        if record is not None and record.canary_task is not None:
            record.canary_task.cancel()

    async def _loop(self, record: TargetRecord) -> None:
        interval = self.settings.poll_interval
        loop = asyncio.get_running_loop()
        # `interval` is read again after each poll: a reload may change it.
        # A large fleet spreads its first polls over one interval so it does not poll in lockstep;
        # a small one starts within a second, so its first verdicts (and probes) come quickly.
        await asyncio.sleep(random.uniform(0, min(interval, 1.0) if len(self.store.records) < 50 else interval))
        next_at = loop.time()
        while True:
            try:
                await self.poll_once(record)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug in the exporter, never an upstream failure
                record.count_poll_error("internal")
                log.exception("poll failed unexpectedly", extra={"fields": {"target": record.name, "error": type(exc).__name__}})
            interval = self.settings.poll_interval
            next_at += interval
            now = loop.time()
            next_at = max(next_at, now)  # a poll overran the interval: re-anchor rather than fire a burst
            jitter = random.uniform(0, interval * self.settings.poll_jitter)
            if engine_of(record.settings.engine).keep_alive is None:
                await asyncio.sleep(next_at - now + jitter)  # nothing to keep warm: most engines, every poll
            else:
                await self._wait(record, next_at - now + jitter)

    async def _wait(self, record: TargetRecord, wait: float) -> None:
        """Sleep `wait` seconds to the next poll, keeping the target's connection open meanwhile where its
        server closes idle ones sooner than that (keep_warm.warm_times): a fresh connection may queue
        behind the clients' own requests for a thread (llama-server), a kept one holds its thread."""
        entry = engine_of(record.settings.engine)
        times = warm_times(wait, entry.keep_alive) if entry.health_paths else ()
        if not times:
            await asyncio.sleep(wait)
            return
        loop = asyncio.get_running_loop()
        start = loop.time()
        url = record.settings.base_url + entry.health_paths[0]  # answered by the HTTP front alone (llama-server)
        for at in times:
            await asyncio.sleep(max(0.0, start + at - loop.time()))
            try:
                # Its answer is no evidence: the next poll reads the page. Bounded to end before that poll.
                await bounded_get(self.session, url, max_bytes=64 * 1024,
                                  timeout=max(0.1, min(self.settings.health_timeout, start + wait - loop.time())))
            except PageError:
                pass
        await asyncio.sleep(max(0.0, start + wait - loop.time()))

    async def poll_once(self, record: TargetRecord) -> None:
        """One poll: the core's read carried out, its conclusion cached, a state change logged, maybe a canary sent."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        reach = self._reaches.get(record) or self._reach(record)
        entry = reach.entry  # the reads below take it
        # The core's read (verdict/plan.py): it asks for each request in turn, and decides everything.
        steps = read(record.verdict, record.settings, entry, self.settings.metrics_timeout)
        if not self.gpu_faults.wants(record.settings):  # no gather: its two tasks a poll showed at 5,000 targets (bench_scale.py)
            await self._carry_out(record, reach, steps)
            duration = loop.time() - started
            if record.gpu_faults.reads:
                record.set_gpu_faults(GpuFaultState())  # a source it no longer has (the node watch stopped)
        else:
            _, faults = await asyncio.gather(
                self._carry_out(record, reach, steps), self.gpu_faults.read(record.settings, record.gpu_faults))
            duration = loop.time() - started
            record.set_gpu_faults(faults)  # the one writer of the target's GPU faults
        now = self.clock.now()
        before = record.verdict
        ask = self._pause_asks.get(record)
        # The core's word on this read: the new verdict, the pause ask, the canary. Its /metrics lines
        # are not rendered here: the next scrape renders what changed (llm_vitals/exporter/page.py).
        concluded = _concluded(steps, Moment(
            before, now.mono, self.settings.poll_interval, record.last_canary_sent, record.canary_task is not None,
            ask.fresh_for(before.last_poll) if ask is not None else None,
            entry.pause_path is not None and (ask is None or ask.task is None), record.draining))
        observation = concluded.observation
        # Its pace beside its workload's peers (exporter/pace.py): `degraded`, never a state; recorded with the verdict.
        pace = self.store.pace.observe(
            record.name, record.peer_group,
            observation if isinstance(observation, PageReading) else None, now.mono, self.settings.pace.rules, record.pace)
        record.record_poll(concluded.verdict, now.mono, duration, wall=now.wall, pace=pace)
        if concluded.ask_pause:
            ask = self._pause_asks[record] = PauseAsk(now.mono)
            ask.task = asyncio.create_task(self._ask_pause(record, entry, ask), name=f"pause:{record.name}")
        if record.verdict.restarts != before.restarts and record.model_config is not None:
            record.set_model_config(None, None)  # a new process may serve the model with another config
        if record.draining and not concluded.draining:
            record.set_draining(False)
            log_event(log, "undrain", target=record.name, reason="restart_detected")
        self._log_change(record, before)
        if concluded.send_canary:
            record.canary_sent(asyncio.create_task(self._canary(record), name=f"canary:{record.name}"), now.mono)

    def _reach(self, record: TargetRecord) -> Reach:
        """How `record` is read, kept for its life: its settings never change (a changed target is a new record)."""
        entry = engine_of(record.settings.engine)
        url = entry.metrics_url(record.settings)
        reach = self._reaches[record] = Reach(entry, url, parsed_url(url), auth_headers(record.settings.api_key))
        return reach

    async def _carry_out(self, record: TargetRecord, reach: Reach, steps: Generator[object, object, Conclusion]) -> None:
        """Carry out the core's read: its requests, as GETs (`_gets`), done by upstream in one call, in order.

        `_gets` is started here, so upstream only resumes it: the poll enters upstream once, for every GET.
        """
        gets = self._gets(record, reach, steps)
        first = next(gets, None)  # the page's GET (a read always asks for its page first)
        if first is not None:
            await carry_out(self.session, gets, first)

    def _gets(self, record: TargetRecord, reach: Reach, steps: Generator[object, object, Conclusion]) -> Generator[Get, Got, None]:
        """Each request of the core's read, in order, as the GETs it takes (each answer sent back to the core),
        until it asks for the moment to conclude at (`AskNow`). Never raises for upstream trouble: a failure is an answer."""
        started = asyncio.get_running_loop().time()  # a failed read's lag is the loop's worst since here
        request = next(steps)
        while not isinstance(request, AskNow):
            answer: object
            if isinstance(request, ReadPage):
                answer = yield from self._read_page(record, reach, request.deadline, started)
            elif isinstance(request, AskHealth):
                answer = yield from self._read_health(record, reach.entry)
            elif isinstance(request, AskReady):
                answer = yield from self._check_model_ready(record, reach.entry, started)
            elif isinstance(request, SecondProbe):
                answer = yield from self._second_probe(record, reach, request.deadline)
            else:
                raise TypeError(f"the core asked for {request!r}")  # a bug in the core, counted `internal`
            request = steps.send(answer)

    def _read_page(self, record: TargetRecord, reach: Reach, deadline: float,
                   started: float) -> Generator[Get, Got, Observation | Failed]:
        """What the read sees: a PageReading within `deadline`, or the model list for a proxy or an engine with
        no page; or how it failed. The engine's own model config is read beside the page when due (Triton)."""
        target, entry = record.settings, reach.entry
        timeout = deadline
        reading_metrics = False  # a second probe follows only a /metrics read that got no answer
        try:
            if target.role == "proxy" or entry.parse is None:
                timeout = self.settings.models_timeout
                return ModelsOk(tuple((yield from self._read_models(record, reach, timeout))))
            reading_metrics = True
            snapshot = yield from self._read_metrics(reach, timeout)
            reading_metrics = False
            if entry.model_config_path is not None and config_due(
                    entry, target.model, record.model_config, record.model_config_tried,
                    asyncio.get_running_loop().time(), CONFIG_RETRY_SECONDS):
                yield from self._read_model_config(record, entry)
            if record.model_config is not None:
                snapshot = self._judged_model(record, snapshot, entry)
            return snapshot
        except PageError as exc:
            return self._failed(PollError(exc.reason, exc.detail), started, timeout, metrics=reading_metrics)

    def _failed(self, error: PollError, started: float, timeout: float, *, metrics: bool = False) -> Failed:
        return Failed(error, self.lag.worst_since(started) if self.lag is not None else None, timeout, metrics)

    def _second_probe(self, record: TargetRecord, reach: Reach, deadline: float) -> Generator[Get, Got, Probed]:
        """What one more request saw after a /metrics read that connected and got no answer.

        The engine's first health route (vLLM's /health is answered by its API server, which stays
        quick while a saturated engine makes /metrics slow), else its model list (SGLang's HTTP
        server answers it without its scheduler; its /health submits a generation), else its
        metrics page again, within the read's own `deadline`: an API server starved by load
        answers every route late, and must not be read as frozen (the core judges the answer:
        verdict/reads.py's `with_second_probe`).
        """
        entry = reach.entry
        health = bool(entry.health_paths)
        if health or entry.models_path is not None:
            url = record.settings.base_url + (entry.health_paths[0] if health else entry.models_path or "")
        else:
            url = reach.metrics_url
        path = "/" + url.split("//", 1)[-1].partition("/")[2]
        started = asyncio.get_running_loop().time()
        answer: int | PollError
        try:
            answer, _, _ = yield Get(url, deadline, 64 * 1024)
        except PageError as exc:
            answer = PollError(exc.reason, exc.detail)
        return Probed(path, answer, self.lag.worst_since(started) if self.lag is not None else None, health)

    def _read_metrics(self, reach: Reach, timeout: float) -> Generator[Get, Got, PageReading]:
        status, body, headers = yield Get(reach.metrics_url, timeout, self.settings.max_page_bytes,
                                          METRICS_HEADERS, reach.parsed)
        if status != 200:
            raise PageError("http_status", f"{reach.entry.metrics_path} answered HTTP {status}")
        return read_page(reach.entry, Page(body, headers))

    def _read_models(self, record: TargetRecord, reach: Reach, timeout: float) -> Generator[Get, Got, list[str]]:
        """Model ids from the target's `/v1/models` (sent with its API key), in order; raises PageError."""
        status, body, _ = yield Get(record.settings.base_url + "/v1/models", timeout, MODELS_MAX_BYTES, reach.models_headers)
        if status != 200:
            raise PageError("http_status", f"/v1/models answered HTTP {status}")
        return parse_models(body)

    def _read_health(self, record: TargetRecord, entry: Engine) -> Generator[Get, Got, tuple[str, int] | None]:
        """The first of the engine's health routes that answers 503, as (path, 503); else the last answer, or None.

        Only a 503 is news to the verdict; a route that does not answer is skipped (a server really
        gone fails its next metrics read).
        """
        seen = None
        for path in entry.health_paths:
            try:
                status, _, _ = yield Get(record.settings.base_url + path, self.settings.health_timeout, 64 * 1024)
            except PageError:
                continue
            seen = (path, status)
            if status == 503:
                break
        return seen

    async def _ask_pause(self, record: TargetRecord, entry: Engine, ask: PauseAsk) -> None:
        """Ask the engine's pause route (vLLM's GET /is_paused) once: True paused; None unanswered or unreadable."""
        try:
            if entry.pause_path is not None and entry.pause_answer is not None:
                status, body = await bounded_get(self.session, record.settings.base_url + entry.pause_path,
                                                 timeout=self.settings.health_timeout, max_bytes=64 * 1024)
                ask.answer = entry.pause_answer(status, body)
        except PageError:
            ask.answer = None  # no answer is no pause: a hung vLLM EngineCore does not answer it
        finally:
            ask.task = None

    def _read_model_config(self, record: TargetRecord, entry: Engine) -> Generator[Get, Got, None]:
        """The engine's own config of the target's model (Triton: is it decoupled?), kept for the process's life.

        A failure (a timeout, PyTriton's 403 on a locked API, a page that is no config) leaves it
        unknown, tried again after CONFIG_RETRY_SECONDS: the model keeps the plain canary, whose 501
        is a rejection, never a failure.
        """
        now = asyncio.get_running_loop().time()
        if entry.model_config_path is None or entry.model_config is None or not record.settings.model:
            return
        path = entry.model_config_path.replace("{model}", record.settings.model)
        try:
            status, body, _ = yield Get(record.settings.base_url + path, self.settings.health_timeout, MODELS_MAX_BYTES)
            if status != 200:
                raise PageError("http_status", f"{path} answered HTTP {status}")
            record.set_model_config(entry.model_config(body), now)
        except PageError as exc:
            record.set_model_config(None, now)
            log_event(log, "model config unread", logging.DEBUG, target=record.name, reason=exc.reason, detail=exc.detail)

    def _judged_model(self, record: TargetRecord, snapshot: PageReading, entry: Engine) -> PageReading:
        """`snapshot`, naming the target's model where no signal of the page can judge it (exporter/decoupled.py)."""
        found = unjudged(entry, record.settings.model, record.model_config, snapshot)
        return snapshot if found is None else replace(snapshot, unjudged=found)

    def _check_model_ready(self, record: TargetRecord, entry: Engine, started: float) -> Generator[Get, Got, Failed | None]:
        """None when the model can serve (or the engine has no ready route); else the read's failure.

        An idle-looking page is idle only once the model can serve: a Triton (re)starting has its
        page up before the model is loaded, and a canary then fails (404) as if the server hung.
        """
        path = entry.ready_path
        if path is None or not record.settings.model:
            return None
        path = path.replace("{model}", record.settings.model)
        timeout = self.settings.health_timeout
        try:
            status, _, _ = yield Get(record.settings.base_url + path, timeout, 64 * 1024)
        except PageError as exc:
            return self._failed(PollError(exc.reason, exc.detail, ready_route=True), started, timeout)
        if status != 200:
            return self._failed(PollError("http_status", f"{path} answered HTTP {status}: the model is not ready",
                                          ready_route=True), started, timeout)
        return None

    async def _canary(self, record: TargetRecord) -> None:
        target = record.settings
        try:
            try:
                async with asyncio.timeout(target.canary.timeout):
                    model = record.model
                    if model is None:
                        model = await resolve_model(self.session, target, self.settings.models_timeout)
                        record.set_model(model)
                    run = await run_canaries(self.session, target, model, record.canary_path, record.model_config)
                    outcome = run.outcome
                    if run.path != record.canary_path:
                        record.set_canary_path(run.path)
            except TimeoutError:
                outcome = CanaryOutcome("timeout", f"no answer within {target.canary.timeout:g}s")
            except ModelRejected as exc:
                outcome = CanaryOutcome("rejected", f"model lookup: {exc.detail}")
            except PageError as exc:
                outcome = CanaryOutcome("error", f"model lookup failed ({exc.reason})")
            if outcome.result != "ok" and not target.model:
                record.set_model(None)  # the server may have been replaced or renamed its model: look it up again
            before = record.verdict
            record.record_canary(outcome.result, record_canary(before, outcome, self.clock.mono(), target))
            if outcome.result != "ok":
                log_event(log, "canary failed", logging.WARNING, target=record.name, result=outcome.result,
                          detail=outcome.detail, consecutive_failures=record.verdict.canary_failures)
            self._log_change(record, before)
        except Exception as exc:  # a bug in the exporter: logged, and never counted against the server
            log.exception("canary failed unexpectedly", extra={"fields": {"target": record.name, "error": type(exc).__name__}})
        finally:
            record.canary_ended()

    def _log_change(self, record: TargetRecord, before) -> None:
        after = record.verdict
        if after.restarts != before.restarts:
            log_event(log, "restart detected", logging.WARNING, target=record.name, restarts=after.restarts,
                      process_start_time=after.process_start_time)
        if after.state == before.state:
            return
        snap = after.snapshot
        log_event(
            log, "state change", logging.WARNING if after.state in UNHEALTHY_STATES else logging.INFO,
            target=record.name, **{"from": before.state, "to": after.state}, reason=after.reason,
            detail=after.detail, restarts=after.restarts, counters=snap.counters() if snap else {},
        )


def _concluded(steps: Generator[object, object, Conclusion], moment: Moment) -> Conclusion:
    """The core's read, sent the moment it is concluded at: what it returns."""
    try:
        steps.send(moment)
    except StopIteration as done:
        return done.value
    raise RuntimeError("the core's read asked for more than its moment")  # a bug in the core, counted `internal`
