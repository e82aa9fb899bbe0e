"""Stand-in for Prometheus in the benchmarks: GET a URL back to back (or `--count` times, `--pause`
seconds apart) until stdin closes, then print each scrape's seconds and bytes as JSON.

A process of its own, so that reading an 8 MB page never holds the GIL of the process that times
the probes. Bare sockets, a new connection per scrape, read to the end: the time is request sent
to last byte in.

    python bench/scrape_loop.py --port PORT [--path /metrics] [--count N] [--pause S]
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import sys
import time


def scrape(port: int, path: str, buffer: bytearray) -> tuple[float, int]:
    """One GET to the end of the answer: (seconds, bytes); bytes -1 when it failed."""
    began = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: identity\r\nConnection: close\r\n\r\n".encode())
            view, total = memoryview(buffer), 0
            while got := sock.recv_into(view):
                total += got
    except OSError:
        total = -1
    return time.perf_counter() - began, total


def stdin_closed() -> bool:
    ready, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(ready) and not sys.stdin.readline()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/metrics")
    parser.add_argument("--count", type=int, default=0, help="stop after this many scrapes (0: when stdin closes)")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between two scrapes")
    args = parser.parse_args()
    buffer = bytearray(1 << 20)
    results = []
    while not (args.count and len(results) >= args.count) and not (not args.count and stdin_closed()):
        results.append(scrape(args.port, args.path, buffer))
        time.sleep(args.pause)
    print(json.dumps({"seconds": [s for s, _ in results], "bytes": [b for _, b in results]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
