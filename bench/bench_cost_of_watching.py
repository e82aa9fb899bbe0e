"""The cost of watching (issue 23, part 8): a real engine's throughput under a fixed saturating load,
with the exporter polling it every 1 s, every 5 s, and not at all.

Our rule is that a health check must not use what it guards, and llama.cpp serves /metrics from its
own engine loop. So, on the real engines of the tiers (tests/real_<engine>/: the kit's launchers,
its load generator and each tier's built parts, cached outside the clone), for each engine:

- one server for the whole run, warmed up once;
- `--rounds` rounds; each round measures the three configurations, in an order that turns by one
  each round (drift on a shared box falls on each configuration alike);
- one measurement: the exporter started (or not), the engine's sustained saturating load (more
  clients than slots, fixed-size requests), `--settle` seconds, then the engine's own work counter
  over `--window` seconds (vLLM and SGLang: generation tokens; llama.cpp: decode calls, which move
  each step where its token counter moves only at a request's end; Triton: requests answered).
  The bench's own reads are the same in every configuration: the counter at both ends of the window,
  and a 1-token request every `--probe-every` seconds (the chat-request watchdog this project
  replaces), whose latency is kept;
- with the exporter on, its own `llm_vitals_poll_duration_seconds` (how long its last poll of the
  engine took) is read every 2 s: the read time of a poll, beside the 1-token request's latency.

It prints, per engine, throughput with the exporter at 1 s and at 5 s as a ratio to no exporter in
the same round (median and range over rounds), the spread of the no-exporter runs themselves (the
noise), the exporter's read time and the 1-token latency; with the load average around each
measurement. The target is a cost within the noise, or under 1 %: it is reported, never asserted.
Results also go to .cache/bench-cost-of-watching/<engine>.json.

An engine whose tier is not built here is one SKIPPED line (`make test-<engine>` builds it), and the
exit status is 0; 1 only on a real error (a server that does not start, a load that fails).
Not in `make bench`: it needs the real engines and minutes per engine on a quiet box (`make bench-cost`).

    .venv/bin/python bench/bench_cost_of_watching.py [--engines vllm,llamacpp,sglang,triton] [--rounds 3]
        [--window 20] [--settle 4] [--probe-every 5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
OUT = REPO / ".cache" / "bench-cost-of-watching"  # <engine>.json each, and the servers' and exporters' logs
ENGINES = ("vllm", "llamacpp", "sglang", "triton")
CONFIGS: tuple[float | None, ...] = (None, 1.0, 5.0)  # the exporter's poll interval; None: no exporter
POLL_DURATION = "llm_vitals_poll_duration_seconds"


@dataclass(frozen=True)
class Workload:
    """One engine's saturating load and its 1-token request, and the counter its throughput is read from."""

    path: str
    body: dict
    clients: int  # more than the engine's slots: requests always wait
    one_token: dict  # a 1-token request on `path`
    counter: str  # the engine's own work counter (a sample name, summed over its labels)
    unit: str  # what the counter counts, per second


def workload(key: str) -> Workload:
    """Each engine's load, from its tier's own request bodies (tests/real_<engine>/engine.py)."""
    if key == "vllm":
        from real_vllm.engine import COMPLETIONS, generation

        return Workload(COMPLETIONS, generation(128), 8, generation(1), "vllm:generation_tokens_total", "tokens/s")
    if key == "llamacpp":
        body = {"prompt": "Once upon a time", "n_predict": 128, "ignore_eos": True, "cache_prompt": False}
        return Workload("/completion", body, 6, body | {"n_predict": 1}, "llamacpp:n_decode_total", "decodes/s")
    if key == "sglang":
        from real_sglang.engine import GENERATE, generations

        return Workload(GENERATE, generations(1, 128)[0], 6, generations(1, 1)[0], "sglang:generation_tokens_total", "tokens/s")
    if key == "triton":
        from real_triton.engine import INFER, LOAD_TOKENS
        from real_triton.triton_server import infer_body

        return Workload(INFER, infer_body(LOAD_TOKENS), 8, infer_body(1), "nv_inference_request_success_total", "requests/s")
    raise ValueError(f"unknown engine {key!r}; one of {', '.join(ENGINES)}")


def llamacpp_paths() -> str | None:
    """Hand llama.cpp's built binary and model to its launcher (as tools/real-llamacpp-test.sh does); why not, if not built."""
    if os.environ.get("LLM_VITALS_LLAMACPP_BIN") and os.environ.get("LLM_VITALS_LLAMACPP_MODEL"):
        return None
    done = subprocess.run(["bash", str(REPO / "tools" / "real-llamacpp-setup.sh")], capture_output=True, text=True,
                          env={**os.environ, "LLM_VITALS_CACHED_ONLY": "1"}, timeout=60, check=False)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode != 0 or not last.startswith("BIN="):
        return last or done.stderr.strip() or f"tools/real-llamacpp-setup.sh exited {done.returncode}"
    os.environ["LLM_VITALS_LLAMACPP_BIN"] = last.removeprefix("BIN=").split(" MODEL=")[0]
    os.environ["LLM_VITALS_LLAMACPP_MODEL"] = last.split(" MODEL=")[1]
    return None


def load_engine(key: str) -> tuple[Any, str | None]:
    """The tier's Engine, and why it cannot run here (None when its built parts are in place)."""
    if key == "llamacpp":
        why = llamacpp_paths()
        if why:
            return None, why
    module = __import__(f"real_{key}.engine", fromlist=["ENGINE"])
    engine = module.ENGINE
    return engine, engine.setup_missing()


@dataclass
class Measurement:
    interval: float | None
    rate: float  # the counter's units per second over the window
    window_s: float
    loadavg: tuple[float, float, float]
    one_token_s: list[float] = field(default_factory=list)
    poll_s: list[float] = field(default_factory=list)  # the exporter's own poll durations, sampled
    exporter_cpu: float | None = None  # the exporter process's CPU (user + system) over the window, in cores
    errors: int = 0  # load requests that did not answer 200


def label(interval: float | None) -> str:
    return "none" if interval is None else f"{interval:g}s"


@contextmanager
def exporter_at(engine: Any, server: Any, interval: float | None, log_dir: Path) -> Iterator[Any]:
    """The real exporter polling the server every `interval` seconds (nothing when None), stopped at the end."""
    if interval is None:
        yield None
        return
    from real_engine.harness import ExporterProcess

    settings = replace(engine.exporter, poll_interval=interval)
    exporter = ExporterProcess(settings, server.url, log_dir, target_keys=engine.target_keys(server))
    exporter.start()
    try:
        yield exporter
    finally:
        exporter.stop()


def gauge(client: httpx.Client, exporter: Any, name: str) -> float | None:
    values = exporter.counter(client, name)
    return values.get("")


def measure(engine: Any, server: Any, work: Workload, interval: float | None, args: argparse.Namespace, log_dir: Path) -> Measurement:
    """One configuration: the exporter (or none), the load, the counter over the window; the 1-token probes beside."""
    from real_engine.load import Load, engine_counter

    with exporter_at(engine, server, interval, log_dir) as exporter:
        load = Load.sustained(server.url, work.path, lambda _n: work.body, work.clients, max_seconds=args.settle + args.window + 120)
        with load:
            time.sleep(args.settle)
            stop = threading.Event()
            one_token: list[float] = []
            poll_s: list[float] = []

            def probe() -> None:
                single = Load(server.url, work.path)
                while not stop.wait(args.probe_every / 2):
                    outcome = single.post(work.one_token)
                    if outcome.status == 200:
                        one_token.append(outcome.seconds)
                    if stop.wait(args.probe_every / 2):
                        return

            def polls() -> None:
                with httpx.Client(timeout=10) as client:
                    while not stop.wait(2.0):
                        value = gauge(client, exporter, POLL_DURATION)
                        if value is not None:
                            poll_s.append(value)

            threads = [threading.Thread(target=probe, daemon=True)]
            if exporter is not None:
                threads.append(threading.Thread(target=polls, daemon=True))
            began_load = os.getloadavg()
            cpu0 = cpu_seconds(exporter)
            c0, t0 = engine_counter(server.metrics_url, work.counter), time.monotonic()
            for thread in threads:
                thread.start()
            time.sleep(args.window)
            c1, t1 = engine_counter(server.metrics_url, work.counter), time.monotonic()
            cpu1 = cpu_seconds(exporter)
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
            load.stop()  # the requests in flight are short: they end by themselves
            outcomes = load.wait(timeout=300)
    ended_load = os.getloadavg()
    avg = (round((began_load[0] + ended_load[0]) / 2, 2), round((began_load[1] + ended_load[1]) / 2, 2),
           round((began_load[2] + ended_load[2]) / 2, 2))
    errors = sum(o.status != 200 for o in outcomes)
    cpu = (cpu1 - cpu0) / (t1 - t0) if cpu0 is not None and cpu1 is not None else None
    return Measurement(interval, (c1 - c0) / (t1 - t0), t1 - t0, avg, one_token, poll_s, exporter_cpu=cpu, errors=errors)


def cpu_seconds(exporter: Any) -> float | None:
    """The exporter process's CPU time so far (None without one)."""
    if exporter is None or exporter._proc is None:
        return None
    times = psutil.Process(exporter._proc.pid).cpu_times()
    return float(times.user + times.system)


def wait_quiet(server: Any, work: Workload, timeout: float = 120.0) -> None:
    """Until the engine's own counter stops moving (the last load's requests are done)."""
    from real_engine.load import engine_counter

    deadline = time.monotonic() + timeout
    last = engine_counter(server.metrics_url, work.counter)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = engine_counter(server.metrics_url, work.counter)
        if now == last:
            return
        last = now


def spread(values: list[float]) -> dict:
    if not values:
        return {}
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}


def run_engine(key: str, args: argparse.Namespace) -> dict | None:
    engine, why = load_engine(key)
    if why:
        print(f"SKIPPED {key}: {why}", flush=True)
        return None
    work = workload(key)
    log_dir = OUT / key
    log_dir.mkdir(parents=True, exist_ok=True)
    server = engine.launcher()
    server.log_dir = log_dir
    try:
        started = engine.start(server)
        print(f"== {engine.name}: ready in {started:.1f} s; load: {work.clients} clients of {work.path}; "
              f"counter {work.counter}", flush=True)
        # A warm-up, not measured: the first requests of a fresh server are slower (allocations, caches).
        warm = argparse.Namespace(**{**vars(args), "window": args.settle})
        measure(engine, server, work, None, warm, log_dir)
        wait_quiet(server, work)
        runs: list[Measurement] = []
        for round_no in range(args.rounds):
            turn = round_no % len(CONFIGS)
            for interval in CONFIGS[turn:] + CONFIGS[:turn]:
                m = measure(engine, server, work, interval, args, log_dir)
                wait_quiet(server, work)
                runs.append(m)
                cpu = f"{100 * m.exporter_cpu:.1f} %" if m.exporter_cpu is not None else "-"
                print(f"  round {round_no + 1} exporter {label(interval):>4}: {m.rate:9.1f} {work.unit}  exporter CPU {cpu}"
                      f"  1-token {fmt(m.one_token_s)}  poll {fmt(m.poll_s)}  errors {m.errors}  load {m.loadavg}", flush=True)
    finally:
        server.stop()
    result = summarize(engine, work, runs, args)
    (OUT / f"{key}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.3f}s (n={len(values)})" if values else "-"


def summarize(engine: Any, work: Workload, runs: list[Measurement], args: argparse.Namespace) -> dict:
    """Ratios to no exporter in the same round, the no-exporter runs' own spread, read times and 1-token latencies."""
    per_round = [runs[i:i + len(CONFIGS)] for i in range(0, len(runs), len(CONFIGS))]
    ratios: dict[str, list[float]] = {}
    for measured in per_round:
        base = next(m.rate for m in measured if m.interval is None)
        for m in measured:
            if m.interval is not None:
                ratios.setdefault(label(m.interval), []).append(m.rate / base)
    bases = [m.rate for m in runs if m.interval is None]
    noise = (max(bases) - min(bases)) / statistics.median(bases) if len(bases) > 1 else None
    return {
        "engine": engine.name,
        "unit": work.unit,
        "counter": work.counter,
        "clients": work.clients,
        "rounds": args.rounds,
        "window_s": args.window,
        "rate_by_config": {label(c): spread([m.rate for m in runs if m.interval == c]) for c in CONFIGS},
        "ratio_to_none": {name: spread(values) for name, values in ratios.items()},
        "none_spread": round(noise, 4) if noise is not None else None,
        "exporter_poll_s": {label(c): spread([s for m in runs if m.interval == c for s in m.poll_s]) for c in CONFIGS[1:]},
        "exporter_cpu_cores": {label(c): spread([m.exporter_cpu for m in runs if m.interval == c and m.exporter_cpu is not None])
                               for c in CONFIGS[1:]},
        "one_token_s": spread([s for m in runs for s in m.one_token_s]),
        "loadavg": spread([m.loadavg[0] for m in runs]),
        "load_errors": sum(m.errors for m in runs),
        "runs": [m.__dict__ for m in runs],
    }


def table(results: list[dict]) -> list[str]:
    head = ("| engine | throughput, no exporter | exporter 1 s / none | exporter 5 s / none | none vs none | "
            "exporter CPU (1 s) | exporter's poll (1 s) | 1-token request | load avg (1 min) |")
    lines = [head, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        base = r["rate_by_config"]["none"]
        one, five = r["ratio_to_none"].get("1s", {}), r["ratio_to_none"].get("5s", {})
        poll, probe, load = r["exporter_poll_s"].get("1s", {}), r["one_token_s"], r["loadavg"]
        cpu = r["exporter_cpu_cores"].get("1s", {})
        cpu_text = f"{100 * cpu['median']:.1f} % of a core" if cpu else "-"
        lines.append(
            f"| {r['engine']} | {base['median']:.1f} {r['unit']} | {ratio(one)} | {ratio(five)} | "
            f"±{100 * (r['none_spread'] or 0) / 2:.1f} % | {cpu_text} | "
            f"{ms(poll)} | {ms(probe)} | {load.get('min', 0):.2f}-{load.get('max', 0):.2f} |")
    return lines


def ratio(values: dict) -> str:
    return f"{values['median']:.3f} ({values['min']:.3f}-{values['max']:.3f})" if values else "-"


def ms(values: dict) -> str:
    return f"{1000 * values['median']:.0f} ms ({1000 * values['min']:.0f}-{1000 * values['max']:.0f})" if values else "-"


def interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=4.0)
    parser.add_argument("--probe-every", type=float, default=5.0)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(TESTS))  # the tiers' packages: real_engine, real_tier, real_<engine>
    # SIGTERM (timeout, or a background run whose SIGINT is ignored) as an interrupt: the servers
    # are in sessions of their own and are stopped by PID in run_engine's `finally`.
    signal.signal(signal.SIGTERM, interrupted)
    keys = [key.strip() for key in args.engines.split(",")]
    unknown = [key for key in keys if key not in ENGINES]
    if unknown:
        parser.error(f"unknown engine(s) {', '.join(unknown)}; the tiers are {', '.join(ENGINES)}")
    results: list[dict] = []
    for key in keys:
        result = run_engine(key, args)
        if result is not None:
            results.append(result)
            if result["load_errors"]:
                print(f"ERROR {result['engine']}: {result['load_errors']} load requests did not answer 200", file=sys.stderr)
                return 1
    if not results:
        print("no engine could run here: nothing measured")
        return 0
    print()
    for line in table(results):
        print(line)
    print(f"\nratios: throughput with the exporter / without, in the same round (median, range over {args.rounds} rounds); "
          f"none vs none: half the range of the no-exporter runs over their median. Details: {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
