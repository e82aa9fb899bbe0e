"""llm-vitals-backtest --incidents: the operator's own incidents, and each policy's caught, missed, false alarms and lead time.

Histories in memory (tests/backtest_histories.py, made of the real vLLM page); the real Prometheus
runs are in tests/test_backtest_prometheus.py and tests/test_backtest_live.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from backtest_histories import MemorySource, Phase, as_series, scrapes

from llm_vitals.backtest import cli, html, report
from llm_vitals.backtest.incidents import Alarm, Incident, IncidentsError, parse_incidents, parse_selector, score
from llm_vitals.backtest.rules import load_rules
from llm_vitals.backtest.run import Options, Window, backtest

T0 = 1_790_000_000.0
STEP = 15.0
RULES = load_rules()
HANG_AT = T0 + 3600
HANG_AND_RESTART = [Phase("saturated", 3600), Phase("hang", 600), Phase("gap", 90), Phase("restart"), Phase("saturated", 600)]
LENGTH = 3600 + 600 + 90 + 600


def history():
    return (as_series("gpu-a:8000", scrapes(T0, HANG_AND_RESTART), extra={"pod": "vllm-a-0"})
            + as_series("gpu-b:8000", scrapes(T0, [Phase("idle", 1800), Phase("saturated", LENGTH - 1800)]),
                        extra={"pod": "vllm-b-0"}))


YAML = f"""
incidents:
  - target: gpu-a:8000
    start: {HANG_AT:.0f}
    end: {HANG_AT + 690:.0f}
    kind: hang
    note: engine loop wedged, restarted by hand
  - selector: '{{pod=~"vllm-b-.*"}}'
    start: {T0 + 3000:.0f}
    end: {T0 + 3900:.0f}
    kind: slow
    note: batch job filled every slot
  - target: gpu-z:8000
    start: {T0 + 100:.0f}
    end: {T0 + 200:.0f}
    kind: down
  - target: gpu-a:8000
    start: {T0 - 86400:.0f}
    end: {T0 - 86000:.0f}
    kind: down
    note: last week
"""


def scored_run(text: str = YAML, csv_format: bool = False):
    incidents = parse_incidents(text, csv_format=csv_format)
    return backtest(MemorySource(history()), Window(T0 + STEP, T0 + LENGTH - STEP, STEP),
                    Options(rules=RULES, incidents=incidents))


def test_a_hang_is_caught_by_llm_vitals_after_stuck_after_and_the_for_and_the_slow_neighbour_is_not_a_restart() -> None:
    result = scored_run()
    scored = result.scored
    assert scored is not None
    (_, hang_targets, hang_outcomes), (_, slow_targets, slow_outcomes) = scored.incidents
    assert hang_targets == ("gpu-a:8000",) and slow_targets == ("gpu-b:8000",)
    vitals = hang_outcomes["llm-vitals"]
    # stuck once nothing moved for stuck_after (60 s, from the last read that moved, a scrape before the
    # hang), over two reads; then LLMServerStuck's for: 1m: its firing is the first alarm.
    assert vitals.caught and 60 <= vitals.lead_time <= 120 + 2 * STEP
    # The watchdog was already failing: each request of the saturated hour waited 300 s in the queue,
    # and its probe went on failing into the hang: "caught", an hour before the start written down.
    assert hang_outcomes["watchdog"].caught and hang_outcomes["watchdog"].lead_time < -1800
    # A slow server is no fault llm-vitals alarms on (LLMServerSaturated is `info`): missed, and no false alarm.
    assert not slow_outcomes["llm-vitals"].caught and slow_outcomes["watchdog"].caught
    assert scored.scores["llm-vitals"].caught == 1 and scored.scores["llm-vitals"].missed == 1
    assert scored.scores["llm-vitals"].false_alarms == 0
    # gpu-b's watchdog failed while it was saturated before its slow incident was written down: a false alarm.
    assert scored.scores["watchdog"].false_alarms >= 1
    assert all(a.policy == "watchdog" for a in scored.false_alarms)
    assert [why for _, why in scored.unscored] == ["matches no target in the history", "outside the backtest's window"]


def test_the_summary_line_is_in_the_text_the_json_and_the_html() -> None:
    result = scored_run()
    text = report.as_text(result)
    (line,) = [one for one in text.splitlines() if one.startswith("incidents: ")]
    assert line.startswith("incidents: 2 scored (1 hang, 1 slow) (2 not scored); llm-vitals caught 1, missed 1, "
                           "0 false alarm(s), lead time +1m")
    assert "a watchdog with a 10s timeout caught 2, missed 0" in line
    document = json.loads(report.dumps(result))["incidents"]
    assert document["policies"]["llm-vitals"]["caught"] == 1 and document["policies"]["watchdog"]["caught"] == 2
    assert document["incidents"][0]["llm-vitals"]["lead_time"] == result.scored.incidents[0][2]["llm-vitals"].lead_time
    assert len(document["false_alarms"]) == result.scored.scores["watchdog"].false_alarms
    assert line.replace("&", "&amp;") in html.page(result)


def test_csv_incidents_score_as_the_yaml_ones() -> None:
    csv_text = ("target,selector,start,end,kind,note\n"
                f"gpu-a:8000,,{HANG_AT:.0f},{HANG_AT + 690:.0f},hang,engine loop wedged\n"
                f',"{{pod=~""vllm-b-.*""}}",{T0 + 3000:.0f},{T0 + 3900:.0f},slow,batch job\n')
    from_csv, from_yaml = scored_run(csv_text, csv_format=True).scored, scored_run().scored
    assert [(s.caught, s.missed) for s in from_csv.scores.values()] == [(s.caught, s.missed) for s in from_yaml.scores.values()]
    assert [o["llm-vitals"].lead_time for _, _, o in from_csv.incidents] == \
           [o["llm-vitals"].lead_time for _, _, o in from_yaml.incidents[:2]]


def test_rfc3339_times_quoted_or_not_are_read() -> None:
    (one,) = parse_incidents("- {target: a, start: 2026-12-05T06:00:00Z, end: '2026-12-05T08:00:00+01:00', kind: down}")
    assert one.start == 1796450400.0 and one.end == one.start + 3600


@pytest.mark.parametrize(("text", "csv_format", "message"), [
    ("- {start: 1, end: 2, kind: hang}", False, "incident 1: give a target or a selector, exactly one"),
    ("- {target: a, selector: '{a=\"b\"}', start: 1, end: 2, kind: hang}", False, "exactly one"),
    ("- {target: a, start: 2, end: 1, kind: hang}", False, "incident 1: end must be after start"),
    ("- {target: a, start: 1, end: 2, kind: stuck}", False, "kind must be one of hang, slow, down, not 'stuck'"),
    ("- {target: a, start: yesterday, end: 2, kind: hang}", False, "incident 1: start: not Unix seconds nor RFC 3339"),
    ("- {target: a, start: 2026-12-05T06:00:00, end: 2, kind: hang}", False, "RFC 3339 needs an offset or Z"),
    ("- {target: a, start: 1, end: 2, kind: hang, severity: high}", False, "unknown field(s) severity"),
    ("- {selector: 'job=\"x\"', start: 1, end: 2, kind: hang}", False, "selector: a selector is label matchers in braces"),
    ("- {selector: '{pod=~\"(\"}', start: 1, end: 2, kind: hang}", False, "bad regex"),
    ("target: a", False, "expected a list of incidents"),
    ("- [a, b]", False, "incident 1: expected a mapping"),
    ("target,begin,end,kind\na,1,2,hang\n", True, "unknown column(s) begin"),
    ("- {target: a, end: 2, kind: hang}", False, "incident 1: no start"),
])
def test_an_incidents_file_that_cannot_be_read_is_a_clear_error(text: str, csv_format: bool, message: str) -> None:
    with pytest.raises(IncidentsError) as caught:
        parse_incidents(text, "mine.yaml", csv_format=csv_format)
    assert message in str(caught.value) and str(caught.value).startswith("mine.yaml")


def test_selectors_match_as_promql_matchers_do() -> None:
    labels = {"job": "vllm", "pod": "vllm-b-0", "instance": "gpu-b:8000"}
    for text, expected in [('{job="vllm"}', True), ('{job!="vllm"}', False), ('{pod=~"vllm-.*"}', True),
                           ('{pod=~"vllm"}', False), ('{pod!~"x.*", job="vllm"}', True), ('{zone=""}', True)]:
        assert all(m.matches(labels) for m in parse_selector(text)) is expected, text


@pytest.mark.parametrize(("alarms", "caught", "lead", "false"), [
    ([Alarm("llm-vitals", "a", 90, 200, "LLMServerStuck")], True, -10, 0),  # before the start written down
    ([Alarm("llm-vitals", "a", 150, 150, "would-be restart")], True, 50, 0),
    ([Alarm("llm-vitals", "a", 201, 300, "LLMServerStuck")], False, None, 1),  # after its end: missed, and false
    ([Alarm("llm-vitals", "b", 150, 160, "LLMServerStuck")], False, None, 1),  # another target
    ([Alarm("llm-vitals", "a", 10, 20, "x"), Alarm("llm-vitals", "a", 120, 130, "y")], True, 20, 1),
])
def test_caught_missed_false_alarms_and_lead_time_by_their_definitions(alarms, caught, lead, false) -> None:
    scored = score([Incident(100, 200, "hang", target="a")], alarms, {"a": {}, "b": {}}, (0, 1000))
    ((_, _, outcomes),) = scored.incidents
    assert outcomes["llm-vitals"].caught is caught and outcomes["llm-vitals"].lead_time == lead
    assert scored.scores["llm-vitals"].false_alarms == false
    assert scored.scores["watchdog"].missed == 1


def test_the_cli_refuses_an_incidents_file_it_cannot_read_before_reading_prometheus(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "incidents.yaml"
    bad.write_text("- {target: a, start: 1, end: 2, kind: stuck}\n")
    code = cli.main(["--prometheus", "http://127.0.0.1:9", "--start", "0", "--end", "60", "--incidents", str(bad)])
    assert code == 1
    assert "kind must be one of hang, slow, down" in capsys.readouterr().err
