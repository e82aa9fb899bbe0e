"""One exporter at 1,000 and 5,000 targets polled by a fake fleet; with `--baseline DIR`, another
commit's exporter beside it (e.g. one that rendered /metrics whole per scrape), side by side.

For each (targets, checkout), on a fresh exporter (its real CLI, in a process of its own) polling a
fake fleet (bench/fleet_pages.py: one niced process answering every target from prebuilt bytes) every
5 s, after a warm-up of one interval and a bit:
- CPU: the exporter's user + system time over a window of polls alone, as a share of one core, and
  beside it `waited`: the time it was runnable but waited for a CPU (/proc schedstat), other work's toll;
- scrape: `--scrapes` single GETs of /metrics, one at a time, request to last byte;
- probe alone: `--probes` readiness probes, 5 ms apart, each on a new connection as the kubelet
  makes them, request to last byte: p50, p99, max;
- probe during scrapes: the same, while another process (bench/scrape_loop.py) scrapes /metrics
  back to back.
The box is shared: beside each measurement are the load average and the floor, the probe p50/p99
of a bare aiohttp server at the exporter's priority just before; figures from a loaded box are
worse than the exporter's own. First, in this process and in CPU time (which the load does not
inflate), one scrape's page and its longest loop step: rendered whole (tests/whole_page.py, the
renderer before llm_vitals/exporter/page.py), and joined from kept lines after every target changed
(a scrape after a poll interval or more) and after none did (back-to-back scrapes).

`DIR` is a detached worktree of the other commit with its own .venv (bench/checkouts.py).

`--engine llamacpp` (issue 23, part 3) runs the same against llama.cpp's real busy page, an engine
whose unanswered /metrics counts toward `stuck`: every target is busy and moving, so any `stuck` is
the exporter's own doing. A watcher scrapes /metrics every `--sample` seconds for the loop lag
(llm_vitals_exporter_loop_lag_seconds), the targets read stuck and the reads that timed out or were
exporter_late; at the end /api/v1/targets says how many targets were ever unhealthy. Tighten
`--metrics-timeout` and `--stuck-after` to make a late exporter's timeouts likely within the run.
`--starve STOP:RUN` starves the exporter on purpose, as a CPU quota does a throttled pod: from its
first poll on, it is SIGSTOPped for STOP seconds, then let run for RUN, over and over, so the
answers its reads asked for wait unread while its timeouts fall due (its latency figures are then
meaningless; the verdicts are the point).

Targets (issue 16), for this checkout: at 5,000 targets <= 50 % of one core, a scrape <= 20 ms,
probe p99 <= 2 ms alone and <= 5 ms during scrapes; at 1,000 targets probe p99 <= 1 ms alone.

    .venv/bin/python bench/bench_scale.py [--targets 1000 5000] [--runs 1] [--interval 5] [--window 15] [--baseline DIR]
    .venv/bin/python bench/bench_scale.py --engine llamacpp --targets 5000 --metrics-timeout 2 --stuck-after 10
    .venv/bin/python bench/bench_scale.py --engine llamacpp --targets 5000 --metrics-timeout 2 --stuck-after 10 --starve 3:1
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from checkouts import exporter_command, exporter_env, label
from loopback import free_port, total_polls, wait_http

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
NICENESS = 10  # the fake fleet, behind the exporter it feeds (at 19 a loaded box starved it: half the polls made)
# The floor: a bare aiohttp app answering a probe-sized JSON, run beside the exporter at the same
# priority. Its probe latencies are what this box gives any Python server at that moment.
FLOOR_SERVER = r"""
import sys
from aiohttp import web
async def ready(request):
    return web.json_response({"target": "t0", "probe": "ready", "ok": True, "state": "busy"})
app = web.Application()
app.router.add_get("/probe/t0/ready", ready)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""


def lower_priority(pid: int) -> None:
    """Best effort: `pid`'s session (autogroup) and every thread of it behind everything else."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{NICENESS}\n")
    except OSError:
        pass  # no autogroup, or not allowed: the per-thread nice still applies
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), NICENESS)
        except OSError:
            pass


def waited_seconds(pid: int) -> float:
    """Seconds the threads of `pid` spent runnable but waiting for a CPU (schedstat): the box's load on it."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


PROBE_TIMEOUT = 1.0  # the kubelet's default: a probe unanswered this long failed, counted at 1,000 ms


def probe_ms(port: int, request: bytes) -> float:
    """One probe on a new connection (the kubelet keeps none alive), request to last byte, in ms."""
    began = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT) as sock:
            sock.sendall(request)
            while sock.recv(65536):
                if time.perf_counter() - began > PROBE_TIMEOUT:
                    raise TimeoutError
    except OSError:
        return PROBE_TIMEOUT * 1e3
    return (time.perf_counter() - began) * 1e3


def probes(port: int, count: int) -> list[float]:
    request = b"GET /probe/t0/ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    times = []
    for _ in range(count):
        times.append(probe_ms(port, request))
        time.sleep(0.005)  # a probe is periodic, not a flood
    return sorted(times)


def scrape_loop(port: int, *extra: str) -> subprocess.Popen[str]:
    # Not niced: timing a scrape, it is an instrument; scraping back to back, it reads what a
    # Prometheus would (an 8 MB page costs it little: bytes into a buffer, not parsed).
    return subprocess.Popen([sys.executable, str(BENCH / "scrape_loop.py"), "--port", str(port), *extra],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)


def finish(child: subprocess.Popen[str]) -> dict[str, list[float]]:
    """Close its stdin (the loop's stop sign) and read what it measured."""
    out, _ = child.communicate(timeout=120)
    return json.loads(out)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Result:
    targets: int
    checkout: str  # "this", or the baseline's folder name
    load: float  # 1-minute load average when the measurement began
    floor: list[float]  # probe latencies of the floor server, just before the exporter's alone
    cpu: float  # share of one core, polls alone
    polls: float  # share of the expected polls made in the window
    fleet_cpu: float  # the fake fleet's share of one core in the same window
    waited: float  # seconds per second the exporter was runnable but not running (other work on the box)
    scrape_ms: list[float] = field(default_factory=list)
    page_bytes: int = 0
    alone: list[float] = field(default_factory=list)
    during: list[float] = field(default_factory=list)
    scrapes_during: int = 0
    failures: int = 0  # probes unanswered within PROBE_TIMEOUT, and scrapes that failed
    verdicts: dict[str, float] = field(default_factory=dict)  # the watcher's (--engine llamacpp)

    def figures(self) -> dict[str, float]:
        return {
            "load": self.load, "floor_p50": pct(self.floor, 0.5), "floor_p99": pct(self.floor, 0.99),
            "cpu_%": 100 * self.cpu, "waited_%": 100 * self.waited, "polls_%": 100 * self.polls, "fleet_cpu_%": 100 * self.fleet_cpu,
            "scrape_ms": statistics.median(self.scrape_ms), "scrape_max_ms": max(self.scrape_ms),
            "alone_p50": pct(self.alone, 0.5), "alone_p99": pct(self.alone, 0.99), "alone_max": max(self.alone),
            "during_p50": pct(self.during, 0.5), "during_p99": pct(self.during, 0.99), "during_max": max(self.during),
        }

    def misses(self) -> list[str]:
        """The issue's targets this measurement misses (this checkout only; none when starved on purpose)."""
        f, missed = self.figures(), []
        if self.checkout != "this" or "starved_s" in self.verdicts:
            return missed
        if self.targets >= 5000:
            for key, limit in (("cpu_%", 50), ("scrape_ms", 20), ("alone_p99", 2), ("during_p99", 5)):
                if f[key] > limit:
                    missed.append(f"{key} {f[key]:.1f} > {limit}")
        if self.targets <= 1000 and f["alone_p99"] > 1:
            missed.append(f"alone_p99 {f['alone_p99']:.2f} > 1")
        return missed


_STUCK = re.compile(rb'^llm_vitals_state\{state="stuck",target="[^"]*"\} 1\.0$', re.M)
_LAG = re.compile(rb"^llm_vitals_exporter_loop_lag_seconds (\S+)$", re.M)
_ERRORS = re.compile(rb'^llm_vitals_poll_errors_total\{reason="(timeout|exporter_late)",target="[^"]*"\} (\S+)$', re.M)


class Watcher(threading.Thread):
    """Scrapes the exporter's /metrics every `every` seconds: its loop lag, how many targets read stuck,
    and the reads that timed out or were exporter_late (summed over the targets), until `stop()`."""

    def __init__(self, port: int, every: float) -> None:
        super().__init__(name="watcher", daemon=True)
        self.url, self.every = f"http://127.0.0.1:{port}/metrics", every
        self.lag: list[float] = []
        self.stuck: list[int] = []
        self.errors: dict[str, float] = {}
        self.failed = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.every):
            self.sample()

    def sample(self) -> None:
        """One scrape; a failed one (an exporter starved on purpose may cut it short) is skipped."""
        try:
            with urllib.request.urlopen(self.url, timeout=120) as answer:
                page = answer.read()
        except (OSError, http.client.HTTPException):
            self.failed += 1
            return
        if (lag := _LAG.search(page)) is not None:
            self.lag.append(float(lag.group(1)))  # no loop-lag gauge: an exporter older than issue 23
        self.stuck.append(len(_STUCK.findall(page)))
        totals: dict[str, float] = {}
        for reason, value in _ERRORS.findall(page):
            totals[reason.decode()] = totals.get(reason.decode(), 0.0) + float(value)
        self.errors = totals

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=120)


class Starver(threading.Thread):
    """SIGSTOPs `pid` for `stop` seconds, then lets it run for `run` seconds, until `end()`; leaves it running."""

    def __init__(self, pid: int, stop: float, run: float) -> None:
        super().__init__(name="starver", daemon=True)
        self.pid, self.stop_s, self.run_s = pid, stop, run
        self.stopped_s = 0.0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            began = time.monotonic()
            os.kill(self.pid, signal.SIGSTOP)
            try:
                self._done.wait(self.stop_s)
            finally:
                os.kill(self.pid, signal.SIGCONT)
                self.stopped_s += time.monotonic() - began
            self._done.wait(self.run_s)

    def end(self) -> None:
        self._done.set()
        self.join(timeout=60)


def verdicts(port: int, watcher: Watcher) -> dict[str, float]:
    """What the watcher saw (and one last scrape), and from /api/v1/targets: targets ever unhealthy, stuck now,
    restarts detected."""
    watcher.sample()  # the counters as they end
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets", timeout=120) as answer:
        views = json.load(answer)["targets"]
    return {
        "stuck_max": max(watcher.stuck, default=0), "samples": len(watcher.stuck), "failed_samples": watcher.failed,
        "lag_min_s": min(watcher.lag, default=float("nan")), "lag_max_s": max(watcher.lag, default=float("nan")),
        "timeouts": watcher.errors.get("timeout", 0.0), "exporter_late": watcher.errors.get("exporter_late", 0.0),
        "ever_unhealthy": sum(1 for v in views if v.get("last_unhealthy_at") is not None),
        "stuck_now": sum(1 for v in views if v["state"] == "stuck"),
        "restarts": sum(v.get("restarts", 0) for v in views),
    }


def measure(targets: int, checkout: Path, fleet_port: int, fleet: psutil.Process, floor_port: int,
            args: argparse.Namespace) -> Result:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "exporter.yaml"
        lines = [f'listen: "127.0.0.1:{port}"', f"poll_interval: {args.interval}", "log_level: error"]
        if args.metrics_timeout is not None:
            lines.append(f"metrics_timeout: {args.metrics_timeout}")
        keys = "" if args.engine == "vllm" else f", engine: {args.engine}"
        if args.stuck_after is not None:
            keys += f", stuck_after: {args.stuck_after}"
        lines.append("targets:")
        lines += [f"  - {{name: t{i}, url: 'http://127.0.0.1:{fleet_port}/t{i}', canary: {{enabled: false}}{keys}}}"
                  for i in range(targets)]
        config.write_text("\n".join(lines) + "\n")
        exporter = subprocess.Popen([*exporter_command(checkout), "--config", str(config)],
                                    env=exporter_env(checkout), cwd=checkout, start_new_session=True)
        watcher: Watcher | None = None
        starver: Starver | None = None
        try:
            # Reading a 5,000-target config takes seconds of CPU, minutes on a box loaded many times over.
            wait_http(f"http://127.0.0.1:{port}/healthz", timeout=max(60.0, targets / 20))
            if args.engine != "vllm":
                watcher = Watcher(port, args.sample)
                watcher.start()
            if args.starve:
                stop, _, run = args.starve.partition(":")
                starver = Starver(exporter.pid, float(stop), float(run))
                starver.start()
            time.sleep(args.interval + args.warmup)  # a large fleet spreads its first polls over one interval
            process = psutil.Process(exporter.pid)
            load = os.getloadavg()[0]
            polls_before = total_polls(f"http://127.0.0.1:{port}")
            cpu_before, fleet_before, began = cpu_seconds(process), cpu_seconds(fleet), time.monotonic()
            waited_before = waited_seconds(exporter.pid)
            time.sleep(args.window)
            cpu_after, fleet_after, elapsed = cpu_seconds(process), cpu_seconds(fleet), time.monotonic() - began
            waited = (waited_seconds(exporter.pid) - waited_before) / elapsed
            polls = total_polls(f"http://127.0.0.1:{port}") - polls_before
            result = Result(targets, label(checkout), load, probes(floor_port, args.probes), (cpu_after - cpu_before) / elapsed,
                            polls / (targets * elapsed / args.interval), (fleet_after - fleet_before) / elapsed, waited)
            if starver is not None:
                # Starved on purpose, its latencies say nothing: the verdicts are the point.
                starver.end()
                result.scrape_ms = result.alone = result.during = [float("nan")]
                if watcher is not None:
                    watcher.stop()
                    result.verdicts = {**verdicts(port, watcher), "starved_s": round(starver.stopped_s, 1)}
                return result
            result.alone = probes(port, args.probes)
            single = finish(scrape_loop(port, "--count", str(args.scrapes), "--pause", "0.5"))
            result.scrape_ms = [s * 1e3 for s in single["seconds"]]
            result.page_bytes = int(statistics.median(single["bytes"]))  # (-1: failed)
            scraper = scrape_loop(port)
            time.sleep(0.3)
            result.during = probes(port, args.probes)
            during = finish(scraper)
            result.scrapes_during = len(during["seconds"])
            result.failures = sum(1 for ms in result.alone + result.during if ms >= PROBE_TIMEOUT * 1e3) \
                + sum(1 for b in single["bytes"] + during["bytes"] if b < 0)
            if watcher is not None:
                watcher.stop()
                result.verdicts = verdicts(port, watcher)
            return result
        finally:
            if starver is not None:
                starver.end()
            exporter.terminate()
            try:
                exporter.wait(timeout=120)  # 5,000 poll loops to cancel on a loaded box
            except subprocess.TimeoutExpired:
                exporter.kill()
                exporter.wait(timeout=30)
            if watcher is not None:
                watcher.stop()


def page_steps(targets: int) -> dict[str, tuple[float, float]]:
    """In this process, no network: CPU ms of the longest loop step of one scrape, and of the whole
    page, at `targets` busy targets (thread CPU time: the box's load does not count): rendered whole
    (the renderer before llm_vitals/exporter/page.py), joined after every target changed since the
    last scrape, and joined after none did."""
    from dataclasses import replace

    sys.path.insert(0, str(REPO / "tests"))
    from whole_page import render_families

    from llm_vitals.exporter.collector import read
    from llm_vitals.exporter.engines import PageReading
    from llm_vitals.exporter.page import PageCache
    from llm_vitals.exporter.settings import parse_settings
    from llm_vitals.exporter.state import StateStore

    now = time.time()
    store = StateStore(parse_settings({"targets": [{"name": f"t{i}", "url": f"http://127.0.0.1:9/t{i}"}
                                                   for i in range(targets)]}, environ={}), now - 60)
    snapshot = PageReading(running=2, waiting=6, steps=462, generation_tokens=903, process_start_time=now - 3600)

    def poll_all() -> None:
        for record in store:
            record.record_poll(replace(record.verdict, state="busy", up=True, started=True, snapshot=snapshot, last_poll=now,
                                       last_progress=now, steps_per_second=12.5, generation_tokens_per_second=30.25), now, 0.0021)

    def steps(pieces) -> tuple[float, float]:
        longest, total = 0.0, 0.0
        while True:
            began = time.thread_time()
            try:
                next(pieces)
            except StopIteration:
                return longest * 1e3, (total + time.thread_time() - began) * 1e3
            spent = time.thread_time() - began
            longest, total = max(longest, spent), total + spent

    def whole():  # as the old route: the readings at once, then one family per step
        yield [read(record, now) for record in store]
        yield from render_families([read(record, now) for record in store], now)

    poll_all()
    figures = {"whole": steps(whole())}
    pages = PageCache()
    pages.page(list(store), now)
    poll_all()
    figures["kept/all changed"] = steps(pages.pieces(list(store), now))
    figures["kept/none changed"] = steps(pages.pieces(list(store), now))
    return figures


COLUMNS = ("load", "floor_p50", "floor_p99", "cpu_%", "waited_%", "polls_%", "fleet_cpu_%", "scrape_ms", "scrape_max_ms",
           "alone_p50", "alone_p99", "alone_max", "during_p50", "during_p99", "during_max")


def print_row(label: str, values: dict[str, str]) -> None:
    print(f"{label:<14}" + "".join(f"{values[c]:>14}" for c in COLUMNS), flush=True)


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the children
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--baseline", type=Path, help="another commit's checkout (with its .venv), measured beside this one")
    parser.add_argument("--runs", type=int, default=1, help="the whole matrix this many times; ranges at the end")
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds after one interval before measuring")
    parser.add_argument("--window", type=float, default=15.0, help="seconds of polls alone for the CPU figure")
    parser.add_argument("--probes", type=int, default=1000, help="probes timed alone, and again during scrapes")
    parser.add_argument("--scrapes", type=int, default=10, help="single scrapes timed")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    parser.add_argument("--engine", choices=("vllm", "llamacpp"), default="vllm",
                        help="the fleet's page: vLLM's, or llama.cpp's (whose unanswered /metrics counts toward stuck)")
    parser.add_argument("--metrics-timeout", help="the exporter's metrics_timeout (default: its own, 10s)")
    parser.add_argument("--stuck-after", help="every target's stuck_after (default: the exporter's, 1m)")
    parser.add_argument("--sample", type=float, default=5.0, help="--engine llamacpp: seconds between the watcher's scrapes")
    parser.add_argument("--starve", metavar="STOP:RUN",
                        help="SIGSTOP the exporter STOP seconds, let it run RUN seconds, over and over (a CPU quota)")
    args = parser.parse_args()

    checkouts = [args.baseline, REPO] if args.baseline else [REPO]
    for targets in args.targets:
        for renderer, (longest, total) in page_steps(targets).items():
            print(f"{targets}/{renderer}: one scrape's page in-process: {total:.1f} ms of CPU, longest loop step {longest:.2f} ms")
    fleet_port = free_port()
    fleet_child = subprocess.Popen([sys.executable, str(BENCH / "fleet_pages.py"), "--port", str(fleet_port),
                                    "--engine", args.engine],
                                   stdout=subprocess.PIPE, text=True, start_new_session=True)
    floor_port = free_port()
    floor_child = subprocess.Popen([sys.executable, "-c", FLOOR_SERVER, str(floor_port)], start_new_session=True)
    results: list[Result] = []
    try:
        wait_http(f"http://127.0.0.1:{floor_port}/probe/t0/ready", timeout=60.0)
        assert fleet_child.stdout is not None
        if fleet_child.stdout.readline().strip() != "ready":
            raise SystemExit("the fake fleet did not start")
        lower_priority(fleet_child.pid)
        fleet = psutil.Process(fleet_child.pid)
        print(f"{os.cpu_count()} cores, poll interval {args.interval:g} s; ms are probe and scrape latencies; "
              "load is the 1-minute load average as each measurement began")
        print_row("targets/page", {c: c for c in COLUMNS})
        for run in range(args.runs):
            for targets in args.targets:
                for checkout in checkouts:
                    result = measure(targets, checkout, fleet_port, fleet, floor_port, args)
                    results.append(result)
                    print_row(f"{targets}/{result.checkout}", {k: f"{v:.2f}" for k, v in result.figures().items()})
                    print(f"{'':<14}run {run + 1}: page {result.page_bytes / 1e6:.1f} MB, "
                          f"{result.scrapes_during} scrapes during the probes, {result.failures} failed probes or scrapes"
                          + (f"; MISSED: {', '.join(result.misses())}" if result.misses() else ""), flush=True)
                    if result.verdicts:
                        print(f"{'':<14}verdicts: " + ", ".join(f"{k} {v:g}" for k, v in result.verdicts.items()), flush=True)
    finally:
        for child in (fleet_child, floor_child):
            child.terminate()
            child.wait(timeout=10)

    print("\nranges over runs (min-max):")
    print_row("targets/page", {c: c for c in COLUMNS})
    for targets in args.targets:
        for checkout in checkouts:
            mine = [r.figures() for r in results if r.targets == targets and r.checkout == label(checkout)]
            print_row(f"{targets}/{label(checkout)}", {c: f"{min(f[c] for f in mine):.1f}-{max(f[c] for f in mine):.1f}"
                                                       for c in COLUMNS})
    if args.engine != "vllm":
        print("\nverdicts, ranges over runs (min-max): stuck is the exporter's own doing (every target busy and moving)")
        for targets in args.targets:
            for checkout in checkouts:
                mine = [r.verdicts for r in results if r.targets == targets and r.checkout == label(checkout) and r.verdicts]
                if mine:
                    print(f"{targets}/{label(checkout)}: " + ", ".join(
                        f"{k} {min(m[k] for m in mine):g}-{max(m[k] for m in mine):g}" for k in mine[0]))
    if args.json:
        args.json.write_text(json.dumps([{"targets": r.targets, "checkout": r.checkout, **r.figures(),
                                          "page_bytes": r.page_bytes, "scrapes_during": r.scrapes_during,
                                          **r.verdicts}
                                         for r in results], indent=1))
    missed = [m for r in results for m in r.misses()]
    print("PASS" if not missed else f"FAIL: {len(missed)} figure(s) over target (see MISSED above)")
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
