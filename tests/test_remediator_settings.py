"""The remediator's config: invalid files with their exact messages, the example, the CLI check."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from llm_vitals import exits
from llm_vitals.remediator.cli import main
from llm_vitals.remediator.settings import ConfigError, build_settings, load_settings

DATA = REPO / "tests" / "data"
INVALID = sorted(DATA.glob("remediator-*.yaml"))
EXAMPLE = REPO / "llm_vitals" / "remediator" / "example.yaml"


def expected_message(path: Path) -> str:
    """The file's first line `# expect: <message>`, with the file name that every message starts with."""
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} must start with '# expect: <message>'"
    return f"{path}: {first.removeprefix('# expect: ')}"


def test_there_are_invalid_config_cases():
    assert len(INVALID) >= 10


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_config_is_rejected_with_its_exact_message(path):
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    assert str(caught.value) == expected_message(path)


def test_example_config_is_valid_and_complete():
    settings = load_settings(EXAMPLE, environ={"LLM_VITALS_WEBHOOK_TOKEN": "t0ken"})
    assert set(settings.targets) == {"gpu-a", "gpu-b", "gpu-c", "gpu-d"}
    assert {t.executor for t in settings.targets.values()} == {"command", "http", "docker", "kubernetes"}
    assert settings.global_cooldown == 900 and settings.budget.window == 3600
    assert settings.max_unhealthy_count() == 1  # 40% of 4, rounded down, never below one
    assert settings.host_port == ("127.0.0.1", 9472)


@pytest.mark.parametrize(
    "value, targets, count",
    [("40%", 5, 2), ("40%", 4, 1), ("40%", 1, 1), ("50%", 10, 5), ("100%", 3, 3), (2, 10, 2), ("3", 10, 3), (0, 3, 0)],
)
def test_max_unhealthy_count(value, targets, count):
    settings = build_settings(
        {
            "auth": {"none": True},
            "max_unhealthy": value,
            "targets": {f"t{i}": {"executor": "http", "url": "http://x:1/"} for i in range(targets)},
        }
    )
    assert settings.max_unhealthy_count() == count


def test_secrets_are_not_in_repr_dump_or_errors(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("very-secret-value\n")
    settings = build_settings(
        {"auth": {"bearer_token_file": str(token_file)}, "targets": {"a": {"executor": "http", "url": "http://x:1/"}}}
    )
    assert settings.auth.bearer_token.get_secret_value() == "very-secret-value"
    assert "very-secret-value" not in repr(settings) + settings.model_dump_json() + str(settings.auth.bearer_token)
    # A type error next to a secret-bearing field names the field, never its input.
    with pytest.raises(ConfigError) as caught:
        build_settings({"auth": {"bearer_token_env": {"value": "very-secret-value"}}, "targets": {}})
    assert "very-secret-value" not in str(caught.value)
    assert str(caught.value).startswith("config: auth.bearer_token_env: Input should be a valid string")


def test_check_config_cli(capsys, monkeypatch):
    monkeypatch.setenv("LLM_VITALS_WEBHOOK_TOKEN", "t0ken")
    assert main(["--config", str(EXAMPLE), "--check-config"]) == 0
    assert "ok (4 targets" in capsys.readouterr().out
    monkeypatch.delenv("LLM_VITALS_WEBHOOK_TOKEN")
    assert main(["--config", str(EXAMPLE), "--check-config"]) == exits.CANNOT_RUN == 1  # as the exporter's
    assert capsys.readouterr().err == (
        f"llm-vitals-remediator: invalid config: {EXAMPLE}: auth.bearer_token_env: "
        "environment variable LLM_VITALS_WEBHOOK_TOKEN is not set\n"
    )
    assert main(["--config", "/nonexistent.yaml", "--check-config"]) == exits.CANNOT_RUN
    assert "invalid config: /nonexistent.yaml: cannot read: No such file or directory" in capsys.readouterr().err
