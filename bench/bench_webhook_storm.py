"""Webhook answer latency under a 500-POST storm (target: p99 <= 50 ms).

The remediator runs as a real subprocess (`python -m llm_vitals.remediator`) with its SQLite journal on disk,
re-checking a loopback exporter and restarting through the real `http` executor against a
counting endpoint. Two storms are sent, each of 500 POSTs with `--concurrency` in flight:

  same-alert : the same firing alert for two stuck targets (an HA pair plus repeat_interval);
               one restart, the rest are duplicates / restart_in_progress / cooldown;
  distinct   : 500 distinct alerts (new startsAt each), so every POST passes the duplicate check,
               re-reads the exporter and takes the decision lock: the expensive path.

Exit status 1 when a storm ran more than one restart, or (with --strict) when p99 > 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web
from loopback import free_port

REPO = Path(__file__).resolve().parent.parent
TOKEN = "bench-token"
TARGET_P99_MS = 50.0
STARTS_AT_UNIX = 1796222316.417


def target_json(name: str, state: str) -> dict:
    return {"name": name, "engine": "vllm", "role": "backend", "url": "http://127.0.0.1:1", "state": state,
            "reason": "no_progress", "detail": "", "since": STARTS_AT_UNIX - 3000, "stuck_seconds": 90.0,
            "process_start_time": STARTS_AT_UNIX - 3600, "last_poll": time.time(), "up": True, "ready": False,
            "live": True, "draining": False, "gpu_fault": False, "restarts": 0, "running": 2, "waiting": 4,
            "steps_per_second": 0.0, "generation_tokens_per_second": 0.0,
            "counters": {"steps": 1, "generation_tokens": 1, "prompt_tokens": 1, "finished": 1, "kv_usage": 0.3}}


def alert(target: str, fingerprint: str, starts_at: str) -> dict:
    labels = {"alertname": "LLMServerStuck", "target": target, "severity": "critical", "remediation": "restart"}
    return {
        "receiver": "restarter", "status": "firing", "version": "4", "groupKey": "{}:{}", "truncatedAlerts": 0,
        "groupLabels": {"alertname": "LLMServerStuck"}, "commonLabels": labels, "commonAnnotations": {},
        "externalURL": "http://127.0.0.1:9093",
        "alerts": [{"status": "firing", "labels": labels, "annotations": {"summary": "stuck"},
                    "startsAt": starts_at, "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "",
                    "fingerprint": fingerprint}],
    }


async def start_upstreams() -> tuple[web.AppRunner, int, dict]:
    """The loopback exporter and restart endpoint, in this process."""
    counts = {"restarts": 0, "exporter_reads": 0}
    targets = [target_json(n, "stuck" if n in "ab" else "idle") for n in "abcde"]

    async def targets_route(request: web.Request) -> web.Response:
        counts["exporter_reads"] += 1
        return web.json_response({"targets": targets, "generated_at": time.time()})

    async def restart_route(request: web.Request) -> web.Response:
        counts["restarts"] += 1
        await asyncio.sleep(0.2)
        return web.json_response({"restarting": True})

    app = web.Application()
    app.router.add_get("/api/v1/targets", targets_route)
    app.router.add_post("/admin/restart", restart_route)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port, counts


async def start_remediator(workdir: Path, upstream_port: int) -> tuple[asyncio.subprocess.Process, str]:
    port = free_port()
    config = {
        "listen": f"127.0.0.1:{port}",
        "exporter_url": f"http://127.0.0.1:{upstream_port}",
        "auth": {"bearer_token_env": "BENCH_TOKEN"},
        "state_path": str(workdir / "journal.db"),
        "global_cooldown": "15m",
        "max_unhealthy": "40%",
        "targets": {n: {"executor": "http", "url": f"http://127.0.0.1:{upstream_port}/admin/restart"} for n in "abcde"},
    }
    (workdir / "remediator.yaml").write_text(json.dumps(config))  # JSON is YAML
    with (workdir / "remediator.log").open("wb") as log:  # the child keeps its own copy of the fd
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "llm_vitals.remediator", "--config", str(workdir / "remediator.yaml"), "--log-level", "warning",
            cwd=REPO, stdout=log, stderr=log, env={**os.environ, "BENCH_TOKEN": TOKEN},
        )
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                async with http.get(base + "/healthz") as response:
                    if response.status == 200:
                        return proc, base
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    proc.kill()
    await proc.wait()
    raise SystemExit(f"the remediator did not start; see {workdir / 'remediator.log'}")


async def storm(base: str, payloads: list[dict], concurrency: int) -> tuple[list[float], dict[str, int]]:
    """POST every payload with `concurrency` in flight; per-POST latency in ms, and reasons seen."""
    latencies: list[float] = []
    reasons: dict[str, int] = {}
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    queue = [json.dumps(p).encode() for p in reversed(payloads)]

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:

        async def worker() -> None:
            while queue:
                body = queue.pop()
                started = time.perf_counter()
                async with http.post(base + "/webhook", data=body, headers=headers) as response:
                    answer = await response.json()
                latencies.append((time.perf_counter() - started) * 1000)
                if response.status != 200:
                    raise SystemExit(f"webhook answered {response.status}: {answer}")
                reason = answer["decisions"][0]["reason"]
                reasons[reason] = reasons.get(reason, 0) + 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, reasons


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


async def run(args: argparse.Namespace) -> int:
    runner, upstream_port, counts = await start_upstreams()
    failed = False
    with tempfile.TemporaryDirectory(prefix="lv-bench-") as tmp:
        workdir = Path(tmp)
        storms = {
            "same-alert": [
                alert(t, f"fp-{t}", "2026-12-02T14:38:36.417Z") for _ in range(args.posts // 2) for t in "ab"
            ],
            "distinct": [
                alert("ab"[i % 2], f"fp-{i}", f"2026-12-02T14:{i // 60 % 60:02d}:{i % 60:02d}.000Z")
                for i in range(args.posts)
            ],
        }
        for name, payloads in storms.items():
            # A fresh remediator and journal per storm, so each starts with no cooldown.
            (workdir / name).mkdir()
            proc, base = await start_remediator(workdir / name, upstream_port)
            before = counts["restarts"]
            try:
                if args.warmup:
                    await storm(base, payloads[:20], min(args.concurrency, 20))
                started = time.perf_counter()
                latencies, reasons = await storm(base, payloads, args.concurrency)
                elapsed = time.perf_counter() - started
            finally:
                proc.terminate()
                await proc.wait()
            restarts = counts["restarts"] - before
            p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
            verdict = "ok" if p99 <= TARGET_P99_MS else f"OVER the {TARGET_P99_MS:.0f} ms target"
            print(f"{name:10s} {len(latencies)} POSTs, {args.concurrency} in flight: "
                  f"p50 {p50:.1f} ms  p99 {p99:.1f} ms  max {max(latencies):.1f} ms  "
                  f"({len(latencies) / elapsed:.0f} POST/s)  restarts {restarts}  [{verdict}]")
            print(f"{'':10s} reasons: {dict(sorted(reasons.items()))}")
            if restarts != 1:
                print(f"FAIL: {name} ran {restarts} restarts, expected exactly 1")
                failed = True
            if args.strict and p99 > TARGET_P99_MS:
                failed = True
    print(f"exporter reads: {counts['exporter_reads']} for {2 * args.posts} POSTs")
    await runner.cleanup()
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--posts", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--no-warmup", dest="warmup", action="store_false")
    parser.add_argument("--strict", action="store_true", help="exit 1 when p99 is over the target")
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
