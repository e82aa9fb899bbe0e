"""What an engine brings to the shared drills (its launcher, its fault hooks, its facts), and the Kit a drill is handed.

A tier's `engine.py` subclasses `Engine`: its class attributes are the facts the drills read to know
what to expect of this engine (which checks apply, how long things take), its methods are the
launcher and the fault hooks (which process or thread to freeze or kill, what load to send).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from real_tier import RealTier

from .harness import ExporterProcess, ExporterSettings, Sample, Watcher
from .launcher import ServerProcess, send_signal, title
from .load import Load, Outcome, read_page, sample_sum, wait_page
from .places import run_dir

FINISH_S = 300.0  # for a fault load's requests in flight to end after the fault
QUEUED_LONGER_THAN = "1.0"  # a bucket bound of the engines' queue-time histograms: requests that waited


@dataclass(frozen=True)
class Counted:
    """The engine's own count of the requests it ran: each canary must move it."""

    sample: str  # a sample of its /metrics, summed over its label sets
    fact: str  # the name of its delta in a drill's facts
    exact: bool  # True: one per request (within one); False: at least one per request (a step counter)


@dataclass(frozen=True)
class Probe:
    """What some of the engine's own HTTP routes answer while its engine is frozen."""

    paths: tuple[str, ...]
    status: int
    after_s: float = 0.0  # and not sooner (a route with a deadline of its own)
    timeout: float = 10.0


@dataclass
class Fault:
    """A fault in force: when it took hold, what it is ("SIGSTOP", "freeze"), what the hook saw."""

    t: float  # time.time()
    what: str
    facts: dict = field(default_factory=dict)


class Engine:
    """One engine's description for the drills in tests/real_engine/drills.py; a tier subclasses it.

    Facts are class attributes, hooks are methods. The defaults suit an engine that needs no such check.
    """

    key: str  # "vllm": the report's key, the output folder real-<key>, the tests' folder real_<key>
    name: str  # "vLLM": in messages, the report and the summary
    tier: RealTier
    drills: tuple[str, ...]  # the report's drill names: a test is filed under the first its name starts with
    exporter: ExporterSettings
    # smoke: the families the exporter reads must be samples on the engine's page, and /v1/models
    # lists exactly `openai_model` (None: the engine has no such route, 404).
    families: tuple[str, ...] = ()
    openai_model: str | None = None
    answered: Counted
    # saturation: a load that queues, the exporter busy throughout and sending no canary.
    saturation_requests: int = 0  # a load that ends by itself: requests sent (the engine's count moves by these)
    saturation_hold_s: float | None = None  # a held load instead: this long after the first busy poll, then cancelled
    saturation_on_page: bool = False  # wait mid-load until the engine's own page shows `working`
    queue_histogram: str | None = None  # the engine's queue-time histogram (family name)
    min_queued: int = 0  # requests it must count as queued longer than QUEUED_LONGER_THAN
    min_waiting_seen: int = 0  # waiting requests the exporter must have reported during the load
    canaries_after_load: int = 1  # idle canaries the exporter may send as the load drains
    # long prompts: busy, never stuck.
    long_prompt_tokens: int = 0
    long_prompt_seconds: float | None = None  # a sustained load: it must have lasted this long
    long_prompt_reads: bool = False  # read the engine's page during the load (`long_prompt_reading`)
    long_prompt_busy_throughout: bool = False  # no idle poll once busy (else idle between requests is fine)
    long_prompt_no_canary: bool = False
    # hang (the engine frozen, its HTTP alive): stuck in time, ready fails, live fails after its budget.
    hang_reasons: tuple[str, ...] = ("no_progress",)
    # Freeze only once the exporter has polled the load busy, with progress and requests waiting: an
    # engine whose frozen loop can leave /metrics unanswered is judged on the last read it answered.
    hang_when_owed: bool = False
    recovered_states: tuple[str, ...] = ("busy", "idle")  # right after the fault ends
    frozen_probe: Probe | None = None
    fault_outcomes_ok: bool = False  # the fault load's requests all answer 200 once the fault ends
    # kill
    down_within_s: float = 30.0  # on top of the exporter's down_after: the engine's own time to stop answering
    kill_reason: str | None = None  # the `down` reason it must be (None: any)
    kill_exits: bool = False  # the main process exits by itself within down_within_s
    kill_exit_status: int | None = None  # ... with this status (None: any)
    kill_failed: frozenset[int | None] | None = None  # in-flight statuses that count as failed (None: any but 200)
    kill_fails_all: bool = False  # every in-flight request fails (else at least one)
    # restart: one restart counted, idle, a good canary.
    restart_waits_for_idle: bool = False  # wait for idle after the canary (else the sample 3 polls later is idle)
    # A start that fails with one of these ends the run with one line (no timeout per drill hiding it).
    fatal_start_errors: tuple[type[Exception], ...] = ()

    @property
    def run_dir(self) -> Path:
        return run_dir(self.key)

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    def facts(self) -> dict:
        """The report's facts of this engine: its version and settings."""
        raise NotImplementedError

    def setup_missing(self) -> str | None:
        """Why the tier cannot run here (None when its built parts are in place)."""
        raise NotImplementedError

    def launcher(self) -> ServerProcess:
        """A server on free loopback ports, not started."""
        raise NotImplementedError

    def start(self, server: ServerProcess) -> float:
        return server.start()

    def restart(self, server: ServerProcess) -> float:
        """The restart drill's start on the same ports."""
        return self.start(server)

    def target_keys(self, server: ServerProcess) -> dict:
        """More keys of the exporter's target for this server (Triton: its metrics_url and model)."""
        return {}

    def smoke(self, kit: Kit) -> dict:
        """The engine's own smoke requests beyond families and models (asserts inside); facts for the report."""
        return {}

    def working(self, page: str) -> bool:
        """Whether the engine's own page shows the fault load in flight (and the saturation load saturating)."""
        raise NotImplementedError

    def saturation_load(self, server: ServerProcess) -> Load:
        raise NotImplementedError

    def saturation_facts(self, pages: dict[str, str]) -> dict:
        """What the engine's own pages said mid-load ("busy") and at a held load's end ("end")."""
        return {}

    def check_saturation(self, facts: dict) -> None:
        """The engine's own saturation checks, on the drill's facts."""

    def long_prompt_load(self, server: ServerProcess) -> Load:
        raise NotImplementedError

    def long_prompt_reading(self, page: str) -> dict:
        """One direct read during the long-prompt load: at least "in_flight" and "trap" (worth keeping)."""
        raise NotImplementedError

    def check_long_prompts(self, facts: dict, readings: list[dict]) -> None:
        """The engine's own long-prompt checks; may add to `facts`."""

    def fault_load(self, server: ServerProcess) -> Load:
        """Work in flight for the hang, freeze and kill drills, until the drill stops it."""
        raise NotImplementedError

    def finish_load(self, kit: Kit, load: Load) -> list[Outcome]:
        """End a fault load once the fault is over; its requests' outcomes."""
        load.stop()
        return load.wait(timeout=FINISH_S)

    def freeze_engine(self, kit: Kit, load: Load) -> AbstractContextManager[Fault]:
        """The hang: the engine frozen with work pending while its HTTP answers; released on exit."""
        raise NotImplementedError

    def freeze_server(self, kit: Kit, load: Load) -> AbstractContextManager[Fault]:
        """The whole server frozen: /metrics accepted and never answered; released on exit."""
        raise NotImplementedError

    def kill_target(self, server: ServerProcess) -> psutil.Process:
        """The process the kill drill SIGKILLs."""
        raise NotImplementedError

    def crash(self, server: ServerProcess) -> str | None:
        """Why the server died by itself (an engine's own known crash), or None while it serves."""
        return None


@dataclass
class Kit:
    """What a drill is handed: the engine, its running server, the exporter judging it, the watcher sampling that."""

    engine: Engine
    server: ServerProcess
    exporter: ExporterProcess
    watcher: Watcher

    def page(self) -> str:
        """The engine's own /metrics page now (one read)."""
        return read_page(self.server.metrics_url)

    def counter(self, names: str | tuple[str, ...], labels: dict[str, str] | None = None) -> float:
        """A sum of samples of the engine's own page, read now (tried again while a read fails)."""
        return sample_sum(self.wait_page(lambda page: True, "an answer from /metrics"), names, labels)

    def wait_page(self, condition: Callable[[str], bool], what: str, timeout: float = 60.0, load: Load | None = None) -> str:
        return wait_page(self.server.metrics_url, condition, timeout, what, load=load)

    def wait_working(self, load: Load, timeout: float = 60.0) -> str:
        """The engine's own page with the load in flight, read directly (a slow exporter sample cannot miss it)."""
        return self.wait_page(self.engine.working, f"{self.engine.name}'s own page showing the load", timeout, load)

    def queued_longer_than(self, le: str = QUEUED_LONGER_THAN) -> float:
        """How many requests the engine counted, in its lifetime, as queued longer than `le` seconds."""
        family = self.engine.queue_histogram
        page = self.wait_page(lambda page: True, "an answer from /metrics")
        return sample_sum(page, f"{family}_count") - sample_sum(page, f"{family}_bucket", {"le": le})

    def wait_idle(self, timeout: float = 120.0) -> Sample:
        """The first idle sample taken from now on (an earlier one says nothing about the engine now)."""
        return self.watcher.wait_for(lambda s: s.state == "idle", timeout=timeout, what="state idle", after=time.time())

    def wait_fresh_idle_canary(self) -> Sample:
        """Once an idle canary answered under a third of an interval ago, by the exporter's own clock.

        None is in flight then, and the next is not due before a load starting now is pending.
        Seeing the count rise is not enough: a starved watcher saw it 4.5 s late once, just as the
        next canary left, and it queued behind the load and was counted in it.
        """
        interval = self.engine.exporter.canary_interval
        return self.watcher.wait_for(
            lambda s: s.canary_last_success is not None and time.time() - s.canary_last_success < interval / 3,
            timeout=10 * interval + self.engine.exporter.canary_timeout,
            what="an idle canary answered under a third of an interval ago",
            after=time.time(),
        )

    def later(self, seconds: float = 3.0) -> Sample:
        """The first sample taken `seconds` from now or later."""
        return self.watcher.wait_for(lambda s: True, timeout=seconds + 30, what="a later sample", after=time.time() + seconds)

    def save_page(self, name: str, timeout: float | None = None) -> None:
        """Keep the engine's /metrics body and headers of this moment in logs/pages/ (fixture candidates); never raises.

        Bounded by the exporter's metrics_timeout unless told: a frozen server may never answer.
        """
        pages = self.engine.log_dir / "pages"
        pages.mkdir(parents=True, exist_ok=True)
        try:
            answer = httpx.get(self.server.metrics_url, timeout=timeout or self.engine.exporter.metrics_timeout)
            head = f"HTTP {answer.status_code}\n" + "".join(f"{k}: {v}\n" for k, v in answer.headers.items())
            (pages / f"metrics-{name}.txt").write_text(answer.text)
        except httpx.HTTPError as exc:
            head = f"no answer: {exc!r}\n"
        try:
            state = self.server.main_process().status()
        except (psutil.Error, RuntimeError):
            state = "gone"
        (pages / f"headers-{name}.txt").write_text(head + f"main process: {state}\n")

    def probe(self, probe: Probe) -> dict[str, list]:
        """{path: [status or None, seconds]} of one GET of each of the probe's routes."""
        answers: dict[str, list] = {}
        for path in probe.paths:
            began = time.monotonic()
            try:
                status: int | None = httpx.get(self.server.url + path, timeout=probe.timeout).status_code
            except httpx.HTTPError:
                status = None
            answers[path] = [status, round(time.monotonic() - began, 1)]
        return answers

    def relaunch_if_crashed(self) -> str | None:
        """Launch the server again when it died by itself (`Engine.crash`), so the drills after run; why it died."""
        crash = self.engine.crash(self.server)
        if crash is not None:
            self.server.stop()
            self.engine.start(self.server)
            self.wait_idle()
        return crash


@contextmanager
def sigstopped(proc: psutil.Process, within_s: float = 10.0) -> Iterator[Fault]:
    """`proc` SIGSTOPped inside the block, SIGCONTed on the way out; the fault once the kernel shows it stopped.

    The signal is delivered asynchronously: the state reads "running" for a moment after it.
    """
    t = time.time()
    proc.suspend()
    try:
        stopped_s = wait_until(lambda: proc.status() == psutil.STATUS_STOPPED, timeout=within_s)
        assert stopped_s is not None, f"{title(proc)} (pid {proc.pid}) never showed as stopped: {proc.status()}"
        yield Fault(t, "SIGSTOP", {"stopped_state_after_s": stopped_s})
    finally:
        send_signal(proc, signal.SIGCONT)


def wait_until(condition: Callable[[], bool], timeout: float, every: float = 0.1) -> float | None:
    """Seconds until `condition()` held, or None at the deadline."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if condition():
            return round(time.monotonic() - began, 2)
        time.sleep(every)
    return None


def openai_completion(url: str, model: str, tokens: int) -> dict:
    """One OpenAI completion of exactly `tokens` tokens: it answers 200 and says so in its usage."""
    body = {"model": model, "prompt": "def", "max_tokens": tokens, "ignore_eos": True}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == tokens, answer.text
    return {"completion_tokens": tokens}


def has_family(page: str, family: str) -> bool:
    """Whether `family` stands as a sample line on a page (with labels or without), not only in HELP or TYPE."""
    return re.search(rf"^{re.escape(family)}[{{ ]", page, re.MULTILINE) is not None
