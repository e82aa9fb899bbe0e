"""The one TARGET contract: the exporter writes what the remediator and the status page read, and docs/ holds its schema."""

from __future__ import annotations

import json

import pytest
from conftest import REPO
from pydantic import ValidationError

from llm_vitals.exporter.settings import parse_settings
from llm_vitals.exporter.state import StateStore, target_view
from llm_vitals.remediator import gate
from llm_vitals.targets import REASONS, STATES, UNHEALTHY_STATES, TargetsAnswer, TargetView, json_schema

SCHEMA = REPO / "docs" / "target-view.schema.json"


def test_docs_schema_is_generated_from_the_model() -> None:
    assert SCHEMA.read_text() == json_schema(), (
        "docs/target-view.schema.json is stale: python -m llm_vitals.targets > docs/target-view.schema.json")


def test_what_the_exporter_writes_is_what_the_readers_validate() -> None:
    settings = parse_settings({"targets": [{"name": "gpu-a", "url": "http://user:secret@127.0.0.1:9"},
                                           {"name": "proxy", "url": "http://127.0.0.1:8", "role": "proxy"}]})
    store = StateStore(settings, now=100.0)
    views = [target_view(record, 105.0) for record in store]
    wire = TargetsAnswer(targets=views, generated_at=105.0).model_dump_json()
    assert "secret" not in wire
    back = TargetsAnswer.model_validate_json(wire)
    assert back.targets == views
    assert back.targets[0].state == "starting" and back.targets[0].canary.results == {"ok": 0, "error": 0, "timeout": 0, "rejected": 0}


def test_an_older_reader_ignores_fields_it_does_not_know() -> None:
    view = target_view(next(iter(StateStore(parse_settings({"targets": [{"name": "a", "url": "http://h:1"}]}), 1.0))), 2.0)
    body = {**json.loads(view.model_dump_json()), "added_later": {"x": 1}, "another": [1]}
    assert TargetView.model_validate(body) == view


@pytest.mark.parametrize("field,value", [("state", "sleepy"), ("reason", "no such reason"), ("name", None)])
def test_an_answer_outside_the_contract_is_refused(field: str, value: object) -> None:
    view = target_view(next(iter(StateStore(parse_settings({"targets": [{"name": "a", "url": "http://h:1"}]}), 1.0))), 2.0)
    body = {**json.loads(view.model_dump_json()), field: value}
    with pytest.raises(ValidationError):
        TargetView.model_validate(body)


def test_one_list_of_states_and_reasons() -> None:
    assert len(set(STATES)) == len(STATES) and len(set(REASONS)) == len(REASONS)
    assert set(STATES) >= UNHEALTHY_STATES
    assert gate.UNHEALTHY_STATES is UNHEALTHY_STATES  # the remediator counts what the exporter means


def test_every_view_of_the_states_knows_every_state() -> None:
    from conftest import load_script

    from llm_vitals.demo.table import STATE_COLOURS as DEMO_COLOURS
    from llm_vitals.exporter.status_page import STATE_COLOURS as PAGE_COLOURS

    dashboard = load_script(REPO / "dashboards" / "generate.py")
    assert [name for name, _ in dashboard.STATES] == list(STATES)
    assert set(PAGE_COLOURS) == set(STATES) == set(DEMO_COLOURS)
