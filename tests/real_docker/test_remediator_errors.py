"""The remediator, in the project's image, when the docker executor cannot restart: one clear error
in the journal per alert episode, and no retry storm (a re-sent alert is a duplicate, not a retry).

One hung simulated server (in a container, under load) is what a real exporter (in a container)
calls stuck under four target names; a remediator in a container maps them to four bad Docker
situations, all against real daemons:

    gone     a container that does not exist
    stopped  a container that exists and was stopped (it must stay stopped)
    down     the socket of a dockerd that crashed (SIGKILL; its socket file is left behind)
    denied   a running container, from a second remediator left as the image's uid 10001
             (the compose file runs the remediator as root for this), on the root:docker socket
"""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from conftest import free_port
from e2e_chain import Load

from .engine import Engine, wait_until, wait_until_async

NAMES = ["gone", "stopped", "down", "denied"]
TOKEN = secrets.token_urlsafe(16)


def _payload(target: str, starts_at: datetime) -> dict[str, Any]:
    labels = {"alertname": "LLMServerStuck", "target": target, "remediation": "restart", "severity": "critical"}
    return {
        "version": "4", "status": "firing", "receiver": "remediator", "groupLabels": labels,
        "commonLabels": labels, "groupKey": f'{{}}:{{target="{target}"}}', "truncatedAlerts": 0,
        "alerts": [{"status": "firing", "labels": labels, "annotations": {},
                    "startsAt": starts_at.isoformat().replace("+00:00", "Z"),
                    "endsAt": "0001-01-01T00:00:00Z", "fingerprint": f"{abs(hash(target)):016x}"[:16]}],
    }


def _run(engine: Engine, name: str, image: str, argv: list[str], mounts: dict[str, str], user: str | None = None):
    extra = [a for host, inside in mounts.items() for a in ("-v", f"{host}:{inside}")]
    extra += ["-e", f"LLM_VITALS_WEBHOOK_TOKEN={TOKEN}"]
    if user:
        extra += ["--user", user]
    engine.run_detached(name, argv, image=image, extra=extra)


def _write(path: Path, data: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    path.chmod(0o644)
    return str(path)


async def test_bad_docker_cases_are_one_journaled_error_each_and_no_retry_storm(
        engine: Engine, image: str, run_dir: Path, crashed_daemon: Path):
    work = run_dir / "remediator-errors"
    work.mkdir(exist_ok=True)
    port = {name: free_port() for name in ("sim", "exporter", "root", "uid10001")}
    url = {name: f"http://127.0.0.1:{p}" for name, p in port.items()}
    sim, stopped = f"lv-test-hung-{port['sim']}", f"lv-test-stopped-{port['sim']}"
    containers = [sim, stopped, f"lv-test-exporter-{port['exporter']}", f"lv-test-rem-{port['root']}",
                  f"lv-test-rem-{port['uid10001']}"]
    sim_argv = ["llm-vitals-sim", "--host", "127.0.0.1", "--no-control", "--startup-seconds", "0",
                "--max-num-seqs", "2", "--tokens-per-second", "50", "--log-level", "warning"]
    try:
        _run(engine, sim, image, [*sim_argv, "--port", str(port["sim"])], {})
        _run(engine, stopped, image, [*sim_argv, "--port", str(free_port())], {})
        engine.docker("stop", "-t", "5", stopped)
        exporter = _write(work / "exporter.yaml", {
            "listen": f"127.0.0.1:{port['exporter']}", "poll_interval": 0.5, "metrics_timeout": 10,
            "targets": [{"name": n, "url": url["sim"], "stuck_after": 3, "startup_grace": 30} for n in NAMES]})
        _run(engine, containers[2], image, ["llm-vitals-exporter", "--config", "/etc/llm-vitals/exporter.yaml"],
             {exporter: "/etc/llm-vitals/exporter.yaml:ro"})

        def remediator(listen: int, state: str, targets: dict[str, Any]) -> str:
            return _write(work / f"remediator-{listen}.yaml", {
                "listen": f"127.0.0.1:{listen}", "exporter_url": url["exporter"],
                "auth": {"bearer_token_env": "LLM_VITALS_WEBHOOK_TOKEN"}, "state_path": state,
                "global_cooldown": 0, "max_unhealthy": "100%", "targets": targets})

        as_root = remediator(port["root"], "/tmp/remediator.db", {
            "gone": {"executor": "docker", "container": f"lv-test-no-such-{port['sim']}", "timeout": 30},
            "stopped": {"executor": "docker", "container": stopped, "timeout": 30},
            "down": {"executor": "docker", "container": sim, "socket_path": "/run/crashed/docker.sock", "timeout": 30},
        })
        as_uid = remediator(port["uid10001"], "/var/lib/llm-vitals/remediator.db", {
            "denied": {"executor": "docker", "container": sim, "timeout": 30}})
        command = ["llm-vitals-remediator", "--config", "/etc/llm-vitals/remediator.yaml"]
        _run(engine, containers[3], image, command, {
            as_root: "/etc/llm-vitals/remediator.yaml:ro", str(engine.socket_path): "/var/run/docker.sock",
            str(crashed_daemon): "/run/crashed/docker.sock"}, user="0")
        _run(engine, containers[4], image, command, {
            as_uid: "/etc/llm-vitals/remediator.yaml:ro", str(engine.socket_path): "/var/run/docker.sock"})
        owner = {"gone": "root", "stopped": "root", "down": "root", "denied": "uid10001"}
        for name in ("exporter", "root", "uid10001"):
            wait_until(lambda name=name: httpx.get(f"{url[name]}/healthz", timeout=2).status_code == 200, 90,
                       f"the {name} container to answer")
        _, sim_started, _ = engine.identity(sim)

        load = await Load(url["sim"], workers=2, max_tokens=200).start()
        try:
            await wait_until_async(lambda: _states(url["exporter"]) == {"busy"}, 60, "every name busy")
            httpx.post(f"{url['sim']}/admin/fault", json={"fault": "hang"}, timeout=5).raise_for_status()
            await wait_until_async(lambda: _states(url["exporter"]) == {"stuck"}, 60, "every name stuck")
            since = time.time()
            starts_at = datetime.now(UTC)
            with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as client:
                for name in NAMES:
                    hook = f"{url[owner[name]]}/webhook"
                    assert client.post(hook, json=_payload(name, starts_at)).status_code == 200
                    await wait_until_async(lambda name=name: _finished(url[owner[name]], name), 60, f"{name}'s restart to end")
                    # Alertmanager re-sends a firing alert (repeat_interval, an HA pair): twice more here.
                    for _ in range(2):
                        assert client.post(hook, json=_payload(name, starts_at)).status_code == 200
        finally:
            await load.stop()

        expected = {
            "gone": f"docker inspect lv-test-no-such-{port['sim']}: HTTP 404: No such container",
            "stopped": f"container {stopped} is exited, not running: refused, nothing started",
            "down": "Connection refused (nothing listens on the socket: the Docker daemon is down)",
            "denied": "Permission denied (this process's user may not use the socket",
        }
        for name in NAMES:
            actions = [a for a in _actions(url[owner[name]]) if a["target"] == name]
            restarts = [a for a in actions if a["decision"] == "restart"]
            assert len(restarts) == 1, actions
            assert restarts[0]["result"] == "error" and expected[name] in restarts[0]["detail"], restarts
            assert [a["reason"] for a in actions if a["decision"] != "restart"] == ["duplicate", "duplicate"], actions
            metrics = httpx.get(f"{url[owner[name]]}/metrics", timeout=5).text
            counted = [line for line in metrics.splitlines() if line.startswith("llm_vitals_remediator_restarts_total{")
                       and f'target="{name}"' in line]
            assert [line.rsplit(" ", 1)[1] for line in counted if 'result="error"' in line] == ["1.0"], counted
            print(f"\n{name}: {restarts[0]['detail']}")
        assert engine.inspect(stopped)["State"]["Status"] == "exited", "the stopped container stays stopped"
        assert engine.identity(sim)[1] == sim_started, "nothing restarted the hung server"
        restarted = [e for e in engine.events(since, time.time() + 0.5, {"type": ["container"]})
                     if e["Action"] in ("restart", "start")]
        assert restarted == [], restarted
    finally:
        engine.remove(*containers)


def _states(exporter: str) -> set[str]:
    targets = httpx.get(f"{exporter}/api/v1/targets", timeout=5).json()["targets"]
    return {t["state"] for t in targets}


def _actions(remediator: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{remediator}/api/v1/actions", params={"limit": "1000"}, timeout=5,
                         headers={"Authorization": f"Bearer {TOKEN}"})
    response.raise_for_status()
    return list(reversed(response.json()["actions"]))


def _finished(remediator: str, name: str) -> bool:
    return any(a["target"] == name and a["decision"] == "restart" and a.get("result") not in (None, "pending")
               for a in _actions(remediator))
