"""The webhook against generated and mutated Alertmanager payloads: 200, 400 or 422 with a reason, never 5xx.

Each example is one POST to the real app on loopback (dry run, a loopback exporter), built from the
real captured payloads by JSON-level and byte-level mutations drawn from one seed (see
tests/test_scan_differential.py for why a seed rather than many draws). A 5xx would make
Alertmanager retry a payload that can never succeed; an exception would be a 500.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import example, given
from hypothesis import strategies as st
from property import property_settings, record_examples
from test_remediator_helpers import AUTH, FIRING, RESOLVED, TRUNCATED, FakeExporter, make_settings

from llm_vitals.remediator.app import create_app

EXAMPLES = 2_000
SEEDS = [FIRING, RESOLVED, TRUNCATED]
ODD_VALUES: list[Any] = [None, True, 0, -1, 2**70, 1.5, float("nan"), "", "x" * 300, "4", "firing", "resolved",
                         [], {}, [1, "a"], {"a": 1}, "2026-13-45T99:00:00Z", "2026-12-02T14:34:35.123456789Z",
                         "0001-01-01T00:00:00Z", "\u0000", "é💡"]
RUNS = {"examples": 0}


def _paths(document: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON document (keys and list indexes)."""
    found = [prefix]
    if isinstance(document, dict):
        for key, value in document.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found += _paths(value, (*prefix, index))
    return found


def _mutate(document: Any, rng: random.Random) -> Any:
    paths = _paths(document)[1:]
    if not paths:
        return rng.choice(ODD_VALUES)
    path = rng.choice(paths)
    parent = document
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    op = rng.randrange(5)
    if op == 0 and isinstance(parent, dict):
        del parent[last]
    elif op == 1 and isinstance(parent, dict):
        parent[rng.choice(["extra", "status", "labels", "alerts", "version", "startsAt"])] = rng.choice(ODD_VALUES)
    elif op == 2 and isinstance(parent[last], list) and parent[last]:
        parent[last] = parent[last] * rng.randint(0, 3)
    else:
        parent[last] = copy.deepcopy(rng.choice(ODD_VALUES))
    return document


def payload_body(seed: int) -> bytes:
    """One mutated payload: 1-4 JSON-level mutations, sometimes a byte-level one on top."""
    rng = random.Random(seed)
    document = copy.deepcopy(rng.choice(SEEDS))
    if rng.random() < 0.8:
        for alert in document.get("alerts", []):
            alert["labels"]["target"] = rng.choice(["a", "b", "unknown", ""])
            alert["labels"]["remediation"] = "restart"
    for _ in range(rng.randint(1, 4)):
        document = _mutate(document, rng)
    body = json.dumps(document, allow_nan=True).encode()
    kind = rng.random()
    if kind < 0.1:
        body = body[: rng.randrange(len(body) + 1)]  # cut short
    elif kind < 0.2:
        at = rng.randrange(len(body) + 1)
        body = body[:at] + rng.choice([b"\xff", b"\x00", b"{", b"]", b'"', b"\\", b"\xe2\x82"]) + body[at:]
    elif kind < 0.22:
        body = b"[" * 100_000  # nested past the recursion limit
    return body


@pytest.fixture
def webhook(tmp_path: Path):
    """POST a body to the real remediator's /webhook (dry run); returns (status, JSON answer)."""
    loop = asyncio.new_event_loop()
    exporter = FakeExporter({"a": "stuck", "b": "idle"})
    exporter_server = TestServer(exporter.app(), loop=loop)
    loop.run_until_complete(exporter_server.start_server())
    settings = make_settings(tmp_path, str(exporter_server.make_url("")).rstrip("/"),
                             {name: {"executor": "command", "argv": ["true"]} for name in "ab"}, dry_run=True)
    client = TestClient(TestServer(create_app(settings), loop=loop), loop=loop)
    loop.run_until_complete(client.start_server())

    def post(body: bytes) -> tuple[int, Any]:
        async def go() -> tuple[int, Any]:
            response = await client.post("/webhook", data=body,
                                         headers={**AUTH, "Content-Type": "application/json"})
            return response.status, await response.json(content_type=None)
        return loop.run_until_complete(go())

    yield post
    loop.run_until_complete(client.close())
    loop.run_until_complete(exporter_server.close())
    loop.close()


def test_generated_and_mutated_payloads_get_200_400_or_422_with_a_reason(webhook, request) -> None:
    @given(st.integers(0, 2**64).map(payload_body))
    @example(json.dumps(FIRING).encode())
    @example(b"")
    @example(b"null")
    @example(b'{"version": "4", "alerts": [' + b'{}, ' * 2000 + b"{}]}")
    @property_settings(EXAMPLES)
    def one(body: bytes) -> None:
        RUNS["examples"] += 1
        status, answer = webhook(body)
        assert status in (200, 400, 422), f"HTTP {status} {answer} for {body[:300]!r}"
        if status == 200:
            assert isinstance(answer.get("decisions"), list), answer
        else:
            assert isinstance(answer.get("error"), str) and answer["error"], answer

    RUNS["examples"] = 0
    one()
    record_examples(request, RUNS["examples"], EXAMPLES)
