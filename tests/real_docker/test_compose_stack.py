"""docker-compose.yml for real: the stack comes up on the tier's daemon, in depends_on order, and a
hung simulated server is restarted once by the remediator through the real Engine API.

    docker-compose -f docker-compose.yml -f docker-compose.test.yml up -d --no-build (no Grafana)

The override (docker-compose.test.yml) keeps the services' commands, users, dependencies and mount
points; it puts every service on the host network at free loopback ports, and mounts configs made
here from the shipped ones (deploy/compose/) with those ports and test-sized timings: the exporter
polls every 0.5 s and calls 3 s without progress stuck, Prometheus scrapes and evaluates every
second with the shipped rules' `for:` shortened. The remediator's config is the shipped one (5 min
global cooldown, the three docker targets) with only its listen address and exporter URL changed.
"""

from __future__ import annotations

import copy
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import REPO, free_port
from e2e_chain import Load
from stack import RULES_FILE, write_rules_with_short_for

from .engine import BASE_IMAGE, Engine, wait_until, wait_until_async

PROJECT = "lvtest"
SIMS = ["sim-a", "sim-b", "sim-c"]
SERVICES = [*SIMS, "exporter", "remediator", "prometheus", "alertmanager"]
SHIPPED = REPO / "deploy" / "compose"
COMPOSE_FILES = [REPO / "docker-compose.yml", REPO / "docker-compose.test.yml"]
# Stuck waits 4 s before firing (e2e_chain's reasoning); the rest fire after 1 s, the absent-exporter alert never here.
RULES_FOR = {"LLMVitalsExporterAbsent": 60, "LLMServerSaturated": 30, "LLMServerStuck": 4}
WEBHOOK_TIMEOUT = 90  # hang -> stuck -> pending -> firing -> Alertmanager -> webhook, on a loaded machine


def _ports() -> dict[str, int]:
    ports: dict[str, int] = {}
    while len(set(ports.values())) < len(SERVICES):
        ports = {name: free_port() for name in SERVICES}
    return ports


def write_configs(directory: Path, ports: dict[str, int]) -> None:
    """The shipped configs with loopback ports (no service names on the host network) and short timings."""
    directory.mkdir(parents=True, exist_ok=True)
    url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}

    exporter = yaml.safe_load((SHIPPED / "exporter.yaml").read_text())
    exporter.update(listen=f"127.0.0.1:{ports['exporter']}", poll_interval=0.5, metrics_timeout=10,
                    remediator_url=url["remediator"])
    for target in exporter["targets"]:
        target.update(url=url[target["name"]], stuck_after=3, startup_grace=30,
                      canary={"interval": 3, "timeout": 5})

    remediator = yaml.safe_load((SHIPPED / "remediator.yaml").read_text())
    remediator.update(listen=f"127.0.0.1:{ports['remediator']}", exporter_url=url["exporter"])

    prometheus = yaml.safe_load((SHIPPED / "prometheus.yml").read_text())
    prometheus["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}
    prometheus["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [f"127.0.0.1:{ports['alertmanager']}"]
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    jobs["llm-vitals"]["static_configs"][0]["targets"] = [f"127.0.0.1:{ports['exporter']}"]
    jobs["llm-vitals-remediator"]["static_configs"][0]["targets"] = [f"127.0.0.1:{ports['remediator']}"]

    alertmanager = copy.deepcopy(yaml.safe_load((SHIPPED / "alertmanager.yml").read_text()))
    hook = next(r for r in alertmanager["receivers"] if r["name"] == "remediator")["webhook_configs"][0]
    hook["url"] = f"{url['remediator']}/webhook"  # credentials_file stays: the entrypoint writes it

    def retime(route: dict[str, Any]) -> None:
        route.update(group_wait="0s", group_interval="1s")
        for child in route.get("routes", []):
            retime(child)

    retime(alertmanager["route"])
    for name, data in [("exporter.yaml", exporter), ("remediator.yaml", remediator),
                       ("prometheus.yml", prometheus), ("alertmanager.yml", alertmanager)]:
        (directory / name).write_text(yaml.safe_dump(data, sort_keys=False))
    write_rules_with_short_for(RULES_FILE, directory / "llm-vitals.rules.yml", seconds=1, overrides=RULES_FOR)
    for path in directory.iterdir():
        path.chmod(0o644)  # the project's containers read them as uid 10001


class Stack:
    def __init__(self, engine: Engine, image: str, config_dir: Path, ports: dict[str, int]) -> None:
        self.engine = engine
        self.ports = ports
        self.url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        self.token = secrets.token_urlsafe(16)
        self.env = {k: v for k, v in engine.env().items() if not k.startswith(("LLM_VITALS_", "LV_"))}
        self.env.update(
            LV_IMAGE=image, LV_BASE_IMAGE=BASE_IMAGE, LV_CONFIG_DIR=str(config_dir),
            LV_DOCKER_SOCK=str(engine.socket_path), LLM_VITALS_WEBHOOK_TOKEN=self.token,
            **{f"LV_{name.upper().replace('-', '_')}_PORT": str(port) for name, port in ports.items()},
        )
        self.up_since = 0.0
        self.up_seconds = 0.0
        self.merged = config_dir / "docker-compose.merged.yml"

    def merge(self) -> dict[str, Any]:
        """docker-compose.yml + docker-compose.test.yml as compose 1.29 merges them, minus `ports:`.

        Compose 1.29 refuses a host-network container with published ports ("host" network_mode is
        incompatible with port_bindings), and an override file cannot take a list away (`!reset` is
        Compose v2's). On the host network `ports:` mean nothing, so they are dropped here, and
        nothing else is changed.
        """
        merged = yaml.safe_load(self.compose("config", files=COMPOSE_FILES).stdout)
        for service in merged["services"].values():
            assert service.get("network_mode") in (None, "host")
            if service.get("network_mode") == "host":
                service.pop("ports", None)
        # `config` wrote "$$" as "$$" (still escaped), so the merged file reads back the same.
        self.merged.write_text(yaml.safe_dump(merged, sort_keys=False))
        return merged

    def compose(self, *args: str, timeout: float = 600, check: bool = True,
                files: list[Path] | None = None) -> subprocess.CompletedProcess[str]:
        binary = shutil.which("docker-compose")
        assert binary, "docker-compose not found (tools/real-docker-setup.sh installs it)"
        argv = [binary, *(a for f in (files or [self.merged]) for a in ("-f", str(f))),
                "--project-directory", str(REPO), "-p", PROJECT, *args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.env, cwd=REPO)
        if check:
            assert result.returncode == 0, f"docker-compose {' '.join(args)}: {result.stdout}{result.stderr}"
        return result

    def container(self, service: str) -> str:
        return f"llm-vitals-{service}"

    def logs(self) -> str:
        return self.compose("logs", "--no-color", "--tail", "30", check=False).stdout[-12000:]

    def actions(self) -> list[dict[str, Any]]:
        """The remediator's journal, oldest first."""
        response = httpx.get(f"{self.url['remediator']}/api/v1/actions", params={"limit": "1000"}, timeout=5,
                             headers={"Authorization": f"Bearer {self.token}"})
        response.raise_for_status()
        return list(reversed(response.json()["actions"]))

    def target(self, name: str) -> dict[str, Any]:
        response = httpx.get(f"{self.url['exporter']}/api/v1/targets", timeout=5)
        response.raise_for_status()
        return {t["name"]: t for t in response.json()["targets"]}[name]


@pytest.fixture(scope="module")
def stack(engine: Engine, image: str, run_dir: Path):
    config_dir = run_dir / "compose-config"
    shutil.rmtree(config_dir, ignore_errors=True)
    ports = _ports()
    write_configs(config_dir, ports)
    up = Stack(engine, image, config_dir, ports)
    merged = up.merge()
    assert all(merged["services"][s]["network_mode"] == "host" for s in SERVICES)
    up.up_since = time.time()
    t0 = time.monotonic()
    try:
        # Compose itself waits for each service_healthy dependency before starting the next.
        up.compose("up", "-d", "--no-build", *SERVICES)
        # `up` returns once the last service has started; nothing depends on Prometheus, so wait for it.
        wait_until(lambda: all(engine.inspect(up.container(s))["State"]["Health"]["Status"] == "healthy"
                               for s in SERVICES), 120, "every service healthy")
        up.up_seconds = time.monotonic() - t0
        print(f"\ncompose up (7 services, healthy in order): {up.up_seconds:.0f} s")
        yield up
    except BaseException:
        print(up.logs())
        raise
    finally:
        up.compose("down", "-v", "--remove-orphans", "--timeout", "5", check=False)


def test_grafana_and_the_gpu_profile_are_not_started(stack: Stack):
    names = {c["Names"][0].lstrip("/") for c in stack.engine.api("GET", "/containers/json").json()}
    assert {stack.container(s) for s in SERVICES} <= names
    assert "llm-vitals-grafana" not in names and "llm-vitals-vllm" not in names


def test_every_service_turns_healthy_in_depends_on_order(stack: Stack):
    """From the daemon's own event log: each service started only after what it depends on was healthy."""
    events = stack.engine.events(stack.up_since - 1, time.time() + 0.5,
                                 {"type": ["container"], "label": [f"com.docker.compose.project={PROJECT}"]})
    started: dict[str, int] = {}
    healthy: dict[str, int] = {}
    for event in events:
        service = event["Actor"]["Attributes"].get("com.docker.compose.service")
        if event["Action"] == "start":
            started.setdefault(service, event["timeNano"])
        elif event["Action"] == "health_status: healthy":
            healthy.setdefault(service, event["timeNano"])
    assert set(healthy) == set(SERVICES), (sorted(healthy), [e["Action"] for e in events])
    base = yaml.safe_load(COMPOSE_FILES[0].read_text())["services"]
    edges = [(service, dep) for service in SERVICES for dep in base[service].get("depends_on", {})]
    assert len(edges) == 7  # exporter<-3 sims, remediator<-exporter, alertmanager<-remediator, prometheus<-2
    for service, dep in edges:
        assert healthy[dep] <= started[service], f"{service} started before {dep} was healthy"
    order = sorted(SERVICES, key=lambda s: healthy[s])
    print("healthy in this order (s after the first start): " + ", ".join(
        f"{s} {(healthy[s] - min(started.values())) / 1e9:.1f}" for s in order))


def test_prometheus_scrapes_the_exporter_and_the_remediator(stack: Stack):
    def all_up() -> dict[str, str] | None:
        body = httpx.get(f"{stack.url['prometheus']}/api/v1/targets", timeout=5).json()
        health = {t["labels"]["job"]: t["health"] for t in body["data"]["activeTargets"]}
        return health if set(health.values()) == {"up"} and len(health) == 2 else None

    health = wait_until(all_up, 60, "both scrape jobs up")
    assert set(health) == {"llm-vitals", "llm-vitals-remediator"}


async def test_a_hung_server_is_restarted_once_then_a_second_hang_is_refused(stack: Stack):
    engine, name = stack.engine, "sim-a"
    container = stack.container(name)
    before_id, before_started, _ = engine.identity(container)
    load = await Load(stack.url[name], workers=2, max_tokens=200).start()
    try:
        await wait_until_async(lambda: stack.target(name)["state"] == "busy", 60, f"{name} busy under load", stack.logs)
        since = time.time()
        assert httpx.post(f"{stack.url[name]}/admin/fault", json={"fault": "hang"}, timeout=5).json()["fault"] == "hang"

        def restarted() -> list[dict[str, Any]]:
            return [a for a in stack.actions() if a["decision"] == "restart" and a.get("result") not in (None, "pending")]

        restarts = await wait_until_async(restarted, WEBHOOK_TIMEOUT, f"the remediator's restart of {name}", stack.logs)
        hang_to_restart = time.time() - since
        assert [(a["target"], a["reason"], a["result"], a["alertname"], a["executor"]) for a in restarts] == [
            (name, "allowed", "ok", "LLMServerStuck", "docker")], [(a.get("result"), a.get("detail")) for a in restarts] + [stack.logs()]
        after_id, after_started, _ = engine.identity(container)
        assert after_id == before_id, "a restart keeps the container"
        assert after_started > before_started, "and starts a new process in it"
        assert [e["Action"] for e in engine.events(since, time.time() + 0.5, {"container": [container]})
                ].count("restart") == 1
        await wait_until_async(lambda: stack.target(name)["state"] == "busy", 60, f"{name} busy again after its restart", stack.logs)

        # A second hang inside the 5 min cooldown: a new episode (a new alert), refused, nothing restarted.
        second = time.time()
        httpx.post(f"{stack.url[name]}/admin/fault", json={"fault": "hang"}, timeout=5).raise_for_status()

        def refused() -> list[dict[str, Any]]:
            return [a for a in stack.actions() if a["time"] >= second and a["reason"] == "cooldown"]

        held = await wait_until_async(refused, WEBHOOK_TIMEOUT, f"the cooldown refusal of {name}'s second hang", stack.logs)
        assert held[0]["target"] == name and held[0]["decision"] == "refused", held
        assert [a for a in stack.actions() if a["decision"] == "restart"] == restarts
        assert engine.identity(container)[1] == after_started, "not restarted again"
        assert "restart" not in [e["Action"] for e in engine.events(second, time.time() + 0.5,
                                                                     {"container": [container]})]
        assert stack.target(name)["state"] == "stuck"
        print(f"\nhang -> docker restart by the remediator: {hang_to_restart:.1f} s; second hang -> cooldown "
              f"refusal: {held[0]['time'] - second:.1f} s ({held[0]['detail']})")
    finally:
        await load.stop()
