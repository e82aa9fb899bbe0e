"""The incident replay (bench/incident_replay.py), shortened to 6 hours: the outcomes the bench prints.

Virtual time: the whole replay runs the real engine model, the exporter's verdict and canary rule
and the remediator's gate in about a second, with no sleeping, and is deterministic for a seed.
"""

from __future__ import annotations

import pytest
from conftest import REPO, load_script

replay_module = load_script(REPO / "bench" / "incident_replay.py")
# 6 hours, seed 5: three batch episodes, long enough for the chat watchdog to give up on a busy server.
SHORT = replay_module.ReplayConfig(hours=6, seed=5)


@pytest.fixture(scope="module")
def busy_hang():
    return replay_module.replay(SHORT)


def test_baseline_restarts_a_busy_healthy_server_and_llm_vitals_never_does(busy_hang):
    baseline, vitals, hang = busy_hang.baseline, busy_hang.vitals, SHORT.hang_at
    assert baseline.restarts_before(hang) >= 2, replay_module.format_table(busy_hang)
    # The cascade: the chat watchdog's restart fails the batch requests in flight with 500s, and
    # the 500s watchdog restarts the server again.
    assert {r.by for r in baseline.restarts if r.time < hang} == {"chat watchdog", "500s watchdog"}
    assert baseline.errors_from_restarts > 0
    assert vitals.restarts_before(hang) == 0
    assert replay_module.expectations(busy_hang) == []


def test_llm_vitals_sends_no_canary_to_a_busy_server_while_the_chat_watchdog_queues_behind_the_batch(busy_hang):
    assert busy_hang.vitals.probes.sent_to_busy == 0
    assert busy_hang.vitals.probes.sent > busy_hang.baseline.probes.sent, "idle canaries do run"
    assert busy_hang.baseline.probes.sent_to_busy > 0
    assert busy_hang.baseline.probes.failed > 0


def test_the_true_hang_gets_exactly_one_llm_vitals_restart_within_its_detection_budget(busy_hang):
    vitals, config = busy_hang.vitals, SHORT
    after = [r for r in vitals.restarts if r.time >= config.hang_at]
    assert [(r.by, r.server_hung) for r in after] == [("llm-vitals (LLMServerStuck)", True)]
    # Stuck: no progress for stuck_after, seen by the next poll.
    assert config.stuck_after <= vitals.hang_detect_latency <= config.stuck_after + 2 * config.poll_interval
    # Then Prometheus: an evaluation to go pending, `for`, an evaluation to fire; the gate allows at once.
    budget = config.stuck_after + 2 * config.poll_interval + config.alert_for + 2 * config.eval_interval
    assert vitals.hang_restart_latency <= budget
    # (No comparison with the baseline's latency: its chat watchdog may already count failures from
    # the busy minutes before the hang and restart "early", by the same mistake as on healthy days.)
    # Every webhook the remediator got was decided; the one allowed is the restart above.
    assert [reason for _, _, reason in vitals.decisions] == ["allowed"]
    # Only the requests stuck in the hung engine were failed by it.
    assert vitals.errors_from_restarts == after[0].killed > 0


def test_an_idle_hang_is_caught_by_the_canary_as_unresponsive():
    config = replay_module.ReplayConfig(hours=6, seed=5, busy_at_hang=False)
    result = replay_module.replay(config)
    vitals = result.vitals
    assert vitals.restarts_before(config.hang_at) == 0
    assert [r.by for r in vitals.restarts] == ["llm-vitals (LLMServerUnresponsive)"]
    assert vitals.probes.sent_to_busy == 0
    # Three failed canaries (30 s apart, 10 s timeout), then `for: 1m`.
    assert vitals.hang_restart_latency <= 3 * config.canary_interval + config.alert_for + 2 * config.eval_interval + 15


def test_the_replay_is_deterministic_and_prints_its_table(busy_hang):
    again = replay_module.replay(SHORT)
    assert [(r.time, r.by, r.killed) for r in again.baseline.restarts] == [
        (r.time, r.by, r.killed) for r in busy_hang.baseline.restarts
    ]
    assert [(r.time, r.by) for r in again.vitals.restarts] == [(r.time, r.by) for r in busy_hang.vitals.restarts]
    table = replay_module.format_table(busy_hang)
    for label in ("restarts, total", "sent to a busy server", "HTTP 500s caused by restarts", "hang -> restart"):
        assert label in table
    assert busy_hang.wall_seconds < 30, "a compressed day must stay cheap"


def test_the_cli_rejects_a_hang_outside_the_day(capsys):
    with pytest.raises(SystemExit) as exc:
        replay_module.main(["--hours", "6", "--hang-at", "7"])
    assert exc.value.code == 2
    assert "--hang-at must fall within the replayed day" in capsys.readouterr().err
