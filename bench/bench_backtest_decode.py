"""What reading Prometheus's answers costs the backtest: its own client, over loopback, per sample.

bench_backtest.py makes its history in memory (below the HTTP layer); against a real Prometheus the
backtest's process also receives and decodes every sample as JSON. This bench serves, from another
process on loopback, the answers a Prometheus gives to the backtest's range selectors: the bench
fleet's series (bench_backtest.FleetHistory, the same families, labels and values, written as
Prometheus writes them), one chunk of 1,440 scrapes of one family for a group of 25 targets per
answer. The backtest's client (`backtest.prometheus.Prometheus.samples`) asks for each family in
turn; only the client's process CPU is counted (the server's is Prometheus's, on its own machine).

Reported: the client's CPU per sample, per target-read (every series the backtest reads of one
target, at one scrape), and what that makes for a week at 15 s of 200 targets, against the 120 CPU
seconds that a minute's wall on two cores holds (issue 41's target).

    .venv/bin/python bench/bench_backtest_decode.py [--rounds 3] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_backtest import T0, FleetHistory, SyntheticSource, _range  # noqa: E402
from loopback import free_port, wait_http  # noqa: E402

from llm_vitals.backtest.prometheus import CHUNK_POINTS, Prometheus, name_selector  # noqa: E402
from llm_vitals.backtest.run import GROUPS_PER_JOB, families  # noqa: E402
from llm_vitals.exporter.engines.table import ENGINES  # noqa: E402

STEP = 15.0
TARGETS, JOBS = 200, 2  # bench_backtest's week
GROUP = TARGETS // (JOBS * GROUPS_PER_JOB)  # targets per answer: one of the groups `--jobs 2` reads
WEEK_READS = TARGETS * 7 * 86400 // int(STEP)
BUDGET_CPU_S = 60.0 * JOBS  # a minute's wall on the two cores
_NAME = re.compile(r'__name__="([^"]*)"')


def _go_float(value: float) -> str:
    """A value as Prometheus writes it (Go's strconv.FormatFloat(v, 'f', -1, 64): the shortest digits), e.g. 1500 and 0.5."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() else repr(value)


def answers(names: list[str]) -> dict[str, bytes]:
    """Per family, Prometheus's answer to `family{...}[6h]` for the first GROUP targets of the bench fleet
    (only series with samples, as Prometheus answers; the fleet writes no `up`, and none is added)."""
    fleet = FleetHistory(GROUP, STEP)
    source = SyntheticSource(fleet)
    start, end = T0 + STEP, T0 + STEP * (CHUNK_POINTS + 1)
    out = {}
    for name in names:
        result = [{"metric": {"__name__": one.name, **one.labels},
                   "values": [[round(at, 3), _go_float(value)] for at, value in zip(one.times, one.values, strict=True)]}
                  for one in source.samples(name_selector([name], ""), start, end) if one.times]
        out[name] = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()
    return out


def serve(port: int, bodies: dict[str, bytes]) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = parse_qs(urlparse(self.path).query).get("query", [""])[0]
            match = _NAME.search(query)
            body = bodies.get(match.group(1) if match else "", b'{"status":"success","data":[]}')
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="times each family's answer is read, per figure")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    names = [*families(ENGINES["vllm"]), "vllm:request_queue_time_seconds_count",
             "vllm:request_queue_time_seconds_bucket", "up"]
    bodies = answers(names)
    port = free_port()
    server = multiprocessing.get_context("fork").Process(target=serve, args=(port, bodies), daemon=True)
    server.start()
    try:
        wait_http(f"http://127.0.0.1:{port}/api/v1/query?query=up")
        client = Prometheus(f"http://127.0.0.1:{port}")
        per_read: list[float] = []
        for run in range(args.runs):
            samples, series, began = 0, 0, time.process_time()
            for _ in range(args.rounds):
                for name in names:
                    got = client.samples(name_selector([name], ""), T0, T0 + STEP * CHUNK_POINTS)
                    samples += sum(len(one.times) for one in got)
                    series += len(got)
            cpu = time.process_time() - began
            reads = args.rounds * GROUP * CHUNK_POINTS  # each target's reads of the chunk, at every scrape
            per_read.append(cpu / reads)
            print(f"run {run + 1}: {samples:,} samples in {series // args.rounds} series per round, client CPU {cpu:.2f} s: "
                  f"{cpu / samples * 1e6:.2f} us per sample, {samples / reads:.1f} samples and "
                  f"{cpu / reads * 1e6:.1f} us per target-read", file=sys.stderr)
    finally:
        server.kill()
    week = [WEEK_READS * cost for cost in per_read]
    print(f"reading Prometheus's answers (the backtest's client, loopback): "
          f"{_range([cost * 1e6 for cost in per_read], '.1f')} us per target-read; a week at {STEP:g}s of {TARGETS} targets "
          f"({WEEK_READS:,} target-reads): {_range(week, '.0f')} CPU s for the answers alone, of the "
          f"{BUDGET_CPU_S:g} CPU s a minute on {JOBS} cores holds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
