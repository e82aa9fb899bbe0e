"""The real `llm-vitals-exporter` as a child process, seen only through its HTTP API, and its settings.

The drills judge the exporter by its public contract (docs/interfaces.md, docs/metrics.md):
`GET /api/v1/targets/{name}` (and its `/history`), `/probe/{name}/ready|live` and `/metrics`
(`llm_vitals_canary_requests_total{target,result}`, `llm_vitals_restarts_total{target}`).
A `Watcher` thread samples that API twice a second while a drill runs, so the drill's own thread
is free to drive load and signals; the samples become the verdict timeline of the report.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import IO, Any, Self

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from .launcher import free_port, tail

# A saturated 2-core box once took 9 s to answer one /metrics read: every read here gets 20 s.
HTTP_TIMEOUT_S = 20.0
SAMPLE_EVERY_S = 0.5


@dataclass(frozen=True)
class ExporterSettings:
    """The exporter's settings for one engine's drills: its one target, and the times the drills are judged by."""

    target: str  # the target's name, e.g. "real-vllm"
    engine: str  # the target's `engine:`
    stuck_after: float
    poll_interval: float = 1.0
    canary_interval: float = 3.0
    canary_timeout: float = 10.0
    liveness_budget: float | None = None  # None: the exporter's default, twice stuck_after
    metrics_timeout: float = 10.0  # the exporter's default
    # Failed reads persist this long before `down`. Shorter than the product's 30 s: a kill drill
    # judges the exporter's reaction, and three failed polls at 1 s are already no isolated miss.
    down_after: float = 3.0
    canary_request: dict | None = None  # the canary's body where the engine needs one (Triton's v2 infer)
    pause_budget: float | None = None  # None: the exporter's default (30 min)

    @property
    def liveness(self) -> float:
        return self.liveness_budget if self.liveness_budget is not None else 2 * self.stuck_after

    @property
    def unanswered_poll_s(self) -> float:
        """How long a poll lasts while /metrics accepts and never answers: not one interval, but its read's
        timeout and the second probe's after it (as long: the exporter waits for either as long)."""
        return self.poll_interval + 2 * self.metrics_timeout

    def facts(self) -> dict:
        """The report's "exporter" facts."""
        facts = {k: v for k, v in asdict(self).items() if v is not None and k not in ("target", "engine", "canary_request")}
        return facts | {"liveness_budget": self.liveness}

    def config(self, listen_port: int, url: str, **target_keys: Any) -> str:
        """The exporter's config file (YAML shape of docs/configuration.md): one target at `url`, plus `target_keys`."""
        canary: dict[str, Any] = {"interval": _s(self.canary_interval), "timeout": _s(self.canary_timeout)}
        if self.canary_request is not None:
            canary["request"] = self.canary_request
        target = {
            "name": self.target, "url": url, "engine": self.engine, "role": "backend", **target_keys,
            "stuck_after": _s(self.stuck_after), "liveness_budget": _s(self.liveness), "down_after": _s(self.down_after),
            "startup_grace": "5m", "canary": canary,
        }
        if self.pause_budget is not None:
            target["pause_budget"] = _s(self.pause_budget)
        config = {"listen": f"127.0.0.1:{listen_port}", "poll_interval": _s(self.poll_interval),
                  "metrics_timeout": _s(self.metrics_timeout), "targets": [target]}
        return yaml.safe_dump(config, sort_keys=False)


def _s(seconds: float) -> str:
    return f"{seconds:g}s"


def exporter_binary() -> str:
    """The exporter's console script in the venv running the tests (the project venv)."""
    beside = Path(sys.executable).parent / "llm-vitals-exporter"
    if beside.exists():
        return str(beside)
    found = shutil.which("llm-vitals-exporter")
    if not found:
        raise FileNotFoundError("llm-vitals-exporter not installed in the project venv (make install)")
    return found


@dataclass
class Sample:
    """One look at the exporter: the target's verdict, its probes and its canary counters."""

    t: float  # time.time()
    state: str | None
    reason: str | None
    running: float | None
    waiting: float | None
    since: float | None
    stuck_seconds: float | None
    restarts: float | None  # from the API's "restarts"
    ready: int | None  # HTTP status of /probe/{name}/ready
    live: int | None
    canaries: dict[str, float]  # result -> count, from /metrics
    error: str | None = None
    last_poll: float | None = None  # the exporter's own: how fresh its verdict was
    took: float = 0.0  # seconds the four reads took together
    canary_last_success: float | None = None  # the exporter's own: when its last canary answered
    unit: str | None = None  # the API's "unit": what a stuck verdict rests on (a Triton model, a vLLM engine)
    paused_too_long: bool | None = None  # the API's: paused past pause_budget (LLMServerPausedTooLong's condition)


@dataclass
class ExporterProcess:
    """One exporter subprocess polling one engine target."""

    settings: ExporterSettings
    engine_url: str
    log_dir: Path
    target_keys: dict = field(default_factory=dict)  # more keys of the target (Triton: metrics_url, model)
    port: int = field(default_factory=free_port)
    _proc: subprocess.Popen | None = None
    _log_path: Path | None = None
    _log_file: IO[bytes] | None = None

    @property
    def target(self) -> str:
        return self.settings.target

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, deadline_s: float = 60.0) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        config = self.log_dir / f"exporter-{self.port}.yaml"
        config.write_text(self.settings.config(self.port, self.engine_url, **self.target_keys))
        self._log_path = self.log_dir / f"exporter-{self.port}.log"
        self._log_file = open(self._log_path, "wb")  # noqa: SIM115 -- open for the child's whole life
        self._proc = subprocess.Popen(
            [exporter_binary(), "--config", str(config)],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started = time.monotonic()
        with httpx.Client(timeout=HTTP_TIMEOUT_S) as client:
            while True:
                if self._proc.poll() is not None:
                    raise RuntimeError(
                        f"exporter exited with status {self._proc.returncode}; {self._log_path}:\n{tail(self._log_path)}"
                    )
                try:
                    answer = client.get(f"{self.url}/api/v1/targets/{self.target}")
                    if answer.status_code == 200 and answer.json().get("last_poll") is not None:
                        return
                except (httpx.HTTPError, ValueError):
                    pass
                if time.monotonic() - started > deadline_s:
                    self.stop()
                    raise TimeoutError(f"exporter gave no first poll in {deadline_s:.0f} s; {self._log_path}")
                time.sleep(0.25)

    def stop(self) -> None:
        """Stop the exporter by its PID; never raises."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def log_tail(self) -> str:
        return tail(self._log_path) if self._log_path else ""

    def canary_in_flight(self) -> bool:
        """Whether the exporter has a canary out now, from its own target record (read directly)."""
        with httpx.Client(timeout=HTTP_TIMEOUT_S) as client:
            target = client.get(f"{self.url}/api/v1/targets/{self.target}").json()
        return bool((target.get("canary") or {}).get("in_flight"))

    def polled_states(self, t0: float, t1: float) -> list[tuple[float, str]]:
        """(poll time, verdict) of every poll the exporter made between t0 and t1, from its own history.

        Unlike the watcher's samples, this misses no poll when the test process is starved: on a
        quiet box a saturation load may last under 5 s, and one sample once took 4.3 s.
        """
        with httpx.Client(timeout=HTTP_TIMEOUT_S) as client:
            points = client.get(f"{self.url}/api/v1/targets/{self.target}/history").json()["points"]
        return [(t, state) for t, _steps_per_second, state in points if t0 <= t <= t1]

    def sample(self, client: httpx.Client, pool: ThreadPoolExecutor) -> Sample:
        """Read the verdict, both probes and the canary counters once, the four reads in parallel.

        In parallel because on a saturated box each read can take a second: one after the other,
        a sample would lag the verdict it reports by several seconds.
        """
        now = time.time()
        target_f = pool.submit(lambda: client.get(f"{self.url}/api/v1/targets/{self.target}").json())
        ready_f = pool.submit(lambda: client.get(f"{self.url}/probe/{self.target}/ready").status_code)
        live_f = pool.submit(lambda: client.get(f"{self.url}/probe/{self.target}/live").status_code)
        canaries_f = pool.submit(self.counter, client, "llm_vitals_canary_requests_total", "result")
        try:
            target, ready, live, canaries = (f.result() for f in (target_f, ready_f, live_f, canaries_f))
        except (httpx.HTTPError, ValueError) as exc:
            return Sample(now, None, None, None, None, None, None, None, None, None, {}, error=repr(exc))
        return Sample(
            last_poll=target.get("last_poll"),
            took=time.time() - now,
            t=now,
            state=target.get("state"),
            reason=target.get("reason"),
            running=target.get("running"),
            waiting=target.get("waiting"),
            since=target.get("since"),
            stuck_seconds=target.get("stuck_seconds"),
            restarts=target.get("restarts"),
            ready=ready,
            live=live,
            canaries=canaries,
            canary_last_success=(target.get("canary") or {}).get("last_success"),
            unit=target.get("unit"),
            paused_too_long=target.get("paused_too_long"),
        )

    def counter(self, client: httpx.Client, sample_name: str, by: str | None = None) -> dict[str, float]:
        """Values of one of the exporter's samples for our target, keyed by label `by` ("" without)."""
        page = client.get(f"{self.url}/metrics").text
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(page):
            for s in family.samples:
                if s.name == sample_name and s.labels.get("target") == self.target:
                    key = s.labels.get(by, "") if by else ""
                    values[key] = values.get(key, 0.0) + s.value
        return values

    def poll_errors(self) -> dict[str, float]:
        """`llm_vitals_poll_errors_total{target}` by reason, as the exporter's /metrics shows it now."""
        with httpx.Client(timeout=HTTP_TIMEOUT_S) as client:
            return self.counter(client, "llm_vitals_poll_errors_total", "reason")

    def restarts_total(self) -> float:
        """`llm_vitals_restarts_total{target}` as the exporter's /metrics shows it now."""
        with httpx.Client(timeout=HTTP_TIMEOUT_S) as client:
            return self.counter(client, "llm_vitals_restarts_total").get("", 0.0)


class Watcher:
    """Samples the exporter in a background thread until stopped; waits on conditions over samples."""

    def __init__(self, exporter: ExporterProcess):
        self.exporter = exporter
        self.samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._new = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._run, name="exporter-watcher", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        self.wait_for(lambda s: s.error is None, timeout=60, what="a first exporter sample")
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=HTTP_TIMEOUT_S * 5)

    def _run(self) -> None:
        with httpx.Client(timeout=HTTP_TIMEOUT_S) as client, ThreadPoolExecutor(4, "exporter-sample") as pool:
            while not self._stop.is_set():
                began = time.monotonic()
                sample = self.exporter.sample(client, pool)
                with self._new:
                    self.samples.append(sample)
                    self._new.notify_all()
                self._stop.wait(max(0.0, SAMPLE_EVERY_S - (time.monotonic() - began)))

    def latest(self) -> Sample:
        with self._lock:
            return self.samples[-1]

    def since(self, t: float) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if s.t >= t and s.error is None]

    def wait_for(self, condition: Callable[[Sample], bool], timeout: float, what: str, after: float = 0.0) -> Sample:
        """The first sample taken at or after `after` that satisfies `condition`; AssertionError at the deadline."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._new:
            while True:
                for sample in self.samples[seen:]:
                    if sample.t >= after and sample.error is None and condition(sample):
                        return sample
                seen = len(self.samples)
                left = deadline - time.monotonic()
                if left <= 0:
                    last = self.samples[-1] if self.samples else None
                    raise AssertionError(
                        f"timed out after {timeout:.0f} s waiting for {what}; {self._coverage(after)}; last sample: {last}"
                    )
                self._new.wait(timeout=left)

    def _coverage(self, after: float) -> str:
        """How well samples covered the wait (caller holds the lock): to tell a starved watcher from a wrong verdict."""
        taken = [s for s in self.samples if s.t >= after]
        errors = [s.error for s in taken if s.error is not None]
        gaps = [b.t - a.t for a, b in pairwise(taken)]
        states = sorted({str(s.state) for s in taken if s.error is None})
        return (
            f"{len(taken)} samples since, {len(errors)} failed (last: {errors[-1] if errors else '-'}), "
            f"largest gap {max(gaps, default=0.0):.1f} s, states seen {states}"
        )

    def period(self, t0: float) -> float | None:
        """Median seconds between samples since t0 (how sharp the timeline is)."""
        times = [s.t for s in self.since(t0)]
        gaps = [b - a for a, b in pairwise(times)]
        return round(statistics.median(gaps), 2) if gaps else None

    def health(self, t0: float) -> dict:
        """How well the watcher and the exporter kept up since t0 (to tell a slow box from a bug)."""
        samples = self.since(t0)
        ages = [s.t - s.last_poll for s in samples if s.last_poll is not None]
        return {
            "sample_period_s": self.period(t0),
            "max_sample_s": round(max((s.took for s in samples), default=0.0), 2),
            "max_poll_age_s": round(max(ages, default=0.0), 2),
        }

    def timeline(self, t0: float) -> list[list]:
        """State changes since t0 as [seconds after t0, state, reason, running, waiting, ready, live]."""
        rows: list[list] = []
        last_key = None
        for s in self.since(t0):
            key = (s.state, s.reason, s.ready, s.live)
            if key != last_key:
                rows.append([round(s.t - t0, 1), s.state, s.reason, s.running, s.waiting, s.ready, s.live])
                last_key = key
        return rows


def canary_delta(before: Sample, after: Sample) -> dict[str, float]:
    """Canaries sent between two samples, by result."""
    results = set(before.canaries) | set(after.canaries)
    return {r: after.canaries.get(r, 0.0) - before.canaries.get(r, 0.0) for r in sorted(results)}


def canaries(before: Sample, after: Sample) -> dict:
    """A drill's "canaries" record: how many were sent between two samples, and by result."""
    delta = canary_delta(before, after)
    return {"sent": sum(delta.values()), "by_result": delta}


def detection_seconds(sample: Sample, t_event: float) -> float:
    """Seconds from the event to the verdict: the exporter's own `since` when it is after the event."""
    if sample.since is not None and sample.since >= t_event:
        return sample.since - t_event
    return sample.t - t_event
