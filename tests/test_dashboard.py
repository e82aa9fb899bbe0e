"""The Grafana dashboard as shipped: in sync with its generator, well-formed, on the metric contract.

The end-to-end test runs the same queries (`dashboards/queries.py`) against a real Prometheus;
here everything is offline, with promtool's parser as the judge of PromQL syntax.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from conftest import REPO, load_script, require_binary

generate = load_script(REPO / "dashboards" / "generate.py")
queries = load_script(REPO / "dashboards" / "queries.py")

BOARD = json.loads((REPO / "dashboards" / "llm-vitals.json").read_text())


def test_committed_json_is_what_the_generator_writes():
    committed = (REPO / "dashboards" / "llm-vitals.json").read_text()
    assert committed == generate.render(), "run: python dashboards/generate.py"


def test_every_panel_has_a_datasource_and_a_query_on_the_target_variable():
    variables = {v["name"]: v for v in BOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert BOARD["panels"], "dashboard has no panels"
    for panel in BOARD["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for tgt in panel["targets"]:
            assert tgt["datasource"] == panel["datasource"], panel["title"]
            assert tgt["expr"].strip(), panel["title"]
            assert '=~"$target"' in tgt["expr"], f"{panel['title']!r} ignores the target variable"
            assert 'and on (target) llm_vitals_target_info{engine=~"$engine"}' in tgt["expr"], (
                f"{panel['title']!r} ignores the engine variable"
            )


def test_engine_and_target_variables_list_from_target_info_targets_of_the_chosen_engines():
    variables = [v["name"] for v in BOARD["templating"]["list"]]
    assert variables.index("engine") < variables.index("target"), "Grafana resolves variables in order"
    assert queries.variable_query(BOARD, "engine") == "label_values(llm_vitals_target_info, engine)"
    assert queries.variable_query(BOARD) == 'label_values(llm_vitals_target_info{engine=~"$engine"}, target)'
    for name in ("engine", "target"):
        var = next(v for v in BOARD["templating"]["list"] if v["name"] == name)
        assert var["type"] == "query" and var["datasource"]["uid"] == "${datasource}"
        assert var["multi"] and var["includeAll"] and var["allValue"] == ".+"


def test_engine_variable_keeps_only_the_chosen_engines_targets_on_promtool(tmp_path):
    """PromQL evaluated by promtool: with $engine = triton, a panel shows the Triton target only,
    also where the query aggregates the target away (remediator decisions by reason)."""
    promtool = require_binary("promtool")
    by_title = {q.panel: q.expr for q in queries.dashboard_queries(engine="triton", rate_interval="5m")}
    series = [
        {"series": 'llm_vitals_target_info{target="gpu-a",engine="vllm",role="backend",url="http://a"}', "values": "1+0x10"},
        {"series": 'llm_vitals_target_info{target="tri-a",engine="triton",role="backend",url="http://t"}', "values": "1+0x10"},
        {"series": 'llm_vitals_engine_steps_per_second{target="gpu-a"}', "values": "5+0x10"},
        {"series": 'llm_vitals_engine_steps_per_second{target="tri-a"}', "values": "7+0x10"},
        {"series": 'llm_vitals_state{target="gpu-a",state="busy"}', "values": "1+0x10"},
        {"series": 'llm_vitals_state{target="tri-a",state="busy"}', "values": "0+0x10"},
        {"series": 'llm_vitals_state{target="tri-a",state="stuck"}', "values": "1+0x10"},
        {"series": 'llm_vitals_remediator_decisions_total{target="gpu-a",reason="allowed"}', "values": "0+1x10"},
        {"series": 'llm_vitals_remediator_decisions_total{target="tri-a",reason="cooldown"}', "values": "0+1x10"},
    ]
    tests = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [
            {"expr": by_title["Engine steps per second"], "eval_time": "10m",
             "exp_samples": [{"labels": 'llm_vitals_engine_steps_per_second{target="tri-a"}', "value": 7}]},
            {"expr": by_title["State per target"], "eval_time": "10m",
             "exp_samples": [{"labels": '{target="tri-a"}', "value": 4}]},  # 4 = stuck
            {"expr": by_title["Remediator decisions by reason"], "eval_time": "10m",
             "exp_samples": [{"labels": '{reason="cooldown"}', "value": 5}]},
        ],
    }]}
    path = tmp_path / "engine-variable.test.yml"
    path.write_text(yaml.safe_dump(tests))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


def test_queries_name_only_contract_metrics():
    used: set[str] = set()
    for q in queries.dashboard_queries():
        names = queries.metric_names(q.expr)
        assert names, f"{q.panel}: no metric found in {q.expr}"
        assert names <= queries.CONTRACT_METRICS, f"{q.panel}: {names - queries.CONTRACT_METRICS}"
        used |= names
    used.add("llm_vitals_target_info")  # via the variable
    # The panel list: state, steps/s, tokens/s, running/waiting, stuck seconds, restarts,
    # canary results, remediator decisions by reason.
    required = {
        "llm_vitals_state", "llm_vitals_engine_steps_per_second",
        "llm_vitals_generation_tokens_per_second", "llm_vitals_requests_running",
        "llm_vitals_requests_waiting", "llm_vitals_stuck_seconds", "llm_vitals_restarts_total",
        "llm_vitals_canary_requests_total", "llm_vitals_remediator_decisions_total",
    }
    assert required <= used, f"missing panels for {required - used}"


def test_state_timeline_maps_every_exporter_state():
    timeline = next(p for p in BOARD["panels"] if p["type"] == "state-timeline")
    options = timeline["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert {o["text"] for o in options.values()} == {
        "starting", "idle", "busy", "stuck", "unresponsive", "down", "asleep", "waiting_on_peer", "paused"}
    for number, option in options.items():
        assert f"* {number}" in timeline["targets"][0]["expr"]
        assert f'state="{option["text"]}"' in timeline["targets"][0]["expr"]


def test_panels_have_unique_ids_and_do_not_overlap():
    ids = [p["id"] for p in BOARD["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in BOARD["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & mine, f"{panel['title']!r} overlaps another panel"
        cells |= mine


def test_substitution_rejects_unknown_variables():
    assert queries.substitute('x{target=~"$target"}[$__rate_interval]', "a|b", "30s") == \
        'x{target=~"a|b"}[30s]'
    with pytest.raises(ValueError, match=r"unknown variable \$nope"):
        queries.substitute("x{a=\"$nope\"}")


def test_every_query_parses_with_promtool(tmp_path):
    """promtool's PromQL parser, via recording rules: one rule per dashboard query."""
    promtool = require_binary("promtool")
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:panel_{i}", "expr": q.expr}
        for i, q in enumerate(queries.dashboard_queries(target="gpu-a|gpu-b", rate_interval="1m"))
    ]}]}
    path = tmp_path / "dashboard-queries.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
