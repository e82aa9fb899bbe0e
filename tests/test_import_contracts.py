"""The import contracts in pyproject.toml cover every module: a new module of a layered package
must be placed in a layer, or the contracts would say nothing about it."""

from __future__ import annotations

import tomllib

import pytest
from conftest import REPO

CONTRACTS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _layered(container: str) -> set[str]:
    (contract,) = [c for c in CONTRACTS if c.get("containers") == [container]]
    return {name.strip() for layer in contract["layers"] for name in layer.replace("|", ":").split(":")}


@pytest.mark.parametrize("package", ["exporter", "remediator", "sim", "kube"])
def test_every_module_of_a_layered_package_has_a_layer(package: str) -> None:
    folder = REPO / "llm_vitals" / package
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    modules |= {p.parent.name for p in folder.glob("*/__init__.py")}
    assert modules - _layered(f"llm_vitals.{package}") == set()


def test_every_top_level_module_has_a_layer() -> None:
    (contract,) = [c for c in CONTRACTS if c["type"] == "layers" and "containers" not in c]
    layered = {name.strip().removeprefix("llm_vitals.") for layer in contract["layers"]
               for name in layer.replace("|", ":").split(":")}
    folder = REPO / "llm_vitals"
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"} | {p.parent.name for p in folder.glob("*/__init__.py")}
    assert modules - layered == set()
