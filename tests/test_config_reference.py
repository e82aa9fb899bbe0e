"""docs/configuration.md against the config models: every key, no extra key, every default.

The page is written by hand (the meanings need prose), so this test is what keeps it true: a key
added to a model without a row, a row for a key that is gone, or a default changed on one side
only fails here, naming the section and the key.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from conftest import REPO
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

import llm_vitals.exporter.settings as exporter_settings
import llm_vitals.remediator.settings as remediator_settings
from llm_vitals.durations import format_duration, parse_duration, parse_positive_duration

PAGE = REPO / "docs" / "configuration.md"

SECTIONS: dict[str, type[BaseModel]] = {
    "Exporter: top level": exporter_settings.ExporterSettings,
    "Exporter: targets[]": exporter_settings.TargetSettings,
    "Exporter: targets[].canary": exporter_settings.CanarySettings,
    "Exporter: targets[].dcgm": exporter_settings.DcgmSettings,
    "Exporter: gpu_faults": exporter_settings.GpuFaultSettings,
    "Exporter: gpu_faults.nvml": exporter_settings.NvmlSettings,
    "Exporter: pace": exporter_settings.PaceSettings,
    "Exporter: discovery[]": exporter_settings.DiscoverySource,
    "Exporter: discovery[].kubernetes": exporter_settings.KubernetesDiscovery,
    "Exporter: discovery[].file": exporter_settings.FileDiscovery,
    "Exporter: shard": exporter_settings.ShardSettings,
    "Exporter: backstop": exporter_settings.BackstopSettings,
    "Remediator: top level": remediator_settings.Settings,
    "Remediator: auth": remediator_settings.AuthSettings,
    "Remediator: auth.basic_auth": remediator_settings.BasicAuth,
    "Remediator: budget": remediator_settings.Budget,
    "Remediator: budget.backoff": remediator_settings.Backoff,
    "Remediator: targets.NAME, executor command": remediator_settings.CommandTarget,
    "Remediator: targets.NAME, executor http": remediator_settings.HttpTarget,
    "Remediator: targets.NAME, executor docker": remediator_settings.DockerTarget,
    "Remediator: targets.NAME, executor kubernetes": remediator_settings.KubernetesTarget,
    "Remediator: pre_restart": remediator_settings.PreRestart,
    "Remediator: target_templates[]": remediator_settings.TargetTemplate,
    "Remediator: target_templates[].match": remediator_settings.TemplateMatchConfig,
    "Remediator: kubernetes": remediator_settings.KubernetesSettings,
    "Remediator: kubernetes.lease": remediator_settings.LeaseRef,
}


def documented() -> dict[str, dict[str, str]]:
    """Section title -> {key: default cell}, from the page's `### ` sections and their tables."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in PAGE.read_text().splitlines():
        if line.startswith("### "):
            current = sections.setdefault(line[4:].strip(), {})
        elif current is not None and (row := re.match(r"^\| `([a-z_]+)` \| ([^|]+) \|", line)):
            current[row.group(1)] = row.group(2).strip().strip("`")
    return sections


def nested_models(root: type[BaseModel]) -> set[type[BaseModel]]:
    """Every config model reachable from `root` through its fields (lists, dicts, unions, Annotated)."""
    found: set[type[BaseModel]] = set()

    def visit(annotation: object) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation not in found:
                found.add(annotation)
                for field in annotation.model_fields.values():
                    visit(field.annotation)
            return
        for arg in typing.get_args(annotation):
            visit(arg)

    visit(root)
    return found


def _is_duration(field) -> bool:
    return any(getattr(m, "func", None) in (parse_duration, parse_positive_duration) for m in field.metadata) or (
        "parse_duration" in repr(field.annotation) or "parse_positive_duration" in repr(field.annotation))


def expected_default(field) -> str:
    """The default as the page writes it: `required`, `none`, `below` (a nested section), or the value."""
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "none"
    if isinstance(value, BaseModel):
        return "below"
    if isinstance(value, bool):
        return str(value).lower()
    if _is_duration(field):
        return format_duration(value)
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "[]"
    return str(value)


def test_every_config_model_has_a_section() -> None:
    reachable = nested_models(exporter_settings.ExporterSettings) | nested_models(remediator_settings.Settings)
    assert reachable == set(SECTIONS.values()), "a config model without a section here, or a section without a model"
    assert set(documented()) == set(SECTIONS), "the page's ### sections differ from the test's list"


@pytest.mark.parametrize("section", list(SECTIONS))
def test_each_section_lists_exactly_its_keys_with_their_defaults(section: str, monkeypatch) -> None:
    # The Kubernetes API URL's default is read from the pod's environment; the page gives it outside a pod.
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    model, rows = SECTIONS[section], documented()[section]
    assert list(rows) == list(model.model_fields), f"{section}: keys (in model order) differ"
    for key, field in model.model_fields.items():
        assert rows[key] == expected_default(field), f"{section}: `{key}` default"


def test_the_readme_and_both_examples_point_to_the_reference() -> None:
    assert "docs/configuration.md" in (REPO / "README.md").read_text()
    for example in (REPO / "llm_vitals" / "exporter" / "example.yaml", REPO / "llm_vitals" / "remediator" / "example.yaml"):
        assert "docs/configuration.md" in Path(example).read_text(), example
