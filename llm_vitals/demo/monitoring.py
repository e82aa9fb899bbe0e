"""The real Prometheus and Alertmanager as the demo and the end-to-end tests run them: their command
lines, and their configs made from the repository's own rules and routing.

Pure: paths, ports and timings in; argv lists and config documents out. Who starts the processes
(the demo's `Children`, the tests' `start_on_free_port`) and on which port is the caller's business.

The flags follow the recipe measured on the Debian packages (Prometheus 2.42, Alertmanager 0.25):
`--cluster.listen-address=` turns off Alertmanager's HA gossip (else it binds 0.0.0.0:9094),
`--web.external-url` fixes the URLs in payloads, and `/-/ready` says when each is up.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from llm_vitals.durations import format_duration

READY_PATH = "/-/ready"


def alertmanager_argv(binary: str, config: Path, storage: Path, port: int, extra: Sequence[str] = ()) -> list[str]:
    """Alertmanager on 127.0.0.1:`port`, alone (no HA gossip); its ready URL is `READY_PATH`."""
    url = f"http://127.0.0.1:{port}"
    return [binary, f"--config.file={config}", f"--storage.path={storage}", f"--web.listen-address=127.0.0.1:{port}",
            f"--web.external-url={url}/", "--cluster.listen-address=", *extra]


def prometheus_argv(binary: str, config: Path, storage: Path, port: int, retention: str = "2h",
                    extra: Sequence[str] = ()) -> list[str]:
    """Prometheus on 127.0.0.1:`port`, keeping `retention` of samples; its ready URL is `READY_PATH`."""
    url = f"http://127.0.0.1:{port}"
    return [binary, f"--config.file={config}", f"--storage.tsdb.path={storage}", f"--storage.tsdb.retention.time={retention}",
            f"--web.listen-address=127.0.0.1:{port}", f"--web.external-url={url}/", *extra]


def prometheus_config(scrape_targets: Mapping[str, Sequence[str]], rule_files: Sequence[Path],
                      alertmanager_address: str | None, interval: float = 1) -> dict[str, Any]:
    """Scrape `{job: [host:port, ...]}` and evaluate the rules every `interval` seconds; alert to that Alertmanager."""
    every = format_duration(interval)
    config: dict[str, Any] = {
        "global": {"scrape_interval": every, "scrape_timeout": every, "evaluation_interval": every},
        "rule_files": [str(Path(p).resolve()) for p in rule_files],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]}
                           for job, targets in scrape_targets.items()],
    }
    if alertmanager_address:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager_address]}]}]}
    return config


def rules_with_for(source: Path, seconds: float, overrides: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The rules file's document with every `for:` set to `seconds` (or `overrides[alertname]`).

    Only `for:` changes: the expressions are the production ones. Rules without `for:` keep firing at
    once, and each group's own `interval` goes, so that all are evaluated at the global interval.
    """
    document = yaml.safe_load(Path(source).read_text())
    if not isinstance(document, dict) or not isinstance(document.get("groups"), list):
        raise ValueError(f"{source}: not a Prometheus rules file (no `groups:` list)")
    overrides = dict(overrides or {})
    unknown = set(overrides)
    for group in document["groups"]:
        group.pop("interval", None)
        for rule in group.get("rules", []):
            name = rule.get("alert")
            if name is None:
                continue
            unknown.discard(name)
            if name in overrides:
                rule["for"] = format_duration(overrides[name])
            elif "for" in rule:
                rule["for"] = format_duration(seconds)
    if unknown:
        raise ValueError(f"{source}: no alert named {sorted(unknown)} to override")
    return document


def alertmanager_routing(base: Path, receiver: str, webhook_url: str, token_file: Path, *, group_wait: str = "0s",
                         group_interval: str = "1s", repeat_interval: str = "1h") -> dict[str, Any]:
    """The Alertmanager config at `base` with `receiver` posting to `webhook_url` and every route retimed.

    The bearer token is read from `token_file`, as in production (`credentials_file`);
    `repeat_interval` is what re-sends a still-firing alert (after a cooldown refusal, say).
    """
    config = copy.deepcopy(yaml.safe_load(Path(base).read_text()))
    receivers = {r["name"]: r for r in config.get("receivers", [])}
    if receiver not in receivers:
        raise ValueError(f"{base}: no receiver named {receiver!r} (have {sorted(receivers)})")
    receivers[receiver]["webhook_configs"] = [{
        "url": webhook_url,
        "send_resolved": True,
        "max_alerts": 0,
        "http_config": {"authorization": {"type": "Bearer", "credentials_file": str(token_file)}},
    }]

    def retime(route: dict[str, Any]) -> None:
        route["group_wait"] = group_wait
        route["group_interval"] = group_interval
        route["repeat_interval"] = repeat_interval
        for child in route.get("routes", []):
            retime(child)

    retime(config["route"])
    return config
