"""Per-page parse time of the vLLM adapter against prometheus-client's parser, in the same run.

Target (issue 3): >= 40x faster than prometheus-client, and <= 0.3 ms a page, on the real 51 KB
busy page. Prints the figures; exits 1 when a target is missed.

    .venv/bin/python bench/bench_parse.py [--seconds 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from llm_vitals.exporter.engines.vllm import parse_page  # noqa: E402

PAGE = REPO / "tests" / "fixtures" / "vllm" / "vllm-0.32.0-cpu-metrics-busy.txt"


def per_call(function, argument, seconds: float) -> float:
    """Best-of-5 mean seconds per call, each round running about seconds/5."""
    best = float("inf")
    for _ in range(5):
        calls, started = 0, time.perf_counter()
        deadline = started + seconds / 5
        while True:
            function(argument)
            calls += 1
            now = time.perf_counter()
            if now >= deadline:
                break
        best = min(best, (now - started) / calls)
    return best


def reference(text: str) -> None:
    for family in text_string_to_metric_families(text):
        for _ in family.samples:
            pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time per parser")
    args = parser.parse_args()
    body = PAGE.read_bytes()
    text = body.decode()
    ours = per_call(parse_page, body, args.seconds)  # from bytes, decoding included
    theirs = per_call(reference, text, args.seconds)  # from an already-decoded str
    ratio = theirs / ours
    print(f"page: {PAGE.name} ({len(body) / 1000:.1f} kB, {text.count(chr(10))} lines)")
    print(f"adapter (targeted scan):       {ours * 1e3:8.3f} ms/page")
    print(f"prometheus-client text parser: {theirs * 1e3:8.3f} ms/page")
    print(f"ratio: {ratio:.1f}x faster (target >= 40x); adapter {ours * 1e3:.3f} ms (target <= 0.3 ms)")
    ok = ratio >= 40 and ours <= 0.3e-3
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
