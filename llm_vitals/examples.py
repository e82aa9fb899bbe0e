"""The example configs shipped inside the package, for `--example-config` on both CLIs.

They are package data (pyproject.toml), so an installed wheel offers the same starting point
as a checkout: `llm-vitals-exporter --example-config > exporter.yaml`.
"""

from __future__ import annotations

from importlib import resources
from typing import Literal


def example_config(tool: Literal["exporter", "remediator"]) -> str:
    """The text of `llm_vitals/<tool>/example.yaml`, as installed."""
    return resources.files("llm_vitals").joinpath(tool, "example.yaml").read_text(encoding="utf-8")
