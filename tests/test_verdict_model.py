"""`move`, the one way a verdict changes state: what dataclasses.replace would give, frozen and checked."""

from __future__ import annotations

import dataclasses

import pytest

from llm_vitals.exporter.verdict import Verdict, initial
from llm_vitals.exporter.verdict.model import move, move_with


def test_a_move_is_replace_with_the_state_its_clock_and_the_poll_time():
    before = dataclasses.replace(initial(10.0), state="busy", since=10.0, restarts=2, models=("m",))
    after = move(before, 25.0, "stuck", "no_progress", "nothing moved", reads_without_progress=3)
    assert after == dataclasses.replace(before, state="stuck", reason="no_progress", detail="nothing moved", since=25.0,
                                        last_poll=25.0, last_unhealthy_at=25.0, reads_without_progress=3)
    assert type(after) is Verdict
    assert before.state == "busy" and before.reads_without_progress == 0  # the verdict moved from is untouched


def test_a_move_in_the_same_state_keeps_its_since_and_every_field_it_does_not_name():
    before = dataclasses.replace(initial(10.0), state="busy", since=12.0, last_unhealthy_at=11.0, unit_clocks=(("a", 1.0, 2),))
    after = move(before, 40.0, "busy", "progress", "moving", last_poll=39.0)
    assert (after.since, after.last_poll, after.last_unhealthy_at) == (12.0, 39.0, 11.0)
    assert [getattr(after, f.name) for f in dataclasses.fields(Verdict) if f.name not in ("reason", "detail", "last_poll")] \
        == [getattr(before, f.name) for f in dataclasses.fields(Verdict) if f.name not in ("reason", "detail", "last_poll")]


def test_a_moved_verdict_is_frozen_and_a_field_it_lacks_is_refused():
    after = move(initial(0.0), 1.0, "idle", "idle", "quiet")
    with pytest.raises(dataclasses.FrozenInstanceError):
        after.state = "busy"  # type: ignore[misc]
    with pytest.raises(TypeError, match="no field 'stat'"):
        move(initial(0.0), 1.0, "idle", "idle", "quiet", stat="x")
    assert hash(after) == hash(dataclasses.replace(after))


def test_move_with_a_dict_is_move_with_its_keywords():
    before = dataclasses.replace(initial(10.0), state="stuck", since=10.0, last_unhealthy_at=10.0)
    changes = {"last_progress": 30.0, "stuck_seconds": 0.0, "since": 1.0}  # since is move's to set, not the caller's
    assert move_with(before, 30.0, "busy", "progress", "moving", dict(changes)) \
        == move(before, 30.0, "busy", "progress", "moving", **changes)
