"""CPU of one exporter process polling 1,000 targets at a 5 s interval, served by one static page server.

Target (issue 3): <= 25% of one core. The exporter runs as its real CLI in a child process; its CPU
time (user + system, from /proc via psutil) is measured over a window after a warm-up, so the page
server's own CPU is not counted. The page is the real 51 KB busy page; by default its step counter
moves on every read (a fleet making progress), `--frozen` serves it unchanged (every poll then also
reads /health, the costlier stuck-check path).

Then, on the same running exporter, the latency of a readiness probe: alone (the baseline), and
while /metrics is scraped back to back (the page is ~24,000 lines at 1,000 targets). Kubernetes'
default probe timeout is 1 s; the probe must not wait for a scrape. Target: p99 during scrapes
<= 50 ms.

`--baseline DIR` measures another commit's exporter beside this one, alternating the two `--rounds`
times, and prints each figure's range per commit with the load average around each run (DIR: a
detached worktree of that commit with its own .venv, see bench/checkouts.py). Issue 21's targets at
5,000 targets, against the first wave (022c93d): CPU and probe p99 alone at or below the baseline's,
probe p99 during scrapes at most 3x this commit's p99 alone.

    .venv/bin/python bench/bench_poll_1000.py [--targets 1000] [--interval 5] [--warmup 8] [--window 20] [--frozen]
    .venv/bin/python bench/bench_poll_1000.py --targets 5000 --baseline /tmp/wave1 --rounds 2
    .venv/bin/python bench/bench_poll_1000.py --targets 5000 --workloads 1000 --baseline /tmp/main --rounds 2

`--workloads N` spreads the targets over N workloads, so each is judged beside its peers (issue 40).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil
from checkouts import exporter_command, exporter_env, label
from loopback import free_port, total_polls, wait_http

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "tests" / "fixtures" / "vllm" / "vllm-0.32.0-cpu-metrics-busy.txt"

PAGE_SERVER = r'''
import sys
from aiohttp import web
page = open(sys.argv[2], "rb").read()
frozen = sys.argv[3] == "1"
marker = b'vllm:iteration_tokens_total_count{engine="0",model_name="tiny"} 462.0'
head, tail = page.split(marker)
# The inter-token histogram's count and sum (the pace) move with the steps: each target is judged beside its peers.
pace = (b'vllm:inter_token_latency_seconds_count{engine="0",model_name="tiny"} 900.0\n'
        b'vllm:inter_token_latency_seconds_sum{engine="0",model_name="tiny"} 3.4581096600001047')
tail_head, tail_tail = tail.split(pace) if pace in tail else (tail, b"")
reads = 0
async def metrics(request):
    global reads
    reads += 1
    if frozen:
        return web.Response(body=page, content_type="text/plain")
    body = head + b'vllm:iteration_tokens_total_count{engine="0",model_name="tiny"} %d.0' % (462 + reads) + tail_head
    if tail_tail:
        body += (b'vllm:inter_token_latency_seconds_count{engine="0",model_name="tiny"} %d.0\n'
                 b'vllm:inter_token_latency_seconds_sum{engine="0",model_name="tiny"} %.4f' % (900 + 64 * reads, 3.46 + 0.25 * reads)
                 + tail_tail)
    return web.Response(body=body, content_type="text/plain")
async def health(request):
    return web.Response()
app = web.Application()
app.router.add_get("/{target}/metrics", metrics)
app.router.add_get("/{target}/health", health)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
'''


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def probe_latencies_ms(url: str, count: int) -> list[float]:
    """Sequential GETs of `url`, each timed from request to full answer (one unanswered within 10 s counts as 10 s)."""
    times = []
    for _ in range(count):
        began = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                response.read()
        except OSError:  # (a timeout included) on a box loaded enough, a probe may wait that long
            pass
        times.append((time.perf_counter() - began) * 1e3)
        time.sleep(0.005)  # a probe is periodic, not a flood
    return sorted(times)


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def probes_during_scrapes(exporter_url: str, count: int) -> tuple[list[float], list[float]]:
    """Probe latencies (ms) while another thread scrapes /metrics back to back; also each scrape's seconds."""
    stop, scrapes = threading.Event(), []

    def scrape() -> None:
        while not stop.is_set():
            began = time.perf_counter()
            try:
                with urllib.request.urlopen(exporter_url + "/metrics", timeout=30) as response:
                    response.read()
            except OSError:
                continue
            scrapes.append(time.perf_counter() - began)

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        time.sleep(0.2)
        return probe_latencies_ms(exporter_url + "/probe/t0/ready", count), scrapes
    finally:
        stop.set()
        scraper.join(timeout=30)


def measure(checkout: Path, args: argparse.Namespace) -> dict[str, float]:
    """One run of `checkout`'s exporter: its figures, and the 1-minute load average before and after."""
    page_port, exporter_port = free_port(), free_port()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "exporter.yaml"
        lines = [f'listen: "127.0.0.1:{exporter_port}"', f"poll_interval: {args.interval}", "log_level: warning", "targets:"]
        for i in range(args.targets):
            workload = f", workload: w{i % args.workloads}" if args.workloads else ""
            lines.append(f"  - {{name: t{i}, url: 'http://127.0.0.1:{page_port}/t{i}', canary: {{enabled: false}}{workload}}}")
        config.write_text("\n".join(lines) + "\n")
        server = subprocess.Popen([sys.executable, "-c", PAGE_SERVER, str(page_port), str(PAGE), "1" if args.frozen else "0"])
        exporter = None
        try:
            wait_http(f"http://127.0.0.1:{page_port}/t0/metrics")
            exporter = subprocess.Popen([*exporter_command(checkout), "--config", str(config)], env=exporter_env(checkout), cwd=checkout)
            wait_http(f"http://127.0.0.1:{exporter_port}/healthz")
            time.sleep(args.warmup)
            process = psutil.Process(exporter.pid)
            polls_before, cpu_before, started = total_polls(f"http://127.0.0.1:{exporter_port}"), cpu_seconds(process), time.monotonic()
            time.sleep(args.window)
            cpu_after, elapsed = cpu_seconds(process), time.monotonic() - started
            polls = total_polls(f"http://127.0.0.1:{exporter_port}") - polls_before
            states: dict[str, int] = {}
            with urllib.request.urlopen(f"http://127.0.0.1:{exporter_port}/api/v1/targets", timeout=30) as response:
                for target in json.load(response)["targets"]:
                    states[target["state"]] = states.get(target["state"], 0) + 1
            quiet = probe_latencies_ms(f"http://127.0.0.1:{exporter_port}/probe/t0/ready", args.probes)
            scraped, scrapes = probes_during_scrapes(f"http://127.0.0.1:{exporter_port}", args.probes)
        finally:
            for child in (exporter, server):
                if child is not None:
                    child.terminate()
                    try:
                        # An exporter of 5,000 targets on a loaded box can take longer to stop: its
                        # figures are taken already, so it is killed rather than failing the bench.
                        child.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        child.kill()
                        child.wait(timeout=10)
    cpu = cpu_after - cpu_before
    return {
        "load_before": load_before, "load_after": os.getloadavg()[0], "seconds": elapsed, "cpu_s": cpu,
        "cpu_%": 100 * cpu / elapsed, "ms_per_poll": cpu / max(polls, 1) * 1e3,
        "polls": polls, "polls_%": 100 * polls / (args.targets * elapsed / args.interval), "busy": states.get("busy", 0),
        "alone_p50": percentile(quiet, 0.5), "alone_p99": percentile(quiet, 0.99),
        "during_p50": percentile(scraped, 0.5), "during_p99": percentile(scraped, 0.99), "during_max": scraped[-1],
        "scrapes": len(scrapes), "scrape_s": sum(scrapes) / max(len(scrapes), 1),
    }


def report(figures: dict[str, float], args: argparse.Namespace) -> bool:
    """Print one run as this benchmark always has; whether it meets the 1,000-target targets."""
    print(f"targets: {args.targets}, poll interval {args.interval:g}s, page {PAGE.name} ({'frozen' if args.frozen else 'moving'})")
    print(f"window: {figures['seconds']:.1f}s, polls: {figures['polls']:.0f} ({figures['polls_%']:.0f}% of the expected), "
          f"busy: {figures['busy']:.0f}; load average {figures['load_before']:.2f} before, {figures['load_after']:.2f} after")
    print(f"exporter CPU: {figures['cpu_s']:.2f}s over {figures['seconds']:.1f}s = {figures['cpu_%']:.1f}% of one core "
          f"({figures['ms_per_poll']:.2f} ms per poll); target <= 25%")
    print(f"probe /probe/t0/ready alone: p50 {figures['alone_p50']:.1f} ms, p99 {figures['alone_p99']:.1f} ms")
    print(f"probe during back-to-back /metrics scrapes ({figures['scrapes']:.0f} scrapes, {figures['scrape_s']:.2f} s each): "
          f"p50 {figures['during_p50']:.1f} ms, p99 {figures['during_p99']:.1f} ms, max {figures['during_max']:.1f} ms "
          f"({figures['during_p99'] / figures['alone_p99']:.1f}x the p99 alone); target p99 <= 50 ms", flush=True)
    return figures["cpu_%"] <= 25 and figures["polls_%"] >= 90 and figures["during_p99"] <= 50.0


COLUMNS = ("load_before", "load_after", "cpu_%", "ms_per_poll", "polls_%", "alone_p50", "alone_p99", "during_p50", "during_p99",
           "scrape_s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds before measuring (first polls are spread over one interval)")
    parser.add_argument("--window", type=float, default=20.0, help="seconds of measurement")
    parser.add_argument("--probes", type=int, default=300, help="probes timed alone, and again during scrapes")
    parser.add_argument("--workloads", type=int, default=0,
                        help="spread the targets over this many workloads (peers whose pace is compared); 0: each its own")
    parser.add_argument("--frozen", action="store_true", help="serve the page unchanged (stuck path: + /health each poll)")
    parser.add_argument("--baseline", type=Path, help="another commit's checkout (with its .venv), measured alternately with this one")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each checkout, alternating")
    args = parser.parse_args()

    checkouts = [args.baseline, REPO] if args.baseline else [REPO]
    runs: dict[str, list[dict[str, float]]] = {label(checkout): [] for checkout in checkouts}
    ok = True
    for round_ in range(args.rounds):
        for checkout in checkouts:
            print(f"== {label(checkout)} ({checkout}), round {round_ + 1}")
            figures = measure(checkout, args)
            runs[label(checkout)].append(figures)
            ok = report(figures, args) and ok
    if args.baseline or args.rounds > 1:
        print("\nranges over runs (min-max); load_* is the 1-minute load average before and after each run")
        print(f"{'':<12}" + "".join(f"{column:>14}" for column in COLUMNS))
        for name, figures in runs.items():
            print(f"{name:<12}" + "".join(f"{min(f[c] for f in figures):>6.2f}-{max(f[c] for f in figures):<7.2f}" for c in COLUMNS))
        if args.baseline:
            base, this = runs[label(args.baseline)], runs["this"]
            worst_this = {c: max(f[c] for f in this) for c in COLUMNS}
            best_base = {c: min(f[c] for f in base) for c in COLUMNS}
            print(f"this commit's worst against the baseline's best: CPU {worst_this['cpu_%']:.1f}% vs {best_base['cpu_%']:.1f}%, "
                  f"probe p99 alone {worst_this['alone_p99']:.1f} vs {best_base['alone_p99']:.1f} ms; "
                  f"p99 during scrapes / p99 alone, per run: "
                  + ", ".join(f"{f['during_p99'] / f['alone_p99']:.1f}x" for f in this))
        return 0
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
