"""The real-stack harness (tests/stack.py) works end to end, cheaply.

A static page stands in for the exporter: a stuck target `x` and a down target `y`. The real
Prometheus scrapes it and evaluates the production rules (short `for:`), the real Alertmanager
routes with the repo's own `alerts/alertmanager.yml`, and a small sink standing in for the
remediator must receive `x`'s LLMServerStuck with the bearer token, while `y`'s page-only
LLMServerDown is routed to people only.
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
import yaml
from aiohttp import web
from conftest import require_binary
from stack import (
    EXPORTER_JOB,
    REMEDIATOR_RECEIVER,
    RULES_FILE,
    RealStack,
    StackError,
    alertmanager_config,
    pid_alive,
    start_on_free_port,
    write_rules_with_short_for,
)

TOKEN = "harness-s3cret"

# What an exporter would show for a hung server `x` and a dead server `y`.
PAGE = """\
# HELP llm_vitals_state 1 for the target's current state.
# TYPE llm_vitals_state gauge
llm_vitals_state{target="x",state="busy"} 0
llm_vitals_state{target="x",state="stuck"} 1
llm_vitals_state{target="y",state="down"} 1
# HELP llm_vitals_stuck_seconds Seconds with work pending and no progress.
# TYPE llm_vitals_stuck_seconds gauge
llm_vitals_stuck_seconds{target="x"} 999
llm_vitals_stuck_seconds{target="y"} 0
"""


def page_app() -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


RECEIVED = web.AppKey("received", list)


def sink_app() -> web.Application:
    """Records every webhook POST: (Authorization header, JSON body)."""

    async def webhook(request: web.Request) -> web.Response:
        request.app[RECEIVED].append((request.headers.get("Authorization"), await request.json()))
        return web.json_response({"ok": True})

    app = web.Application()
    app[RECEIVED] = []
    app.router.add_post("/webhook", webhook)
    return app


# -- config writers ------------------------------------------------------------------------------


def test_short_for_copy_sets_every_for_and_leaves_production_file_untouched(tmp_path):
    promtool = require_binary("promtool")
    before = RULES_FILE.read_text()
    copy = write_rules_with_short_for(RULES_FILE, tmp_path / "rules.yml", seconds=2, overrides={"LLMServerDown": 0.5})

    assert RULES_FILE.read_text() == before
    rules = {r["alert"]: r for g in yaml.safe_load(copy.read_text())["groups"] for r in g["rules"]}
    production = {r["alert"]: r for g in yaml.safe_load(before)["groups"] for r in g["rules"]}
    assert rules.keys() == production.keys()
    for name, rule in rules.items():
        assert rule["expr"] == production[name]["expr"], "only `for:` may change"
        if "for" in production[name]:
            assert rule["for"] == ("500ms" if name == "LLMServerDown" else "2s")
        else:
            assert "for" not in rule
    check = subprocess.run([promtool, "check", "rules", str(copy)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_short_for_rejects_an_override_for_an_unknown_alert(tmp_path):
    with pytest.raises(ValueError, match=r"no alert named \['LLMServerTypo'\]"):
        write_rules_with_short_for(RULES_FILE, tmp_path / "r.yml", overrides={"LLMServerTypo": 1})


def test_short_for_rejects_a_file_that_is_not_a_rules_file(tmp_path):
    bogus = tmp_path / "bogus.yml"
    bogus.write_text("scrape_configs: []\n")
    with pytest.raises(ValueError, match="not a Prometheus rules file"):
        write_rules_with_short_for(bogus, tmp_path / "r.yml")


def test_test_alertmanager_config_is_valid_and_routes_restart_alerts_to_the_webhook(tmp_path):
    amtool = require_binary("amtool")
    config = alertmanager_config("http://127.0.0.1:1/webhook", TOKEN, tmp_path, repeat_interval="5s")
    path = tmp_path / "am.yml"
    path.write_text(yaml.safe_dump(config))

    assert TOKEN not in path.read_text(), "the token lives in its own file, not in the config"
    assert (tmp_path / f"{REMEDIATOR_RECEIVER}.token").read_text().strip() == TOKEN
    check = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    route = subprocess.run(
        [amtool, "config", "routes", "test", f"--config.file={path}", "alertname=LLMServerStuck", "remediation=restart"],
        capture_output=True,
        text=True,
    )
    assert route.stdout.strip().split(",")[0] == REMEDIATOR_RECEIVER


# -- the real stack ------------------------------------------------------------------------------


@pytest.mark.e2e
async def test_stuck_page_fires_the_real_rule_and_alertmanager_posts_it_with_the_bearer_token(
    aiohttp_server, tmp_path
):
    page = await aiohttp_server(page_app())
    sink = await aiohttp_server(sink_app())
    received = sink.app[RECEIVED]
    rules = write_rules_with_short_for(RULES_FILE, tmp_path / "rules.yml", seconds=1)
    am_config = alertmanager_config(str(sink.make_url("/webhook")), TOKEN, tmp_path)

    stack = RealStack(
        tmp_path / "stack",
        scrape_targets={EXPORTER_JOB: [f"127.0.0.1:{page.port}"]},
        rule_files=[rules],
        alertmanager_config=am_config,
    )
    async with stack:
        pids = [stack.prometheus.pid, stack.alertmanager.pid]
        assert all(pid_alive(pid) for pid in pids)

        def stuck_x_posted():
            return [
                (auth, body)
                for auth, body in received
                for alert in body["alerts"]
                if alert["labels"].get("alertname") == "LLMServerStuck" and alert["labels"].get("target") == "x"
            ]

        # Generous: the real Prometheus skips evaluations when the machine is loaded.
        auth, payload = (await stack.wait_for(stuck_x_posted, timeout=30, what="LLMServerStuck webhook"))[0]
        assert auth == f"Bearer {TOKEN}"
        assert payload["version"] == "4"
        assert payload["receiver"] == REMEDIATOR_RECEIVER
        assert payload["status"] == "firing"
        assert payload["groupLabels"] == {"alertname": "LLMServerStuck", "target": "x"}
        alert = payload["alerts"][0]
        assert alert["labels"]["remediation"] == "restart"
        assert alert["labels"]["job"] == EXPORTER_JOB
        assert alert["annotations"]["runbook_url"].endswith("docs/runbook.md#llmserverstuck")
        assert "16m 39s" in alert["annotations"]["description"]  # the `query` template read 999 s
        assert alert["fingerprint"] and alert["startsAt"]

        # The same Alertmanager routed the down server to people only, never to the remediator.
        async def down_y_routing():
            for am_alert in await stack.alertmanager_alerts():
                labels = am_alert["labels"]
                if labels.get("alertname") == "LLMServerDown" and labels.get("target") == "y":
                    return sorted(r["name"] for r in am_alert["receivers"])
            return None

        assert await stack.wait_for(down_y_routing, timeout=30, what="LLMServerDown in Alertmanager") == [
            "oncall-pager"
        ]
        assert all(
            a["labels"].get("target") != "y" for _, body in received for a in body["alerts"]
        ), "a page-only alert reached the remediator's webhook"

        # The query helper sees what the rule saw.
        series = await stack.query('llm_vitals_state{state="stuck"} == 1')
        assert [s["metric"]["target"] for s in series] == ["x"]
        firing = await stack.prometheus_alerts(state="firing")
        # (Rules about the watchers carry no `target`: the remediator is absent from this harness.)
        assert {(a["labels"]["alertname"], a["labels"].get("target")) for a in firing} >= {
            ("LLMServerStuck", "x"),
            ("LLMServerDown", "y"),
        }

    assert not any(pid_alive(pid) for pid in pids), "teardown must stop both processes"


@pytest.mark.e2e
async def test_a_stack_that_cannot_start_says_why_and_leaves_no_process(tmp_path):
    broken = tmp_path / "broken.rules.yml"
    broken.write_text('groups:\n  - name: x\n    rules:\n      - alert: Bad\n        expr: "x >"\n')
    am_config = alertmanager_config("http://127.0.0.1:1/webhook", TOKEN, tmp_path)
    stack = RealStack(
        tmp_path / "stack",
        scrape_targets={EXPORTER_JOB: ["127.0.0.1:1"]},
        rule_files=[broken],
        alertmanager_config=am_config,
    )

    with pytest.raises(StackError, match=r"(?s)prometheus exited with status 1 before it was ready.*broken\.rules\.yml"):
        async with stack:
            pass

    assert stack.alertmanager is not None and stack.alertmanager.returncode is not None
    assert not pid_alive(stack.alertmanager.pid), "Alertmanager, started first, must be stopped too"


async def test_a_managed_process_starts_on_a_free_port_gets_its_env_and_stops_by_its_pid(tmp_path):
    """The generic helper the full end-to-end test uses for the exporter and the remediator."""
    script = (
        "import http.server, os, sys\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        body = os.environ['HARNESS_PROBE'].encode()\n"
        "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
    )

    def build(port: int):
        return [sys.executable, "-c", script, str(port)], f"http://127.0.0.1:{port}/"

    process, port = await start_on_free_port("probe", build, tmp_path / "probe.log", env={"HARNESS_PROBE": "hello"})
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            assert (await client.get(f"http://127.0.0.1:{port}/")).text == "hello"
        assert pid_alive(process.pid)
    finally:
        await process.stop()
    assert not pid_alive(process.pid)
    assert process.returncode is not None
