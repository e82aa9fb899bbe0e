"""The wheel as a user gets it: built by `python -m build` (from its sdist), installed (not editable) into a fresh venv,
and run from outside the checkout, so nothing is found through the source tree.

It ships one top-level package, `llm_vitals`; each console script answers `--help`; and the example
configs it offers (`--example-config`) are package data that `--check-config` accepts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from conftest import REPO

SCRIPTS = ("llm-vitals-exporter", "llm-vitals-remediator", "llm-vitals-sim", "llm-vitals-backtest")


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{argv}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the fresh venv's bin/) built and installed once for this module."""
    work = tmp_path_factory.mktemp("wheel")
    # From a copy of the files git tracks, as a clean clone has them: a developer's checkout holds a
    # build/ or a stale llm_vitals.egg-info that setuptools would read. The sdist, then the wheel
    # built from it, so the sdist is shown to hold all the wheel needs.
    source = work / "source"
    tracked = _run(["git", "ls-files", "-z"], cwd=REPO).stdout.split("\0")
    for name in filter(None, tracked):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    _run([sys.executable, "-m", "build", "--outdir", str(work / "dist"), str(source)], cwd=work)
    (wheel,) = (work / "dist").glob("llm_vitals-*.whl")
    _run([sys.executable, "-m", "venv", str(work / "venv")], cwd=work)
    bin_dir = work / "venv" / "bin"
    _run([str(bin_dir / "pip"), "install", "-q", "--disable-pip-version-check", str(wheel)], cwd=work)
    return wheel, bin_dir


@pytest.mark.xdist_group("wheel")
def test_the_wheel_holds_one_top_level_package(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/", 1)[0] for name in archive.namelist()}
    assert tops == {"llm_vitals", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}


@pytest.mark.xdist_group("wheel")
@pytest.mark.parametrize("script", SCRIPTS)
def test_each_console_script_answers_help_outside_the_checkout(installed: tuple[Path, Path], script: str,
                                                              tmp_path: Path) -> None:
    _, bin_dir = installed
    out = _run([str(bin_dir / script), "--help"], cwd=tmp_path).stdout
    assert out.startswith(f"usage: {script}")


@pytest.mark.xdist_group("wheel")
def test_the_backtest_replays_the_alert_rules_shipped_in_the_wheel(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, bin_dir = installed
    code = "from llm_vitals.backtest.rules import load_rules; print(sorted(r.name for r in load_rules()))"
    out = _run([str(bin_dir / "python"), "-c", code], cwd=tmp_path).stdout
    assert "LLMServerStuck" in out


@pytest.mark.xdist_group("wheel")
def test_the_installed_package_is_not_the_checkout(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, bin_dir = installed
    out = _run([str(bin_dir / "python"), "-c", "import llm_vitals; print(llm_vitals.__file__)"], cwd=tmp_path).stdout
    assert "site-packages" in out and str(REPO) not in out
    for other in ("exporter", "remediator", "simulator", "demo"):
        probe = subprocess.run([str(bin_dir / "python"), "-c", f"import {other}"], cwd=tmp_path, capture_output=True)
        assert probe.returncode != 0, f"{other} is importable from the installed wheel"


@pytest.mark.xdist_group("wheel")
@pytest.mark.parametrize("tool", ["exporter", "remediator"])
def test_the_shipped_example_config_passes_check_config(installed: tuple[Path, Path], tool: str, tmp_path: Path) -> None:
    _, bin_dir = installed
    script = str(bin_dir / f"llm-vitals-{tool}")
    example = tmp_path / f"{tool}.yaml"
    example.write_text(_run([script, "--example-config"], cwd=tmp_path).stdout)
    assert example.read_text() == (REPO / "llm_vitals" / tool / "example.yaml").read_text()
    # The remediator's example reads its webhook token from this variable, as a deployment would.
    env = {**os.environ, "LLM_VITALS_WEBHOOK_TOKEN": "example-token"}
    out = _run([script, "--config", str(example), "--check-config"], cwd=tmp_path, env=env).stdout
    assert "ok" in out.lower()


@pytest.mark.xdist_group("wheel")
@pytest.mark.parametrize("script", SCRIPTS)
def test_each_console_script_tells_its_version(installed: tuple[Path, Path], script: str, tmp_path: Path) -> None:
    _, bin_dir = installed
    out = _run([str(bin_dir / script), "--version"], cwd=tmp_path).stdout
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert out.strip() == f"{script} {version}"


@pytest.mark.xdist_group("wheel")
@pytest.mark.parametrize("script", SCRIPTS)
def test_help_names_no_checkout_path(installed: tuple[Path, Path], script: str, tmp_path: Path) -> None:
    """A pip user has no `llm_vitals/.../example.yaml` to open: the help points at `--example-config`."""
    _, bin_dir = installed
    out = _run([str(bin_dir / script), "--help"], cwd=tmp_path).stdout
    assert "example.yaml" not in out and "llm_vitals/" not in out
    if script != "llm-vitals-sim":
        assert "--example-config" in out


@pytest.mark.xdist_group("wheel")
def test_the_metadata_names_the_project_urls(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, bin_dir = installed
    out = _run([str(bin_dir / "python"), "-c",
                "from importlib.metadata import metadata; print('\\n'.join(metadata('llm-vitals').get_all('Project-URL')))"],
               cwd=tmp_path).stdout
    urls = dict(line.split(", ", 1) for line in out.splitlines())
    assert {"Homepage", "Documentation", "Issues", "Source"} <= set(urls)
    assert all(url.startswith("https://github.com/llm-vitals/llm-vitals") for url in urls.values())
