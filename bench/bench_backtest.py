"""llm-vitals-backtest over a week at 15 s for 200 targets: its time and peak memory (issue 32, part 5).

The history is synthetic and made on demand, chunk by chunk, by an in-memory `Source` (below the
HTTP layer: the same pass, the same adapter, verdict, rules and gate as against Prometheus), so the
bench measures the backtest and not a store. Each target scrapes vLLM's families every 15 s (17
series, the queue-time histogram's bucket at the watchdog's bound included). One in ten hangs
(from day 3 on, an hour apart) for 10 minutes, its scrapes stop for 90 s and it restarts; half are saturated throughout;
the rest alternate an hour busy, an hour idle.

Reported: wall time, CPU time (with --jobs, of every process), the time spent making the samples
(the source's, not the backtest's; with one job), reads per CPU second, and the peak resident
memory (ru_maxrss) of the main process and of the largest reading process. The pass checks
its own result: one stuck episode and one would-be restart per hung target (gated: at most one
restart per cooldown fleet-wide), none on the others.

Targets: a week at 15 s for 200 targets under a minute and under 500 MB.

    .venv/bin/python bench/bench_backtest.py [--targets 200] [--days 7] [--step 15] [--jobs N]
"""

from __future__ import annotations

import argparse
import functools
import re
import resource
import sys
import time
from array import array
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from llm_vitals.backtest.history import Series  # noqa: E402
from llm_vitals.backtest.rules import load_rules  # noqa: E402
from llm_vitals.backtest.run import Options, Window, backtest  # noqa: E402

T0 = 1_790_000_000.0
HANG_DAY = 3
HANG_SECONDS, GAP_SECONDS = 600.0, 90.0
ALTERNATE = 240  # scrapes busy, then as many idle
REASONS = ("stop", "length", "abort", "error", "repetition")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
_NAMES = re.compile(r'__name__(=~?)"([^"]*)"')
_INSTANCES = re.compile(r'instance=~"([^"]*)"')


class FleetHistory:
    """The whole fleet's history as a function of time: any (family, chunk) made when asked."""

    def __init__(self, targets: int, step: float) -> None:
        self.step = step
        self.targets = [f"gpu-{i:03d}:8000" for i in range(targets)]
        self.made_seconds = 0.0

    def kind(self, index: int) -> str:
        return "hang" if index % 10 == 0 else "saturated" if index % 2 else "alternating"

    def _hang_k(self, index: int) -> int:
        # The hung targets (every tenth) hang an hour apart from day 3 on, each past the last's cooldown.
        return int((HANG_DAY * 86400 + (index // 10) * 3600) / self.step)

    def _state(self, index: int, k: int) -> tuple[bool, int, int, float] | None:
        """(busy, work done in this lifetime in scrapes, lifetime's first scrape, its start time); None: no scrape."""
        kind = self.kind(index)
        if kind == "hang":
            hang = self._hang_k(index)
            gap_from, gap_to = hang + int(HANG_SECONDS / self.step), hang + int((HANG_SECONDS + GAP_SECONDS) / self.step)
            if gap_from <= k < gap_to:
                return None
            if k >= gap_to:
                return True, k - gap_to, gap_to, T0 + gap_to * self.step
            return True, min(k, hang), 0, T0 - 60
        if kind == "saturated":
            return True, k, 0, T0 - 60
        busy = (k // ALTERNATE) % 2 == 0
        done = (k // (2 * ALTERNATE)) * ALTERNATE + min(k % (2 * ALTERNATE), ALTERNATE)
        return busy, done, 0, T0 - 60

    def value(self, name: str, labels: dict[str, str], index: int, k: int) -> float | None:
        state = self._state(index, k)
        if state is None:
            return None
        busy, done, _, started = state
        hung = self.kind(index) == "hang" and self._hang_k(index) <= k < self._hang_k(index) + HANG_SECONDS / self.step
        if name == "vllm:num_requests_running":
            return 2.0 if busy else 0.0
        if name == "vllm:num_requests_waiting":
            return 6.0 if busy else 0.0
        if name == "vllm:iteration_tokens_total_count":
            return 30.0 * done
        if name == "vllm:generation_tokens_total":
            return 60.0 * done
        if name == "vllm:prompt_tokens_total":
            return 5.0 * done
        if name == "vllm:request_success_total":
            return float(done // 4) if labels.get("finished_reason") == "length" else 0.0
        if name == "vllm:kv_cache_usage_perc":
            return 0.5 if busy or hung else 0.0
        if name == "process_start_time_seconds":
            return started
        if name == "vllm:engine_sleep_state":
            return 1.0 if labels.get("sleep_state") == "awake" else 0.0
        if name == "vllm:request_queue_time_seconds_count":
            return float(done // 4)
        if name == "vllm:request_queue_time_seconds_bucket":
            return 0.0  # every request waited 300 s: none within the 10 s bucket
        return None

    def label_sets(self, name: str) -> list[dict[str, str]]:
        base = {"engine": "0", "model_name": "tiny"}
        if name == "vllm:request_success_total":
            return [{**base, "finished_reason": r} for r in REASONS]
        if name == "vllm:engine_sleep_state":
            return [{**base, "sleep_state": s} for s in SLEEP_STATES]
        if name == "vllm:request_queue_time_seconds_bucket":
            return [{**base, "le": "10.0"}]
        if name == "process_start_time_seconds":
            return [{}]
        if name.startswith("vllm:"):
            return [base]
        return []


class SyntheticSource:
    """The backtest's Source over FleetHistory (what prometheus.Prometheus is over HTTP)."""

    def __init__(self, fleet: FleetHistory) -> None:
        self.fleet = fleet
        self.queries = 0

    def _targets(self, selector: str) -> list[tuple[int, str]]:
        match = _INSTANCES.search(selector)
        wanted = set(match.group(1).replace("\\\\", "\\").replace("\\", "").split("|")) if match else None
        return [(i, t) for i, t in enumerate(self.fleet.targets) if wanted is None or t in wanted]

    def _names(self, selector: str) -> list[str]:
        match = _NAMES.search(selector)
        assert match is not None
        return match.group(2).split("|") if match.group(1) == "=~" else [match.group(2)]

    def series(self, selector: str, start: float, end: float) -> list[dict[str, str]]:
        self.queries += 1
        return [{"__name__": name, "instance": target, "job": "vllm", **labels}
                for name in self._names(selector) for target in self.fleet.targets
                for labels in self.fleet.label_sets(name)]

    def samples(self, selector: str, start: float, end: float) -> list[Series]:
        began = time.process_time()
        self.queries += 1
        step = self.fleet.step
        first, last = int((start - T0) // step) + 1, int((end - T0) // step)
        found = []
        for name in self._names(selector):
            for index, target in self._targets(selector):
                for labels in self.fleet.label_sets(name):
                    times, values = array("d"), array("d")
                    for k in range(max(0, first), last + 1):
                        value = self.fleet.value(name, labels, index, k)
                        if value is not None:
                            times.append(T0 + k * step)
                            values.append(value)
                    found.append(Series(name, {**labels, "instance": target, "job": "vllm"}, times, values))
        self.fleet.made_seconds += time.process_time() - began
        return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=200)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--step", type=float, default=15.0)
    parser.add_argument("--jobs", type=int, default=1, help="processes (llm-vitals-backtest --jobs)")
    args = parser.parse_args(argv)
    fleet = FleetHistory(args.targets, args.step)
    source = SyntheticSource(fleet)
    window = Window(T0 + args.step, T0 + args.days * 86400, args.step)
    wall = time.perf_counter()
    result = backtest(source, window, Options(rules=load_rules(), watchdog_timeout=10.0, jobs=args.jobs,
                                              source_factory=functools.partial(SyntheticSource, fleet),
                                              progress=lambda line: print(line, file=sys.stderr, flush=True)))
    wall = time.perf_counter() - wall
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    peak_mb, child_peak_mb = own.ru_maxrss / 1024, children.ru_maxrss / 1024
    reads = sum(t.reads for t in result.targets.values())
    # The hung targets whose hang (and the 60 s + for: 1m after it) falls within the window.
    hung = [name for i, name in enumerate(fleet.targets) if fleet.kind(i) == "hang"
            and T0 + fleet._hang_k(i) * args.step + HANG_SECONDS <= window.end]
    stuck = {name: sum(1 for e in t.episodes if e.state == "stuck") for name, t in result.targets.items()}
    wrong = [name for name, count in stuck.items() if count != (1 if name in hung else 0)]
    allowed = sum(1 for d in result.decisions if d.allowed)
    print(f"{args.targets} targets, {args.days:g} days at {args.step:g}s: {reads:,} reads in {result.chunks} chunks, "
          + (f"{source.queries} queries" if args.jobs == 1 else f"{args.jobs} processes"))
    made = f"making the samples: {fleet.made_seconds:.1f}s, " if args.jobs == 1 else ""
    print(f"wall {wall:.1f}s, CPU {cpu:.1f}s in all ({made}{reads / max(cpu, 1e-9):,.0f} reads per CPU second); "
          f"peak RSS {peak_mb:.0f} MB" + (f", {child_peak_mb:.0f} MB in the largest of {args.jobs} reading processes"
                                           if args.jobs > 1 else ""))
    print(f"stuck episodes as each history says: {'yes' if not wrong else f'NO: {wrong[:5]}'}; "
          f"would-be restarts {allowed} of {len(hung)} hangs (the rest refused: "
          f"{sorted({d.reason for d in result.decisions if not d.allowed})})")
    return 0 if not wrong else 1


if __name__ == "__main__":
    raise SystemExit(main())
