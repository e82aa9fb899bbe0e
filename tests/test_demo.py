"""`python -m llm_vitals.demo --once`: the README's first command tells its story, and the journal agrees.

The demo runs as users run it (a subprocess with its own children), with the compressed timings of
`--fast` and kernel-chosen ports, so it can run beside other tests. The story's outcome is read
twice: from the demo's JSON summary and straight from the remediator's SQLite journal.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from conftest import REPO, free_port, real_stack_required, require_binary

from llm_vitals.demo.ports import MIXED_ENGINES


# Real Prometheus + Alertmanager when installed; no xdist group: free ports and its own workdir,
# so it runs beside the other tests.
@pytest.mark.e2e
def test_demo_once_tells_the_story(tmp_path) -> None:
    summary_path = tmp_path / "summary.json"
    workdir = tmp_path / "run"
    # Under .ci/run the real alert path is required; elsewhere the demo falls back to its relay.
    alert_path = "prometheus" if real_stack_required() else "auto"
    argv = [sys.executable, "-m", "llm_vitals.demo", "--once", "--fast", "--no-table", "--free-ports",
            "--alerts", alert_path, "--workdir", str(workdir), "--summary-json", str(summary_path)]
    try:
        run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the demo did not finish within 240 s:\n{exc.stdout}\n{exc.stderr}")
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "story summary (every step as told)" in output
    # The simulator, exporter, remediator (+ Prometheus, Alertmanager), and one simulator per mixed-fleet engine.
    mixed = len(MIXED_ENGINES)
    assert f"stopped {5 + mixed} processes" in output or f"stopped {3 + mixed} processes" in output, output

    summary = json.loads(summary_path.read_text())
    steps = {step["name"]: step for step in summary["steps"]}
    assert list(steps) == ["batch", "hang-one", "hang-pair", "hang-all"]
    assert all(step["ok"] for step in steps.values()), json.dumps(summary, indent=2)
    assert steps["batch"]["restarts"] == {}
    assert steps["hang-one"]["restarts"] == {"backend-2": 1}
    assert steps["hang-pair"]["restarts"] == {"backend-1": 1, "backend-3": 1}
    assert steps["hang-pair"]["refusals"].get("cooldown", 0) >= 1
    assert steps["hang-all"]["restarts"] == {}
    assert summary["restarts"] == {"backend-1": 1, "backend-2": 1, "backend-3": 1}
    # The mixed fleet: a server of every other simulated engine, judged by its own adapter, healthy.
    assert set(summary["mixed_fleet"]) == {f"{engine}-1" for engine in MIXED_ENGINES} and "triton-1" in summary["mixed_fleet"]
    assert set(summary["mixed_fleet"].values()) <= {"idle", "busy"}, summary["mixed_fleet"]

    # The remediator's own journal: backend-1 never restarted during the batch, the pair's two
    # restarts a cooldown apart, and the all-hang step refused by the fleet gate only.
    journal = sqlite3.connect(workdir / "remediator.db")
    rows = journal.execute("SELECT id, time, target, decision, reason FROM actions ORDER BY id").fetchall()
    journal.close()

    def in_step(name: str) -> list[tuple]:
        step = steps[name]
        return [r for r in rows if step["first_action_id"] < r[0] <= step["last_action_id"]]

    assert not [r for r in in_step("batch") if r[3] != "resolved"]
    assert [(r[2], r[3]) for r in in_step("hang-one") if r[3] == "restart"] == [("backend-2", "restart")]
    pair = [r for r in in_step("hang-pair") if r[3] == "restart"]
    assert sorted(r[2] for r in pair) == ["backend-1", "backend-3"]
    assert pair[1][1] - pair[0][1] >= summary["timings"]["cooldown"] - 0.5
    all_hang = [r for r in in_step("hang-all") if r[3] != "resolved"]
    assert ("refused", "fleet_gate") in {(r[3], r[4]) for r in all_hang}
    # Besides the fleet gate, only an alert re-sent after the demo cleared the hang (not_stuck).
    assert {(r[3], r[4]) for r in all_hang} <= {("refused", "fleet_gate"), ("refused", "not_stuck")}, all_hang
    if alert_path == "prometheus" or "Prometheus" in summary["alert_path"]:
        assert summary["alert_path"].startswith("alert path: Prometheus")
    # The status page's panel showed the story's decisions, read with the read token.
    assert summary["status_page"]["note"] is None and summary["status_page"]["decisions"] > 0, summary["status_page"]
    # The banner says where the tokens are and gives the curl for the decisions, with the read token.
    assert f"tokens        act {workdir / 'webhook.token'} " in output and f"read {workdir / 'read.token'} " in output
    assert f'decisions     curl -s -H "Authorization: Bearer $(cat {workdir / "read.token"})" http://127.0.0.1:' in output


def mine_is_idle(exporter_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{exporter_port}/api/v1/targets/mine", timeout=5) as answer:
            return json.load(answer)["state"] == "idle"
    except OSError:
        return False


def test_demo_with_a_config_of_your_own_watches_those_servers_and_starts_nothing_else(tmp_path) -> None:
    # A live simulated server and a port nobody listens on: the demo's exporter judges both, the
    # demo prints their state changes, and Ctrl-C stops the one process it started.
    server_port, exporter_port = free_port(), free_port()
    # --no-control: the control server would take server_port + 1, which nothing reserved for it.
    server = subprocess.Popen([sys.executable, "-m", "llm_vitals.sim.cli", "--backends", "1", "--port", str(server_port),
                               "--no-control", "--log-level", "warning"], cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    config = tmp_path / "exporter.yaml"
    config.write_text(f"""
listen: "127.0.0.1:{exporter_port}"
poll_interval: 0.5s
targets:
  - {{name: mine, url: "http://127.0.0.1:{server_port}"}}
  - {{name: gone, url: "http://127.0.0.1:{free_port()}", startup_grace: 1s}}
""")
    demo = subprocess.Popen([sys.executable, "-m", "llm_vitals.demo", "--config", str(config), "--no-table"], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in demo.stdout], daemon=True).start()
    seen: list[str] = []
    try:
        wanted = {"mine: starting -> idle", "gone: starting -> down (refused)"}  # nothing listens there
        deadline = time.monotonic() + 60  # the simulator and the exporter start on a loaded machine
        while wanted and time.monotonic() < deadline:
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                pass
            wanted = {w for w in wanted if not any(w in line for line in seen)}
            if wanted == {"mine: starting -> idle"} and mine_is_idle(exporter_port):
                # The demo prints a change it saw; when its first look came after the exporter's
                # first poll, it saw mine idle from the start and printed nothing.
                wanted = set()
        assert not wanted, "".join(seen)
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=30) == 0
    finally:
        for process in (demo, server):
            if process.poll() is None:
                process.kill()
                process.wait()
    time.sleep(0.2)  # the reader thread drains the last lines
    while not lines.empty():
        seen.append(lines.get())
    output = "".join(seen)
    assert f"status page   http://127.0.0.1:{exporter_port}/" in output
    assert "simulated fleet" not in output and "remediator    (no remediator_url" in output
    assert "stopped 1 processes" in output, output


def test_make_demo_passes_a_config_of_your_own_and_none_by_default() -> None:
    def demo_line(*make_args: str) -> str:
        out = subprocess.run(["make", "-n", "demo", *make_args], cwd=REPO, capture_output=True, text=True, check=True)
        return next(line for line in out.stdout.splitlines() if "-m llm_vitals.demo" in line)

    assert demo_line("CONFIG=own.yaml").endswith("-m llm_vitals.demo --config own.yaml")
    assert demo_line("CONFIG=").endswith("-m llm_vitals.demo")  # forces the simulated fleet even with ./exporter.yaml


@pytest.mark.parametrize("fast", [False, True], ids=["normal", "fast"])
def test_demo_configs_pass_the_real_config_checks(tmp_path, fast) -> None:
    """Every file the demo writes, at both paces: the story above runs only `--fast`, `make demo` the normal one."""
    from llm_vitals.demo.configs import TOKEN_ENV, write_all
    from llm_vitals.demo.ports import choose_ports
    from llm_vitals.demo.timings import FAST, NORMAL
    from llm_vitals.exporter.settings import load_settings as load_exporter_settings
    from llm_vitals.remediator.settings import load_settings as load_remediator_settings

    ports, _ = choose_ports(prefer_defaults=False)
    files = write_all(tmp_path, ports, FAST if fast else NORMAL, "t0ken")
    exporter = load_exporter_settings(files["exporter"])
    remediator = load_remediator_settings(files["remediator"], environ={TOKEN_ENV: "t0ken"})
    assert exporter.port == ports.exporter and remediator.exporter_url == f"http://127.0.0.1:{ports.exporter}"
    assert set(remediator.targets) <= {t.name for t in exporter.targets}
    # The status page holds the remediator's read token, never the act token (the webhook's).
    assert exporter.remediator_token is not None and remediator.auth.read_token is not None
    assert exporter.remediator_token.get_secret_value() == remediator.auth.read_token.get_secret_value() != "t0ken"
    promtool, amtool = require_binary("promtool"), require_binary("amtool")
    for argv in ([promtool, "check", "config", str(files["prometheus"])],  # also checks the rules it loads
                 [amtool, "check-config", str(files["alertmanager"])]):
        check = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr


async def test_relay_posts_alertmanager_v4_webhooks_like_alertmanager(aiohttp_server) -> None:
    """The fallback alert path (no Prometheus installed): firing after `for`, repeats, one resolved."""
    import aiohttp
    from aiohttp import web

    from llm_vitals.demo.alerts import WebhookRelay
    from llm_vitals.demo.timings import FAST
    from llm_vitals.remediator.payload import WebhookPayload

    received: list[tuple[str | None, WebhookPayload]] = []

    async def webhook(request: web.Request) -> web.Response:
        received.append((request.headers.get("Authorization"), WebhookPayload.model_validate(await request.json())))
        return web.json_response({"decisions": []})

    app = web.Application()
    app.router.add_post("/webhook", webhook)
    sink = await aiohttp_server(app)
    relay = WebhookRelay("http://127.0.0.1:9", str(sink.make_url("")).rstrip("/"), "t0ken", FAST,
                         frozenset({"backend-1", "backend-2"}))
    t0 = 1_800_000_000.0
    async with aiohttp.ClientSession() as session:
        await relay.step(session, {"backend-1": "stuck", "backend-2": "busy"}, t0)
        assert received == []  # pending: not yet `for` long
        await relay.step(session, {"backend-1": "stuck"}, t0 + FAST.rule_for)
        await relay.step(session, {"backend-1": "stuck"}, t0 + FAST.rule_for + 0.1)  # within repeat: no re-send
        await relay.step(session, {"backend-1": "stuck"}, t0 + FAST.rule_for + FAST.repeat_interval)
        await relay.step(session, {"backend-1": "busy"}, t0 + 30)
    statuses = [(payload.status, payload.alerts[0].labels["target"]) for _, payload in received]
    assert statuses == [("firing", "backend-1"), ("firing", "backend-1"), ("resolved", "backend-1")]
    assert {auth for auth, _ in received} == {"Bearer t0ken"}
    first = received[0][1].alerts[0]
    assert first.labels["remediation"] == "restart" and first.labels["alertname"] == "LLMServerStuck"
    assert first.starts_at == t0  # when the state was first seen, as Prometheus's activeAt
    assert len({payload.alerts[0].fingerprint for _, payload in received}) == 1


async def test_the_banners_decisions_curl_reads_the_journal_with_the_read_token(tmp_path, aiohttp_server) -> None:
    """The command the banner prints, pasted into bash as it stands, against the demo's own remediator config."""
    import asyncio

    from llm_vitals.demo.configs import TOKEN_ENV, decisions_command, write_all
    from llm_vitals.demo.ports import choose_ports
    from llm_vitals.demo.timings import FAST
    from llm_vitals.remediator.app import create_app
    from llm_vitals.remediator.settings import load_settings

    files = write_all(tmp_path, choose_ports(prefer_defaults=False)[0], FAST, "act-t0ken")
    remediator = await aiohttp_server(create_app(load_settings(files["remediator"], environ={TOKEN_ENV: "act-t0ken"})))
    url = str(remediator.make_url("")).rstrip("/")

    async def pasted(command: str) -> str:
        shell = await asyncio.create_subprocess_exec("bash", "-c", command + " -w '\\n%{http_code}'",
                                                     stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(shell.communicate(), timeout=30)
        return out.decode()

    body, status = (await pasted(decisions_command(url, files["read_token"]))).rsplit("\n", 1)
    assert status == "200" and json.loads(body)["actions"] == []
    # The header is what lets it in: the same call without it is refused.
    assert (await pasted(f"curl -s {url}/api/v1/actions")).endswith("401")


def test_the_status_page_decisions_panel_is_read_as_rows_or_its_note() -> None:
    from llm_vitals.demo.story import decisions_panel
    from llm_vitals.exporter.status_page import Decisions, render_page

    now = 1_800_000_000.0
    shown = Decisions(actions=[{"id": 2, "time": now - 5, "target": "backend-<2>", "decision": "restart", "reason": "allowed"},
                               {"id": 1, "time": now - 9, "target": "backend-1", "decision": "refused", "reason": "cooldown"}],
                      url="http://127.0.0.1:9472")
    assert decisions_panel(render_page([], {}, shown, now)) == {"decisions": 2, "note": None}
    refused = Decisions(note="cannot read the remediator: 401 <unauthorized>", url="http://127.0.0.1:9472")
    assert decisions_panel(render_page([], {}, refused, now)) == {
        "decisions": 0, "note": "cannot read the remediator: 401 <unauthorized>"}
    assert decisions_panel(render_page([], {}, None, now)) == {"decisions": 0, "note": None}
