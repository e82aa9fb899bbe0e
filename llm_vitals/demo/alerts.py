"""How alerts reach the remediator: the real Prometheus + Alertmanager, or a relay standing in.

With Debian's `prometheus` and `prometheus-alertmanager` installed, the demo runs them on the repo's
own rules (shorter `for:`) and routing, so the remediator sees exactly what it would in production.
Without them, `WebhookRelay` does Alertmanager's job for the two restartable alerts: it watches the
exporter's API and POSTs Alertmanager v4 webhooks (firing after `for`, re-sent every repeat
interval, resolved once), with the bearer token.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shutil
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp

from llm_vitals.demo.alert_rule import Notification, RuleState, evaluate
from llm_vitals.demo.configs import REMEDIATOR_RECEIVER
from llm_vitals.demo.monitoring import READY_PATH, alertmanager_argv, prometheus_argv
from llm_vitals.demo.ports import Ports
from llm_vitals.demo.processes import Children
from llm_vitals.demo.timings import Timings

ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of a firing alert


def find_monitoring_binaries() -> tuple[str, str] | None:
    """(prometheus, alertmanager) paths, or None when either is missing."""
    prometheus = shutil.which("prometheus")
    alertmanager = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    return (prometheus, alertmanager) if prometheus and alertmanager else None


async def start_prometheus_stack(children: Children, session: aiohttp.ClientSession, binaries: tuple[str, str],
                                 ports: Ports, files: dict, run_dir) -> None:
    """Alertmanager, then Prometheus (which sends to it), each ready before the next step."""
    prometheus, alertmanager = binaries
    (run_dir / "am-data").mkdir(exist_ok=True)
    (run_dir / "prom-data").mkdir(exist_ok=True)
    am = await children.start("alertmanager", alertmanager_argv(alertmanager, files["alertmanager"], run_dir / "am-data",
                                                                ports.alertmanager))
    await am.wait_ready(session, f"http://127.0.0.1:{ports.alertmanager}{READY_PATH}", timeout=30)
    prom = await children.start("prometheus", prometheus_argv(prometheus, files["prometheus"], run_dir / "prom-data",
                                                              ports.prometheus))
    await prom.wait_ready(session, f"http://127.0.0.1:{ports.prometheus}{READY_PATH}", timeout=30)


@dataclass
class WebhookRelay:
    """Alertmanager's part, for machines without it: exporter state -> v4 webhook to the remediator."""

    exporter_url: str
    remediator_url: str
    token: str
    timings: Timings
    targets: frozenset[str]
    _rules: dict[str, RuleState] = field(default_factory=dict)  # target -> its alert, pending or firing

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Poll the exporter every half poll interval until cancelled."""
        while True:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                async with session.get(f"{self.exporter_url}/api/v1/targets", timeout=aiohttp.ClientTimeout(total=3)) as r:
                    targets = (await r.json())["targets"]
                await self.step(session, {t["name"]: t["state"] for t in targets}, time.time())
            await asyncio.sleep(max(0.2, self.timings.poll_interval / 2))

    async def step(self, session: aiohttp.ClientSession, states: dict[str, str], now: float) -> None:
        for name in sorted(self.targets):
            self._rules[name], sent = evaluate(self._rules.get(name, RuleState()), states.get(name), now,
                                               self.timings.rule_for, self.timings.repeat_interval)
            for notification in sent:
                await self._send(session, name, notification, now)

    async def _send(self, session: aiohttp.ClientSession, target: str, firing: Notification, now: float) -> None:
        status = firing.status
        labels = {"alertname": firing.alertname, "target": target, "severity": "critical",
                  "remediation": "restart", "job": "llm-vitals"}
        alert = {
            "status": status, "labels": labels,
            "annotations": {"summary": f"LLM server {target} is {firing.alertname.removeprefix('LLMServer').lower()}"},
            "startsAt": _iso(firing.starts_at), "endsAt": _iso(now) if status == "resolved" else ZERO_TIME,
            "generatorURL": "demo-relay", "fingerprint": hashlib.sha256(f"{firing.alertname}/{target}".encode()).hexdigest()[:16],
        }
        payload: dict[str, Any] = {
            "version": "4", "groupKey": f'{{}}/{{remediation="restart"}}:{{alertname="{firing.alertname}", target="{target}"}}',
            "truncatedAlerts": 0, "status": status, "receiver": REMEDIATOR_RECEIVER,
            "groupLabels": {"alertname": firing.alertname, "target": target}, "commonLabels": labels,
            "commonAnnotations": alert["annotations"], "externalURL": "http://demo-relay", "alerts": [alert],
        }
        # Not retried (Alertmanager would retry a 5xx): a still-firing alert is re-sent after repeat_interval.
        with contextlib.suppress(TimeoutError, aiohttp.ClientError):
            async with session.post(f"{self.remediator_url}/webhook", json=payload,
                                    headers={"Authorization": f"Bearer {self.token}"},
                                    timeout=aiohttp.ClientTimeout(total=15)) as response:
                await response.read()


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")
