"""llm_vitals.config: one wording for every config problem, shared by the exporter and the remediator."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import AfterValidator, Field, ValidationError, model_validator

import llm_vitals.exporter.settings
import llm_vitals.remediator.settings
from llm_vitals.config import (
    ConfigError,
    SecretRef,
    StrictModel,
    WithSecrets,
    describe_validation_error,
    read_yaml,
    secret_from_env,
    secret_from_file,
    validate_document,
)

SECRET = "s3cret-hunter2"


def _not_negative(value: int) -> int:
    if value < 0:
        raise ValueError("must not be negative")
    return value


class _Item(StrictModel):
    name: str
    token_env: str | None = None


class _Command(StrictModel):
    executor: Literal["command"]
    argv: list[str]


class _Http(StrictModel):
    executor: Literal["http"]
    url: str


class _Doc(StrictModel):
    items: list[_Item] = []
    executors: dict[str, Annotated[_Command | _Http, Field(discriminator="executor")]] = {}
    retries: Annotated[int, AfterValidator(_not_negative)] | None = None
    low: int = 0
    high: int = 0

    @model_validator(mode="after")
    def _ordered(self) -> _Doc:
        if self.low > self.high:
            raise ValueError("low must not exceed high")
        return self


def _problem(document: dict) -> str:
    with pytest.raises(ValidationError) as caught:
        _Doc.model_validate(document)
    return describe_validation_error(caught.value, "cfg.yaml", document)


# ---------------------------------------------------------------------------------------------
# read_yaml


def test_read_yaml_returns_the_document(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("targets:\n  - name: a\n")
    assert read_yaml(path) == {"targets": [{"name": "a"}]}


@pytest.mark.parametrize(
    "content, problem",
    [
        ("targets: [unclosed\n", "not valid YAML at line 2, column 1: expected ',' or ']', but got '<stream end>'"),
        # PyYAML's own text would quote this line, secret and all.
        (
            f"auth:\n\tpassword: {SECRET}\n",
            "not valid YAML at line 2, column 1: found character '\\t' that cannot start any token",
        ),
        (b"token: \xff" + SECRET.encode(), "cannot read: not UTF-8 text"),
    ],
    ids=["unclosed-list", "tab-before-a-secret", "not-utf8"],
)
def test_read_yaml_names_the_file_and_the_position_but_quotes_nothing(tmp_path: Path, content, problem) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as caught:
        read_yaml(path)
    assert str(caught.value) == f"{path}: {problem}"
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize("name, strerror", [("missing.yaml", "No such file or directory"), (".", "Is a directory")])
def test_read_yaml_of_an_unreadable_path_gives_the_strerror(tmp_path: Path, name: str, strerror: str) -> None:
    path = tmp_path / name
    with pytest.raises(ConfigError) as caught:
        read_yaml(path)
    assert str(caught.value) == f"{path}: cannot read: {strerror}"


# ---------------------------------------------------------------------------------------------
# describe_validation_error and validate_document


@pytest.mark.parametrize(
    "document, message",
    [
        ({"colour": "red"}, "cfg.yaml: colour: unknown key"),
        ({"items": [{"name": "a"}, {"name": "b", "shell": True}]}, "cfg.yaml: items[1].shell: unknown key"),
        ({"items": [{}]}, "cfg.yaml: items[0].name: missing"),
        # `Value error, ` is pydantic's prefix, and a top-level validator has no key path to name.
        ({"low": 2, "high": 1}, "cfg.yaml: low must not exceed high"),
        # The union's `function-after[...]` loc part names a validator, not a key.
        ({"retries": -1}, "cfg.yaml: retries: must not be negative"),
        (
            {"colour": "red", "items": [{"name": 1}]},
            "cfg.yaml: items[0].name: Input should be a valid string\ncfg.yaml: colour: unknown key",
        ),
        # A tagged union's tag (`command`) is pydantic's part of the loc, not a key in the file.
        ({"executors": {"a": {"executor": "command", "argv": "ls"}}}, "cfg.yaml: executors.a.argv: Input should be a valid list"),
        ({"executors": {"a": {"executor": "http"}}}, "cfg.yaml: executors.a.url: missing"),
        # ... unless the user wrote that key.
        ({"executors": {"http": {"executor": "http", "url": 1}}}, "cfg.yaml: executors.http.url: Input should be a valid string"),
    ],
    ids=["unknown-key", "nested-unknown-key", "missing-key", "model-level", "validator-in-union", "two-problems",
         "tag-left-out", "missing-key-under-a-tag", "a-key-named-like-a-tag"],
)
def test_validation_errors_name_the_file_and_key_path(document: dict, message: str) -> None:
    assert _problem(document) == message


@pytest.mark.parametrize(
    "document, message",
    [
        ({"iterms": []}, "cfg.yaml: iterms: unknown key (did you mean items?)"),
        ({"items": [{"name": "a", "tokn_env": "X"}]}, "cfg.yaml: items[0].tokn_env: unknown key (did you mean token_env?)"),
        # Under a tag, only the tagged member's keys are offered.
        ({"executors": {"a": {"executor": "http", "ur": "x"}}},
         "cfg.yaml: executors.a.url: missing\ncfg.yaml: executors.a.ur: unknown key (did you mean url?)"),
        ({"colour": "red"}, "cfg.yaml: colour: unknown key"),  # nothing close: no guess
        ({"executors": {"a": {"executor": "ssh"}}}, "cfg.yaml: executors.a: executor 'ssh' is not one of: command, http"),
        ({"executors": {"a": {"argv": ["ls"]}}}, "cfg.yaml: executors.a: executor: missing (it says which kind this is)"),
        ({"items": [{}]}, "cfg.yaml: items[0].name: missing"),
    ],
    ids=["did-you-mean", "nested-did-you-mean", "under-a-tag", "no-close-key", "wrong-tag-lists-choices",
         "tag-missing", "missing-scalar"],
)
def test_validate_document_words_each_kind_of_problem_once_with_the_choices(document: dict, message: str) -> None:
    """The wording the exporter's and the remediator's configs share: a guess for a misspelt key, the choices of a tag."""
    with pytest.raises(ConfigError) as caught:
        validate_document(_Doc, document, "cfg.yaml")
    assert str(caught.value) == message


class _Auth(StrictModel):
    bearer_token_env: str | None = None
    none: bool = False


class _WithAuth(StrictModel):
    auth: _Auth


def test_a_missing_section_lists_the_keys_it_takes() -> None:
    with pytest.raises(ConfigError) as caught:
        validate_document(_WithAuth, {}, "cfg.yaml")
    assert str(caught.value) == "cfg.yaml: auth: missing (it takes: bearer_token_env, none)"


def test_validation_message_leaves_out_an_input_that_may_be_a_secret() -> None:
    message = _problem({"items": [{"name": "a", "token_env": {"value": SECRET}}]})
    assert message == "cfg.yaml: items[0].token_env: Input should be a valid string"
    assert SECRET not in message


@pytest.mark.parametrize("document", [None, [], "text"], ids=["empty-file", "list", "scalar"])
def test_validate_document_wants_a_mapping_at_the_top(document: object) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_document(_Doc, document, "cfg.yaml")
    assert str(caught.value) == "cfg.yaml: expected a mapping at the top level"


def test_validate_document_returns_the_model_or_a_config_error() -> None:
    assert validate_document(_Doc, {"items": [{"name": "a"}]}, "cfg.yaml").items[0].name == "a"
    with pytest.raises(ConfigError, match=r"^cfg\.yaml: colour: unknown key$"):
        validate_document(_Doc, {"colour": "red"}, "cfg.yaml")


def test_strict_model_rejects_unknown_keys_and_only_the_exporter_freezes() -> None:
    with pytest.raises(ValidationError):
        StrictModel.model_validate({"typo": 1})
    budget = llm_vitals.remediator.settings.Budget()
    budget.max_restarts = 5  # the remediator's models stay mutable
    canary = llm_vitals.exporter.settings.CanarySettings()
    with pytest.raises(ValidationError):
        canary.enabled = False


# ---------------------------------------------------------------------------------------------
# Secrets


@pytest.mark.parametrize(
    "environ, outcome",
    [
        ({"TOKEN": f"  {SECRET}\n"}, SECRET),
        ({}, "auth.token_env: environment variable TOKEN is not set"),
        ({"TOKEN": ""}, "auth.token_env: environment variable TOKEN is empty"),
        ({"TOKEN": " \n\t"}, "auth.token_env: environment variable TOKEN is empty"),
    ],
    ids=["stripped", "unset", "empty", "blank"],
)
def test_secret_from_env(environ: dict[str, str], outcome: str) -> None:
    if outcome == SECRET:
        assert secret_from_env("auth.token_env", "TOKEN", environ).get_secret_value() == SECRET
        return
    with pytest.raises(ConfigError) as caught:
        secret_from_env("auth.token_env", "TOKEN", environ)
    assert str(caught.value) == outcome


@pytest.mark.parametrize(
    "content, problem",
    [
        (None, "cannot read {path}: No such file or directory"),
        ("\n  \n", "{path} is empty"),
        # Unreadable as text: the message must not quote the bytes, which are the secret's.
        (b"\xff" + SECRET.encode(), "cannot read {path}: not UTF-8 text"),
    ],
    ids=["missing", "blank", "not-utf8"],
)
def test_secret_from_file_refuses_without_quoting_the_contents(tmp_path: Path, content, problem: str) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as caught:
        secret_from_file("auth.token_file", path)
    assert str(caught.value) == "auth.token_file: " + problem.format(path=path)
    assert SECRET not in str(caught.value)


def test_secret_from_a_directory_gives_its_strerror(tmp_path: Path) -> None:
    (tmp_path / SECRET).write_text("x")  # what the directory holds stays out of the message
    with pytest.raises(ConfigError) as caught:
        secret_from_file("auth.token_file", tmp_path)
    assert str(caught.value) == f"auth.token_file: cannot read {tmp_path}: Is a directory"


def test_secret_from_file_is_stripped_and_never_printed(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"{SECRET}\n")
    secret = secret_from_file("auth.token_file", path)
    assert secret.get_secret_value() == SECRET
    assert SECRET not in repr(secret) + str(secret)


def test_secret_from_env_refuses_a_blank_variable_name() -> None:
    with pytest.raises(ConfigError, match=r"^auth\.token_env: names no environment variable$"):
        secret_from_env("auth.token_env", " ", {" ": SECRET})


def test_a_secret_ref_reads_env_or_file_and_names_the_key_it_read(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("from-file")
    assert SecretRef(key="auth.token").resolve({}) is None
    assert SecretRef(key="auth.token", file=path).resolve({}).get_secret_value() == "from-file"
    with pytest.raises(ConfigError, match=r"^auth\.token_env: environment variable T is not set$"):
        SecretRef(key="auth.token", env="T").resolve({})
    path.write_text(" ")
    with pytest.raises(ConfigError, match=r"^auth\.token_file: .* is empty$"):
        SecretRef(key="auth.token", file=path).resolve({})


class _Section(WithSecrets):
    secrets = {"token": False, "password": True}

    token_env: str | None = None
    token_file: Path | None = None
    password_env: str | None = None
    password_file: Path | None = None


@pytest.mark.parametrize(("document", "problem"), [
    ({"password_env": "P", "token_env": "T", "token_file": "/t"}, "set at most one of token_env and token_file"),
    ({}, "set exactly one of password_env or password_file"),
    ({"password_env": "P", "password_file": "/p"}, "set exactly one of password_env or password_file"),
])
def test_every_secret_pair_is_checked_by_the_one_validator(document: dict, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_document(_Section, document, "cfg.yaml")
    assert str(caught.value) == f"cfg.yaml: {problem}"


def test_a_section_reads_each_secret_once_and_names_its_key_path() -> None:
    section = _Section.model_validate({"password_env": "P"})
    section.read_secrets({"P": f"{SECRET}\n"}, "auth.")
    assert section.secret("password").get_secret_value() == SECRET and section.secret("token") is None
    assert SECRET not in repr(section) + str(section.model_dump())
    with pytest.raises(ConfigError, match=r"^auth\.password_env: environment variable P is not set$"):
        section.read_secrets({}, "auth.")


# ---------------------------------------------------------------------------------------------
# Both tools, one wording


def test_both_tools_raise_the_same_config_error_class() -> None:
    assert llm_vitals.exporter.settings.ConfigError is ConfigError
    assert llm_vitals.remediator.settings.ConfigError is ConfigError


def _exporter(extra: dict, environ: dict[str, str]) -> object:
    document = {"drain_token_env": "T", "targets": [{"name": "a", "url": "http://127.0.0.1:1"}], **extra}
    return llm_vitals.exporter.settings.parse_settings(document, "cfg.yaml", environ)


def _remediator(extra: dict, environ: dict[str, str]) -> object:
    document = {"auth": {"bearer_token_env": "T"}, "targets": {"a": {"executor": "http", "url": "http://x:1"}}, **extra}
    return llm_vitals.remediator.settings.build_settings(document, environ, "cfg.yaml")


# Each tool's settings loader, and the key path of the token it reads from environment variable T.
TOOLS = {"exporter": (_exporter, "drain_token_env"), "remediator": (_remediator, "auth.bearer_token_env")}


@pytest.mark.parametrize(
    "extra, environ, message",
    [
        ({"bogus": 1}, {}, "cfg.yaml: bogus: unknown key"),
        ({}, {}, "cfg.yaml: {token_key}: environment variable T is not set"),
        ({}, {"T": " "}, "cfg.yaml: {token_key}: environment variable T is empty"),
    ],
    ids=["unknown-key", "unset-env", "blank-env"],
)
@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_exporter_and_remediator_word_the_same_problem_the_same_way(tool, extra, environ, message) -> None:
    load, token_key = TOOLS[tool]
    with pytest.raises(ConfigError) as caught:
        load(extra, environ)
    assert str(caught.value) == message.format(token_key=token_key)


@pytest.mark.parametrize("tool", ["exporter", "remediator"])
def test_both_clis_exit_with_the_same_codes(tool: str, tmp_path: Path, capsys) -> None:
    from llm_vitals import exits

    main = __import__(f"llm_vitals.{tool}.cli", fromlist=["main"]).main
    assert main(["--config", str(tmp_path / "absent.yaml"), "--check-config"]) == exits.CANNOT_RUN == 1
    assert capsys.readouterr().err.startswith(f"llm-vitals-{tool}: invalid config: ")
    with pytest.raises(SystemExit) as usage:
        main(["--no-such-option"])
    assert usage.value.code == exits.USAGE == 2
