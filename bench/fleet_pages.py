"""A fake fleet for the benchmarks: one process answers `/<target>/metrics` for any number of targets.

Cheap enough to feed 5,000 targets every 5 s on a loaded 2-core box, so that a benchmark measures
the exporter, not its upstream: a bare asyncio protocol (no web framework) answers each request
with bytes built at start. Each target's step counter moves on each of its reads (a fleet making
progress): the page is prebuilt in `--variants` versions, and a target's n-th read gets the n-th
(the last one once they run out, which then reads as a fleet that stopped moving).
`/<target>/health` answers 200 with no body. `--engine llamacpp` serves llama.cpp's real busy page
instead (2 requests processing, its decode counter moving).

    python bench/fleet_pages.py --port PORT [--engine vllm|llamacpp] [--page FILE] [--variants 400]

Prints `ready` on stdout once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
# engine -> (its real busy page, the sample line of its step counter, moved on each read)
PAGES = {
    "vllm": (FIXTURES / "vllm" / "vllm-0.32.0-cpu-metrics-busy.txt",
             b'vllm:iteration_tokens_total_count{engine="0",model_name="tiny"} 462.0'),
    "llamacpp": (FIXTURES / "llamacpp" / "llamacpp-0c1e570-cpu-metrics-busy-1.txt", b"llamacpp:n_decode_total 451"),
}
PAGE, MARKER = PAGES["vllm"]


def response(body: bytes, content_type: bytes = b"text/plain; version=0.0.4; charset=utf-8") -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: " + content_type
            + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


def page_variants(page: bytes, count: int, marker: bytes = MARKER) -> list[bytes]:
    """`count` whole HTTP answers: the page with its step counter (`marker`'s value) 1, 2, ... above the page's."""
    head, tail = page.split(marker)
    name, _, value = marker.rpartition(b" ")
    first = int(float(value))
    return [response(head + name + b" %d.0" % (first + 1 + n) + tail) for n in range(count)]


class Fleet(asyncio.Protocol):
    """HTTP/1.1 keep-alive, pipelining tolerated; GET only, as the exporter asks."""

    variants: list[bytes] = []
    reads: dict[bytes, int] = {}
    health = response(b"")
    missing = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            request, self.buffer = self.buffer[:end], self.buffer[end + 4:]
            path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b""
            self.transport.write(self.answer(path))

    def answer(self, path: bytes) -> bytes:
        target, _, route = path.lstrip(b"/").partition(b"/")
        if route == b"metrics":
            n = self.reads.get(target, 0)
            self.reads[target] = n + 1
            return self.variants[min(n, len(self.variants) - 1)]
        if route == b"health":
            return self.health
        return self.missing


async def serve(port: int, page: Path, variants: int, marker: bytes = MARKER) -> None:
    Fleet.variants = page_variants(page.read_bytes(), variants, marker)
    server = await asyncio.get_running_loop().create_server(Fleet, "127.0.0.1", port, backlog=4096)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--engine", choices=sorted(PAGES), default="vllm")
    parser.add_argument("--page", type=Path, help="another page of that engine (default: its real busy page)")
    parser.add_argument("--variants", type=int, default=400)
    args = parser.parse_args()
    page, marker = PAGES[args.engine]
    asyncio.run(serve(args.port, args.page or page, args.variants, marker))
    return 0


if __name__ == "__main__":
    sys.exit(main())
