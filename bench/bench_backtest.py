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
import json
import os
import re
import resource
import subprocess
import sys
import time
from array import array
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
# The checkout whose backtest a measuring process imports (the baseline's, or this one).
CHECKOUT_ENV = "BENCH_BACKTEST_CHECKOUT"
_IMPORTED = os.environ.get(CHECKOUT_ENV, str(REPO))
if _IMPORTED not in sys.path:
    sys.path.insert(0, _IMPORTED)

from checkouts import label  # noqa: E402

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

    def values(self, name: str, labels: dict[str, str], index: int, ks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`value` over many scrapes at once: (the scrapes that have a sample, their values)."""
        kind = self.kind(index)
        keep = np.ones(len(ks), dtype=bool)
        started = np.full(len(ks), T0 - 60)
        if kind == "hang":
            hang = self._hang_k(index)
            gap_from, gap_to = hang + int(HANG_SECONDS / self.step), hang + int((HANG_SECONDS + GAP_SECONDS) / self.step)
            keep = (ks < gap_from) | (ks >= gap_to)
            after = ks >= gap_to
            busy = np.ones(len(ks), dtype=bool)
            done = np.where(after, ks - gap_to, np.minimum(ks, hang))
            started = np.where(after, T0 + gap_to * self.step, T0 - 60)
            hung = (ks >= hang) & (ks < hang + HANG_SECONDS / self.step)
        elif kind == "saturated":
            busy, done, hung = np.ones(len(ks), dtype=bool), ks.copy(), np.zeros(len(ks), dtype=bool)
        else:
            busy = (ks // ALTERNATE) % 2 == 0
            done = (ks // (2 * ALTERNATE)) * ALTERNATE + np.minimum(ks % (2 * ALTERNATE), ALTERNATE)
            hung = np.zeros(len(ks), dtype=bool)
        done = done.astype(float)
        made: np.ndarray | float
        if name == "vllm:num_requests_running":
            made = np.where(busy, 2.0, 0.0)
        elif name == "vllm:num_requests_waiting":
            made = np.where(busy, 6.0, 0.0)
        elif name == "vllm:iteration_tokens_total_count":
            made = 30.0 * done
        elif name == "vllm:generation_tokens_total":
            made = 60.0 * done
        elif name == "vllm:prompt_tokens_total":
            made = 5.0 * done
        elif name == "vllm:request_success_total":
            made = done // 4 if labels.get("finished_reason") == "length" else 0.0
        elif name == "vllm:kv_cache_usage_perc":
            made = np.where(busy | hung, 0.5, 0.0)
        elif name == "process_start_time_seconds":
            made = started
        elif name == "vllm:engine_sleep_state":
            made = 1.0 if labels.get("sleep_state") == "awake" else 0.0
        elif name == "vllm:request_queue_time_seconds_count":
            made = done // 4
        elif name == "vllm:request_queue_time_seconds_bucket":
            made = 0.0
        else:
            return ks[:0], np.zeros(0)
        return ks[keep], np.broadcast_to(np.asarray(made, dtype=float), ks.shape)[keep]

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
        ks = np.arange(max(0, first), last + 1)
        for name in self._names(selector):
            for index, target in self._targets(selector):
                for labels in self.fleet.label_sets(name):
                    scraped, made = self.fleet.values(name, labels, index, ks)
                    times, values = array("d"), array("d")
                    times.frombytes((T0 + scraped * step).astype(float).tobytes())
                    values.frombytes(np.ascontiguousarray(made).tobytes())
                    found.append(Series(name, {**labels, "instance": target, "job": "vllm"}, times, values))
        self.fleet.made_seconds += time.process_time() - began
        return found


def measure(targets: int, days: float, step: float, jobs: int) -> dict[str, object]:
    """One pass of the backtest of whatever checkout this process imported; its figures."""
    fleet = FleetHistory(targets, step)
    source = SyntheticSource(fleet)
    window = Window(T0 + step, T0 + days * 86400, step)
    wall = time.perf_counter()
    # Today's backtest (issue 32) has no `fast` option: both run with what they have.
    result = backtest(source, window, Options(rules=load_rules(), watchdog_timeout=10.0, jobs=jobs,
                                              source_factory=functools.partial(SyntheticSource, fleet)))
    wall = time.perf_counter() - wall
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    reads = sum(t.reads for t in result.targets.values())
    # The hung targets whose hang (and the 60 s + for: 1m after it) falls within the window.
    hung = [name for i, name in enumerate(fleet.targets) if fleet.kind(i) == "hang"
            and T0 + fleet._hang_k(i) * step + HANG_SECONDS <= window.end]
    stuck = {name: sum(1 for e in t.episodes if e.state == "stuck") for name, t in result.targets.items()}
    wrong = [name for name, count in stuck.items() if count != (1 if name in hung else 0)]
    return {"reads": reads, "wall": wall, "cpu": cpu, "made": fleet.made_seconds if jobs == 1 else None,
            "load": os.getloadavg()[0],
            "peak_mb": own.ru_maxrss / 1024, "child_peak_mb": children.ru_maxrss / 1024, "wrong": wrong[:5],
            "hangs": len(hung), "allowed": sum(1 for d in result.decisions if d.allowed)}


def run_child(checkout: Path, targets: int, days: float, step: float, jobs: int) -> dict[str, object]:
    """`measure` in a fresh process importing `checkout`'s llm_vitals: its own peak memory, no warm caches."""
    env = {**os.environ, CHECKOUT_ENV: str(checkout.resolve())}
    done = subprocess.run([sys.executable, __file__, "--measure", "--targets", str(targets), "--days", str(days),
                           "--step", str(step), "--jobs", str(jobs)], env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"{label(checkout)}: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _range(values: list[float], fmt: str) -> str:
    low, high = format(min(values), fmt), format(max(values), fmt)
    return low if low == high else f"{low}-{high}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=200)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--step", type=float, default=15.0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="processes (llm-vitals-backtest --jobs; default: the cores)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                        help="a checkout of the backtest to compare with (git worktree add --detach DIR main)")
    parser.add_argument("--baseline-targets", type=int, default=20,
                        help="targets of the slice both checkouts replay, one process each (the baseline's "
                             "whole week would take some 12 CPU minutes a run)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.targets, args.days, args.step, args.jobs)))
        return 0
    slices: dict[str, list[dict[str, object]]] = {"this": [], "baseline": []}
    full: list[dict[str, object]] = []
    for run in range(args.runs):
        if args.baseline is not None:
            for name, checkout in (("baseline", args.baseline), ("this", REPO)):
                slices[name].append(one := run_child(checkout, args.baseline_targets, args.days, args.step, 1))
                print(f"run {run + 1} slice {label(checkout)}: {one}", file=sys.stderr, flush=True)
        full.append(one := run_child(REPO, args.targets, args.days, args.step, args.jobs))
        print(f"run {run + 1} full: {one}", file=sys.stderr, flush=True)
    rate = [float(r["reads"]) / float(r["cpu"]) for r in full]  # type: ignore[arg-type]
    print(f"{args.targets} targets, {args.days:g} days at {args.step:g}s, {full[0]['reads']:,} reads, "
          f"--jobs {args.jobs}, {args.runs} run(s): wall {_range([float(r['wall']) for r in full], '.1f')} s, "  # type: ignore[arg-type]
          f"CPU {_range([float(r['cpu']) for r in full], '.1f')} s, {_range(rate, ',.0f')} reads per CPU second; "  # type: ignore[arg-type]
          f"peak RSS {_range([float(r['peak_mb']) for r in full], '.0f')} MB (main), "  # type: ignore[arg-type]
          f"{_range([float(r['child_peak_mb']) for r in full], '.0f')} MB (largest reading process); "  # type: ignore[arg-type]
          f"load average {_range([float(r['load']) for r in full], '.1f')} at the end of each run; CPU / {args.jobs} "  # type: ignore[arg-type]
          f"(the wall time on {args.jobs} idle cores) {_range([float(r['cpu']) / args.jobs for r in full], '.1f')} s")  # type: ignore[arg-type]
    if args.baseline is not None:
        speeds = {name: [float(r["reads"]) / float(r["cpu"]) for r in runs] for name, runs in slices.items()}  # type: ignore[arg-type]
        ratios = [new / old for new, old in zip(speeds["this"], speeds["baseline"], strict=True)]
        print(f"slice of {args.baseline_targets} targets, one process: baseline ({label(args.baseline)}) "
              f"{_range(speeds['baseline'], ',.0f')} reads per CPU second, this {_range(speeds['this'], ',.0f')}: "
              f"{_range(ratios, '.1f')}x; the baseline's whole run would take about "
              f"{float(full[0]['reads']) / min(speeds['baseline']) / 60:.0f} CPU minutes")  # type: ignore[arg-type]
    wrong = [r["wrong"] for r in full if r["wrong"]]
    print(f"stuck episodes as each history says: {'yes' if not wrong else f'NO: {wrong[0]}'}; would-be restarts "
          f"{full[0]['allowed']} of {full[0]['hangs']} hangs (the rest refused by the gate's cooldown)")
    return 0 if not wrong else 1


if __name__ == "__main__":
    raise SystemExit(main())
