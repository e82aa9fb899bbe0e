"""The alert rules and the example Alertmanager config, judged by the real promtool and amtool.

- `promtool check rules` and `promtool test rules` on `alerts/` (the unit tests are the spec: a
  saturated server never fires LLMServerStuck, a short stall doesn't, a restart storm does, ...);
- every rule is documented (summary, description, a runbook_url into a real runbook section) and
  has both a firing and a not-firing unit test;
- `amtool check-config` on `alerts/alertmanager.yml`, and routing: each rule's alert goes to the
  remediator exactly when it carries `remediation="restart"`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import REPO, require_binary

ALERTS = REPO / "alerts"
RULES_FILE = ALERTS / "llm-vitals.rules.yml"
UNIT_TESTS = sorted((ALERTS / "tests").glob("*.yml"))
ALERTMANAGER_FILE = ALERTS / "alertmanager.yml"
RUNBOOK = REPO / "docs" / "runbook.md"
RUNBOOK_BASE = "https://github.com/llm-vitals/llm-vitals/blob/main/docs/runbook.md#"
REMEDIATOR_RECEIVER = "llm-vitals-remediator"

EXPECTED_ALERTS = {
    "LLMServerStuck",
    "LLMServerUnresponsive",
    "LLMServerUnresponsiveLoadUnknown",  # engine openai: a page, never a restart (issue 23)
    "LLMServerCanaryRejected",  # the canary answered 4xx: the config is wrong, never a restart (issue 29)
    "LLMServerUnjudgedCanaryFailing",  # an unjudgeable target's canaries fail: a page, never a restart (issue 38)
    "LLMServerDown",
    "LLMServerRestartLoop",
    "LLMVitalsPollingStale",
    "LLMVitalsExporterLagging",  # the exporter's own loop runs late (issue 29)
    "LLMVitalsExporterAbsent",
    "LLMServerSaturated",
    "LLMServerWaitingOnPeer",  # deferred work, nothing moving: the peer's fault, remediation none (issue 29)
    "LLMServerPausedTooLong",  # paused on purpose past pause_budget: a page, remediation none (issue 38)
    "LLMServerDegraded",  # a replica at a fraction of its peers' pace: its node's fault, remediation none (issue 40)
    # The remediator's own (issue 22).
    "LLMVitalsRemediatorCircuitOpen",
    "LLMVitalsRemediatorExecutorErrors",
    "LLMVitalsRemediatorStateUnreachable",
    "LLMVitalsRemediatorAbsent",
    "LLMVitalsRemediatorDisruptionBudget",
    # Issue 30: a held page, a node llm-vitals cordoned.
    "LLMVitalsRemediatorWorkloadPaged",
    "LLMVitalsRemediatorNodeCordoned",
    "LLMVitalsRemediatorStateLost",  # the shared state gone: nothing runs until a human re-initialises it (issue 30)
    "LLMVitalsRemediatorIntentUnresolved",  # a restart intent whose commit's outcome is unknown (issue 39)
    # Issue 33: the kubelet's backstop held from restarting a stuck server for long; a shim that hears no remediator.
    "LLMVitalsBackstopHeld",
    "LLMVitalsBackstopArmed",
    "LLMVitalsBackstopUnknownWorkload",  # a shim asking about a workload the remediator never heard of (issue 39)
    "LLMVitalsRemediatorBackoffHolding",  # a stuck workload refused for its backoff, which can last hours (issue 30)
}


def alert_rules() -> dict[str, dict]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=60)


# -- promtool ------------------------------------------------------------------------------------


def test_rules_file_passes_promtool_check_rules():
    promtool = require_binary("promtool")
    result = run([promtool, "check", "rules", str(RULES_FILE)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in result.stdout


@pytest.mark.parametrize("unit_test", UNIT_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(unit_test):
    promtool = require_binary("promtool")
    result = run([promtool, "test", "rules", str(unit_test)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_unit_tests_catch_a_stuck_rule_that_reads_the_queue(tmp_path):
    """The saturated-server cases have teeth: a queue-length LLMServerStuck fails them."""
    promtool = require_binary("promtool")
    (tmp_path / "tests").mkdir()
    rules = RULES_FILE.read_text()
    stuck_expr = 'expr: llm_vitals_state{state="stuck"} == 1'
    assert rules.count(stuck_expr) == 1
    (tmp_path / RULES_FILE.name).write_text(rules.replace(stuck_expr, "expr: llm_vitals_requests_waiting > 0"))
    shutil.copy(ALERTS / "tests" / "llm-server-stuck.test.yml", tmp_path / "tests")

    result = run([promtool, "test", "rules", "tests/llm-server-stuck.test.yml"], cwd=tmp_path)

    assert result.returncode == 1
    assert re.search(r"alertname: LLMServerStuck, time: 2h,", result.stderr), result.stderr


# -- the rules as a contract (pure) --------------------------------------------------------------


def test_the_rule_set_is_exactly_the_designed_one():
    assert set(alert_rules()) == EXPECTED_ALERTS


@pytest.mark.parametrize("name", sorted(EXPECTED_ALERTS))
def test_every_rule_has_summary_description_and_a_runbook_section(name):
    rule = alert_rules()[name]
    annotations = rule.get("annotations", {})
    assert annotations.get("summary", "").strip()
    assert annotations.get("description", "").strip()
    url = annotations.get("runbook_url", "")
    assert url == RUNBOOK_BASE + name.lower()
    headings = {line[3:].strip().lower() for line in RUNBOOK.read_text().splitlines() if line.startswith("## ")}
    assert name.lower() in headings, f"docs/runbook.md has no '## {name}' section for {url}"
    assert rule["labels"].get("severity") in {"critical", "warning", "info"}


def test_only_stuck_and_unresponsive_carry_the_restart_label():
    restartable = {name for name, rule in alert_rules().items() if rule["labels"].get("remediation") == "restart"}
    assert restartable == {"LLMServerStuck", "LLMServerUnresponsive"}
    assert alert_rules()["LLMServerStuck"]["labels"]["severity"] == "critical"
    assert alert_rules()["LLMServerSaturated"]["labels"]["severity"] == "info"


def test_restartable_alerts_are_built_on_the_exporter_verdict_never_on_load():
    for name in ("LLMServerStuck", "LLMServerUnresponsive"):
        expr = alert_rules()[name]["expr"]
        assert "llm_vitals_state" in expr
        assert not re.search(r"requests_(waiting|running)|steps_per_second", expr), f"{name} reads load: {expr}"


def test_runbook_says_vllm_exits_0_so_down_servers_need_restart_always():
    section = RUNBOOK.read_text().split("## LLMServerDown", 1)[1].split("\n## ", 1)[0]
    assert "exits with status 0" in section
    assert "Restart=always" in section
    assert "Restart=on-failure" in section


def unit_test_cases() -> dict[str, set[str]]:
    """{alertname: {"fires", "silent"}} over every alert_rule_test in alerts/tests/."""
    seen: dict[str, set[str]] = {}
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                seen.setdefault(case["alertname"], set()).add("fires" if case.get("exp_alerts") else "silent")
    return seen


@pytest.mark.parametrize("name", sorted(EXPECTED_ALERTS))
def test_every_rule_has_unit_tests_that_fire_and_that_must_not(name):
    assert unit_test_cases().get(name, set()) == {"fires", "silent"}


# -- Alertmanager --------------------------------------------------------------------------------


def test_example_alertmanager_config_passes_amtool_check_config():
    amtool = require_binary("amtool")
    result = run([amtool, "check-config", str(ALERTMANAGER_FILE)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_example_alertmanager_config_sends_to_the_remediator_as_designed():
    config = yaml.safe_load(ALERTMANAGER_FILE.read_text())
    assert config["route"]["group_by"] == ["alertname", "target"]
    route = next(r for r in config["route"]["routes"] if r["receiver"] == REMEDIATOR_RECEIVER)
    assert route["matchers"] == ['remediation="restart"']
    receiver = next(r for r in config["receivers"] if r["name"] == REMEDIATOR_RECEIVER)
    (webhook,) = receiver["webhook_configs"]
    assert webhook["send_resolved"] is True
    assert webhook["http_config"]["authorization"]["type"] == "Bearer"
    assert "credentials" not in webhook["http_config"]["authorization"], "no inline secret in an example"


@pytest.mark.parametrize("name", sorted(EXPECTED_ALERTS))
def test_alertmanager_routes_an_alert_to_the_remediator_only_with_the_restart_label(name):
    amtool = require_binary("amtool")
    rule = alert_rules()[name]
    labels = {**rule["labels"], "alertname": name, "target": "gpu-a", "job": "llm-vitals"}
    result = run(
        [amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER_FILE}"]
        + [f"{key}={value}" for key, value in sorted(labels.items())]
    )
    assert result.returncode == 0, result.stdout + result.stderr
    receivers = result.stdout.strip().split(",")
    if rule["labels"].get("remediation") == "restart":
        assert REMEDIATOR_RECEIVER in receivers
    else:
        assert REMEDIATOR_RECEIVER not in receivers
    if rule["labels"]["severity"] == "critical":
        assert "oncall-pager" in receivers, "critical alerts page a person, restartable or not"


@pytest.mark.parametrize("path", [ALERTMANAGER_FILE, REPO / "deploy" / "compose" / "alertmanager.yml"],
                         ids=["alerts", "compose"])
def test_remediator_route_repeats_as_soon_as_the_remediator_has_cooled_down(path):
    """A re-send of a still-firing alert must arrive after the global cooldown, not inside it (the
    refusal it answers came after the restart that started the cooldown), and no later: several
    hangs within one cooldown are restarted one per re-send, and an hour left the fourth one stuck
    for more than 3 hours (the fleet soak, bench/soak.py)."""
    from llm_vitals.durations import parse_duration
    from llm_vitals.remediator.settings import Settings

    config = yaml.safe_load(path.read_text())
    route = next(r for r in config["route"]["routes"] if r["receiver"] in (REMEDIATOR_RECEIVER, "remediator"))
    cooldown = Settings.model_fields["global_cooldown"].default
    assert parse_duration(route["repeat_interval"]) == cooldown == 900
