"""What the benchmarks that start servers on loopback share: a free port, the wait for a server to
answer, and the polls an exporter has done (its `/api/v1/targets`)."""

from __future__ import annotations

import json
import socket
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 20.0) -> None:
    """Return once `url` answers; the last error once `timeout` seconds have passed without an answer."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=5).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def total_polls(exporter_url: str) -> int:
    """Every target's polls, summed, as the exporter at `exporter_url` counts them."""
    with urllib.request.urlopen(exporter_url + "/api/v1/targets", timeout=60) as response:
        return sum(t["polls"] for t in json.load(response)["targets"])
