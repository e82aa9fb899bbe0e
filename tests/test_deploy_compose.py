"""docker-compose.yml and the files it mounts: real parsers first, then the structure we rely on.

`docker-compose config -q` (Debian's 1.29) and the real config checkers (promtool, amtool) judge
syntax; the config files the containers load are validated by the project's own settings models.
No Docker daemon is needed: nothing is built or started here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import REPO, require_binary

from llm_vitals.exporter.settings import ExporterSettings
from llm_vitals.remediator.settings import DockerTarget
from llm_vitals.remediator.settings import Settings as RemediatorSettings

COMPOSE_FILE = REPO / "docker-compose.yml"
COMPOSE = yaml.safe_load(COMPOSE_FILE.read_text())
SERVICES = COMPOSE["services"]
CONFIG_DIR = REPO / "deploy" / "compose"
PROJECT_SERVICES = ["sim-a", "sim-b", "sim-c", "exporter", "remediator"]


def _compose(*args: str) -> subprocess.CompletedProcess:
    binary = require_binary("docker-compose")
    # A clean environment: the defaults in the file must be enough for `up` on a laptop.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_VITALS_", "VLLM_", "EXPORTER_", "REMEDIATOR_"))}
    return subprocess.run([binary, "-f", str(COMPOSE_FILE), "--project-directory", str(REPO), *args],
                          capture_output=True, text=True, timeout=60, env=env, cwd=REPO)


# ---- real parsers ---------------------------------------------------------------------------

@pytest.mark.parametrize("profile", [[], ["--profile", "gpu"]], ids=["default", "gpu"])
def test_docker_compose_accepts_the_file(profile):
    result = _compose(*profile, "config", "-q")
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr, result.stderr


def test_prometheus_config_is_valid():
    promtool = require_binary("promtool")
    result = subprocess.run([promtool, "check", "config", str(CONFIG_DIR / "prometheus.yml")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanager_config_is_valid():
    amtool = require_binary("amtool")
    result = subprocess.run([amtool, "check-config", str(CONFIG_DIR / "alertmanager.yml")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


# ---- structure ------------------------------------------------------------------------------

def test_vllm_is_gpu_only_and_reserves_a_gpu():
    vllm = SERVICES["vllm"]
    assert vllm["profiles"] == ["gpu"]
    assert vllm["image"].startswith("vllm/vllm-openai:")
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    # vLLM exits 0 when its engine dies: only an unconditional policy brings it back.
    assert vllm["restart"] in {"always", "unless-stopped"}


def test_default_profile_runs_the_simulator_and_the_whole_chain():
    default = {name for name, s in SERVICES.items() if not s.get("profiles")}
    assert default == {"sim-a", "sim-b", "sim-c", "exporter", "remediator", "prometheus",
                       "alertmanager", "grafana"}
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    for name in PROJECT_SERVICES:
        service = SERVICES[name]
        assert service["build"] == "." and service["image"] == "llm-vitals:local", name
        assert service["command"][0] in scripts, f"{name}: {service['command'][0]} is not a console script"
    for name in ["sim-a", "sim-b", "sim-c"]:
        assert SERVICES[name]["command"][:1] == ["llm-vitals-sim"]


def test_every_service_has_a_healthcheck_and_dependencies_wait_for_health():
    for name, service in SERVICES.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    expected = {
        "exporter": {"sim-a", "sim-b", "sim-c"},
        "remediator": {"exporter"},
        "alertmanager": {"remediator"},
        "prometheus": {"exporter", "alertmanager"},
        "grafana": {"prometheus"},
    }
    for name, deps in expected.items():
        depends = SERVICES[name]["depends_on"]
        assert set(depends) == deps, name
        for dep, spec in depends.items():
            assert spec == {"condition": "service_healthy"}, f"{name} -> {dep}"


def test_ports_are_published_on_loopback_only():
    for name, service in SERVICES.items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name}: {port}"


def _mounts(service: str) -> dict[str, str]:
    """container path -> host path (relative to the repo) of a service's bind mounts."""
    out = {}
    for volume in SERVICES[service].get("volumes", []):
        source, target = volume.split(":")[:2]
        out[target] = source
    return out


def test_every_bind_mounted_file_exists():
    for name in SERVICES:
        for target, source in _mounts(name).items():
            if source.startswith("./"):
                assert (REPO / source).exists(), f"{name}: {source} (mounted at {target}) is missing"


def test_remediator_restarts_through_the_docker_socket():
    mounts = _mounts("remediator")
    assert mounts["/var/run/docker.sock"] == "/var/run/docker.sock"
    assert mounts["/var/lib/llm-vitals"] == "remediator-state"
    assert "remediator-state" in COMPOSE["volumes"]


def test_prometheus_loads_the_alert_rules_and_grafana_the_dashboard():
    mounts = _mounts("prometheus")
    assert mounts["/etc/prometheus/rules/llm-vitals.rules.yml"] == "./alerts/llm-vitals.rules.yml"
    config = yaml.safe_load((CONFIG_DIR / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in config["scrape_configs"]}
    # LLMVitalsExporterAbsent watches up{job="llm-vitals"}.
    assert jobs["llm-vitals"] == ["exporter:9471"]
    assert jobs["llm-vitals-remediator"] == ["remediator:9472"]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]

    grafana = _mounts("grafana")
    assert grafana["/var/lib/grafana/dashboards/llm-vitals.json"] == "./dashboards/llm-vitals.json"
    assert grafana["/etc/grafana/provisioning"] == "./deploy/compose/grafana/provisioning"
    provisioning = CONFIG_DIR / "grafana" / "provisioning"
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    assert datasource["datasources"][0]["type"] == "prometheus"
    dashboards = yaml.safe_load((provisioning / "dashboards" / "llm-vitals.yml").read_text())
    assert dashboards["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_alertmanager_sends_restart_alerts_to_the_remediator_with_the_token():
    config = yaml.safe_load((CONFIG_DIR / "alertmanager.yml").read_text())
    route = next(r for r in config["route"]["routes"] if r["receiver"] == "remediator")
    assert route["matchers"] == ['remediation="restart"']
    receiver = next(r for r in config["receivers"] if r["name"] == "remediator")
    webhook = receiver["webhook_configs"][0]
    assert webhook["url"] == "http://remediator:9472/webhook"
    token_file = webhook["http_config"]["authorization"]["credentials_file"]
    # The entrypoint writes that file from the same variable the remediator reads.
    entrypoint = " ".join(SERVICES["alertmanager"]["entrypoint"])
    assert f"> {token_file}" in entrypoint and "$$LLM_VITALS_WEBHOOK_TOKEN" in entrypoint
    assert str(Path(token_file).parent) in SERVICES["alertmanager"]["tmpfs"]
    assert SERVICES["alertmanager"]["environment"]["LLM_VITALS_WEBHOOK_TOKEN"] == \
        SERVICES["remediator"]["environment"]["LLM_VITALS_WEBHOOK_TOKEN"]


@pytest.mark.parametrize("variant", ["", ".gpu"], ids=["default", "gpu"])
def test_exporter_and_remediator_configs_are_valid_and_agree(variant):
    exporter = ExporterSettings.model_validate(
        yaml.safe_load((CONFIG_DIR / f"exporter{variant}.yaml").read_text()))
    remediator = RemediatorSettings.model_validate(
        yaml.safe_load((CONFIG_DIR / f"remediator{variant}.yaml").read_text()))
    assert exporter.port == 9471 and remediator.host_port == ("0.0.0.0", 9472)
    assert remediator.exporter_url == "http://exporter:9471"
    assert remediator.auth.bearer_token_env == "LLM_VITALS_WEBHOOK_TOKEN"
    # The status page holds the read token only: it can never restart, pause or reset.
    assert exporter.remediator_token_env == remediator.auth.read_token_env == "LLM_VITALS_READ_TOKEN"
    assert "LLM_VITALS_WEBHOOK_TOKEN" not in SERVICES["exporter"]["environment"]
    assert str(remediator.state_path).startswith("/var/lib/llm-vitals/")
    assert {t.name for t in exporter.targets} == set(remediator.targets)
    containers = {s["container_name"]: name for name, s in SERVICES.items()}
    for name, target in remediator.targets.items():
        assert isinstance(target, DockerTarget), name
        service = containers[target.container]
        # The exporter reaches that same container.
        assert exporter.target(name).base_url == f"http://{service}:8000"
    mounted = _mounts("exporter")
    assert mounted[f"/etc/llm-vitals/exporter{variant}.yaml"] == f"./deploy/compose/exporter{variant}.yaml"
    assert _mounts("remediator")[f"/etc/llm-vitals/remediator{variant}.yaml"] == \
        f"./deploy/compose/remediator{variant}.yaml"


def test_dockerignore_keeps_the_build_context_to_the_package():
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", ".cache", "tests"} <= ignored
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    for needed in [*(package.rstrip("*") for package in packages), "pyproject.toml", "README.md"]:
        assert needed not in ignored, f"{needed} is needed by pip install ."
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "pip install /src" in dockerfile and "USER 10001" in dockerfile


@pytest.mark.parametrize("program", ["exporter", "remediator"])
def test_the_real_cli_accepts_the_mounted_configs(program):
    """What the container runs: `llm-vitals-<program> --check-config` on the same files."""
    env = {**os.environ, "LLM_VITALS_WEBHOOK_TOKEN": "test-token-not-a-secret", "LLM_VITALS_READ_TOKEN": "read-not-a-secret"}
    # One interpreter for both files: importing the app is most of the cost.
    code = (f"import sys; from llm_vitals.{program}.cli import main\n"
            "sys.exit(max(main(['--check-config', '--config', path]) for path in sys.argv[1:]))")
    configs = [str(CONFIG_DIR / f"{program}.yaml"), str(CONFIG_DIR / f"{program}.gpu.yaml")]
    result = subprocess.run([sys.executable, "-c", code, *configs], capture_output=True, text=True,
                            timeout=30, cwd=REPO, env=env)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_alertmanager_repeats_no_sooner_than_every_remediator_cooldown():
    """A repeat inside the cooldown is only refused; the example must not invite that. A repeat just
    as long lands after it: the refusal it answers came after the restart that started the cooldown."""
    from llm_vitals.durations import parse_duration

    compose_dir = REPO / "deploy" / "compose"
    am = yaml.safe_load((compose_dir / "alertmanager.yml").read_text())
    restart_routes = [r for r in am["route"]["routes"] if r["receiver"] == "remediator"]
    repeat = parse_duration(restart_routes[0].get("repeat_interval", am["route"]["repeat_interval"]))
    for cfg in compose_dir.glob("remediator*.yaml"):
        cooldown = parse_duration(yaml.safe_load(cfg.read_text())["global_cooldown"])
        assert repeat >= cooldown, cfg.name


# ---- the test override (docker-compose.test.yml, run for real by `make test-docker`) ---------

def test_the_test_override_puts_every_service_on_the_host_network_and_leaves_grafana_out():
    override = yaml.safe_load((REPO / "docker-compose.test.yml").read_text())
    services = override["services"]
    assert set(services) == {"sim-a", "sim-b", "sim-c", "exporter", "remediator", "prometheus", "alertmanager"}
    assert all(service["network_mode"] == "host" for service in services.values())
    assert override["networks"]["default"] == {"name": "host", "external": True}
    env = {f"LV_{n}": "1" for n in ("SIM_A_PORT", "SIM_B_PORT", "SIM_C_PORT", "EXPORTER_PORT", "REMEDIATOR_PORT",
                                     "PROMETHEUS_PORT", "ALERTMANAGER_PORT")}
    env.update(LV_IMAGE="i", LV_BASE_IMAGE="b", LV_CONFIG_DIR="/c", LV_DOCKER_SOCK="/s")
    binary = require_binary("docker-compose")
    result = subprocess.run([binary, "-f", str(COMPOSE_FILE), "-f", str(REPO / "docker-compose.test.yml"),
                             "--project-directory", str(REPO), "config", "-q"],
                            capture_output=True, text=True, timeout=60, env={**os.environ, **env}, cwd=REPO)
    assert result.returncode == 0, result.stderr


def test_the_dockerfile_defaults_to_the_image_users_pull():
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.11-slim" in dockerfile
    assert dockerfile.count("FROM ${BASE_IMAGE}") == 2
    assert "--no-index --find-links" in dockerfile  # a wheelhouse build fetches nothing
