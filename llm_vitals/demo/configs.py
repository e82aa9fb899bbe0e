"""The config files the demo's processes read, written into its run directory.

The exporter and remediator configs use the same shapes as `llm_vitals/exporter/example.yaml` and
`llm_vitals/remediator/example.yaml`; Prometheus evaluates the repo's own `alerts/llm-vitals.rules.yml` with
shorter `for:` values, and Alertmanager routes with the repo's own `alerts/alertmanager.yml`,
pointed at the demo's remediator.
"""

from __future__ import annotations

import secrets
import shlex
from pathlib import Path
from typing import Any

import yaml

from llm_vitals.demo import monitoring
from llm_vitals.demo.ports import BACKENDS, Ports
from llm_vitals.demo.timings import Timings
from llm_vitals.durations import format_duration
from llm_vitals.sim.engines.table import sim_engine

SIM_MODEL = "tiny"  # the simulator's default served model

# The demo runs from a checkout (`make demo`): it reads the alert rules and the Alertmanager
# example from the repository, not from the installed package.
REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "alerts" / "llm-vitals.rules.yml"
ALERTMANAGER = REPO / "alerts" / "alertmanager.yml"
REMEDIATOR_RECEIVER = "llm-vitals-remediator"
TOKEN_ENV = "LLM_VITALS_DEMO_WEBHOOK_TOKEN"


def engine_target_name(engine: str) -> str:
    """The mixed fleet's server of `engine`: "triton-1" on screen."""
    return f"{engine}-1"


def backend_name(index: int) -> str:
    """Backend 0 of the simulator is "backend-1" on screen, as in the story."""
    return f"backend-{index + 1}"


def decisions_command(remediator_url: str, read_token_file: Path) -> str:
    """A ready-to-paste `curl` for the remediator's decisions, with its read token (which can never restart)."""
    token = shlex.quote(str(read_token_file))
    return f'curl -s -H "Authorization: Bearer $(cat {token})" {remediator_url}/api/v1/actions'


def _write(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=1000))
    return path


def exporter_config(ports: Ports, timings: Timings) -> dict[str, Any]:
    targets: list[dict[str, Any]] = [
        {"name": backend_name(i), "url": f"http://127.0.0.1:{ports.backend_port(i)}", "engine": "vllm",
         "stuck_after": timings.stuck_after, "startup_grace": 30,
         "canary": {"interval": max(5.0, 5 * timings.poll_interval), "timeout": 3}}
        for i in range(BACKENDS)
    ]
    targets.append({"name": "proxy", "url": f"http://127.0.0.1:{ports.proxy}", "role": "proxy", "startup_grace": 30})
    # The mixed fleet: one simulated server per other engine, judged by its own adapter, outside the story.
    for engine, port in ports.engines:
        url = f"http://127.0.0.1:{port}"
        target: dict[str, Any] = {"name": engine_target_name(engine), "url": url, "engine": engine,
                                  "stuck_after": timings.stuck_after, "startup_grace": 30,
                                  "canary": {"interval": max(5.0, 5 * timings.poll_interval), "timeout": 3}}
        for key, value in sim_engine(engine).target(url, SIM_MODEL).items():
            target[key] = {**target[key], **value} if isinstance(value, dict) and key in target else value
        targets.append(target)
    # Generous HTTP timeouts: on a busy laptop a slow answer must not read as `down (timeout)`.
    return {"listen": f"127.0.0.1:{ports.exporter}", "poll_interval": timings.poll_interval,
            "metrics_timeout": 10, "health_timeout": 10, "models_timeout": 10,
            "remediator_url": f"http://127.0.0.1:{ports.remediator}", "history_seconds": 600,
            "log_level": "info", "targets": targets}


def remediator_config(ports: Ports, timings: Timings, run_dir: Path) -> dict[str, Any]:
    control = f"http://127.0.0.1:{ports.control}"
    return {
        "listen": f"127.0.0.1:{ports.remediator}",
        "exporter_url": f"http://127.0.0.1:{ports.exporter}",
        "exporter_timeout": 2,
        "auth": {"bearer_token_env": TOKEN_ENV},
        "state_path": str(run_dir / "remediator.db"),
        "global_cooldown": timings.cooldown,
        # The story restarts each backend about once a loop, forever: a budget that a real fleet
        # would never need, so that the loop never opens a circuit, and no backoff (which would
        # slow the story's loop down to one restart in 4 h).
        "budget": {"max_restarts": 50, "window": "10m", "backoff": {"initial": "0s"}},
        # Two of three may be unhealthy and still get a restart; three at once is a wider fault.
        "max_unhealthy": 2,
        "targets": {backend_name(i): {"executor": "http", "url": f"{control}/backends/{i}/restart", "timeout": 10}
                    for i in range(BACKENDS)},
    }


def prometheus_config(ports: Ports, timings: Timings, rules: Path) -> dict[str, Any]:
    """Scrape the exporter and the remediator, evaluate the rules, and alert to the demo's Alertmanager."""
    return monitoring.prometheus_config(
        {"llm-vitals": [f"127.0.0.1:{ports.exporter}"], "llm-vitals-remediator": [f"127.0.0.1:{ports.remediator}"]},
        [rules], f"127.0.0.1:{ports.alertmanager}", interval=timings.scrape_interval)


def alertmanager_config(ports: Ports, timings: Timings, token_file: Path) -> dict[str, Any]:
    """The repo's example routing, its remediator receiver pointed here, with demo timings."""
    # A refused (cooldown) alert comes back every repeat interval, so the second of a pair is
    # restarted soon after the cooldown ends.
    return monitoring.alertmanager_routing(ALERTMANAGER, REMEDIATOR_RECEIVER, f"http://127.0.0.1:{ports.remediator}/webhook",
                                           token_file, repeat_interval=format_duration(timings.repeat_interval))


def write_all(run_dir: Path, ports: Ports, timings: Timings, token: str, read_token: str | None = None) -> dict[str, Path]:
    """Write every config file; returns their paths by name.

    `token` is the remediator's act token (Alertmanager's webhook); `read_token` (made here when not
    given) its read token, the only one the exporter's status page holds: it can never restart."""
    token_file = run_dir / "webhook.token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    read_file = run_dir / "read.token"
    read_file.write_text((read_token or secrets.token_urlsafe(24)) + "\n")
    read_file.chmod(0o600)
    # The production rules with every `for:` set to the demo's; the expressions are unchanged.
    rules = _write(run_dir / "rules.yml", monitoring.rules_with_for(RULES, timings.rule_for))
    exporter = {**exporter_config(ports, timings), "remediator_token_file": str(read_file)}
    remediator = remediator_config(ports, timings, run_dir)
    remediator["auth"] = {**remediator["auth"], "read_token_file": str(read_file)}
    return {
        "exporter": _write(run_dir / "exporter.yaml", exporter),
        "remediator": _write(run_dir / "remediator.yaml", remediator),
        "read_token": read_file,
        "rules": rules,
        "prometheus": _write(run_dir / "prometheus.yml", prometheus_config(ports, timings, rules)),
        "alertmanager": _write(run_dir / "alertmanager.yml", alertmanager_config(ports, timings, token_file)),
        "token": token_file,
    }
