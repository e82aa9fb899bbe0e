"""Forward TCP from this machine's loopback into the cluster's network namespace (stdlib only).

    python nsfwd.py NETNS_PATH LISTEN_PORT:TARGET_HOST:TARGET_PORT [...]

The listening sockets (127.0.0.1:LISTEN_PORT) are made in the caller's namespace; then the process
enters NETNS_PATH with setns(2), so every connection it makes afterwards starts inside the cluster's
namespace. That is how a client on the host (the tests' API client, Prometheus, Alertmanager) reaches
the API server and the pods' addresses (10.213.0.N) without ever sending a packet to 10.213.0.N from
the host itself, where that address would leave the machine. One process, one thread (asyncio);
stopped by its PID. Written after the kubelet fixture recipe's forwarder.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import sys

CLONE_NEWNET = 0x40000000


def enter_netns(path: str) -> None:
    """setns(2) into the network namespace at `path` (Python 3.11 has no os.setns)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy one direction until EOF, then half-close the other side."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass


def _handler(host: str, port: int):
    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            target_reader, target_writer = await asyncio.open_connection(host, port)
        except OSError as exc:
            print(f"nsfwd: connect {host}:{port}: {exc}", file=sys.stderr, flush=True)
            client_writer.close()
            return
        await asyncio.gather(_pump(client_reader, target_writer), _pump(target_reader, client_writer))
        for writer in (target_writer, client_writer):
            writer.close()
    return handle


async def _serve(routes: list[tuple[socket.socket, str, int]]) -> None:
    servers = [await asyncio.start_server(_handler(host, port), sock=sock) for sock, host, port in routes]
    await asyncio.gather(*(server.serve_forever() for server in servers))


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit(__doc__)
    routes = []
    for spec in argv[1:]:
        listen, host, target = spec.split(":")
        sock = socket.create_server(("127.0.0.1", int(listen)))  # in the caller's namespace
        routes.append((sock, host, int(target)))
    enter_netns(argv[0])  # every connection from here on starts inside the cluster's namespace
    print(f"nsfwd: pid {os.getpid()} forwarding {' '.join(argv[1:])} into {argv[0]}", flush=True)
    asyncio.run(_serve(routes))


if __name__ == "__main__":
    main(sys.argv[1:])
