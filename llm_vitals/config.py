"""Config-file plumbing shared by the exporter and the remediator, so both word a problem the same way.

Every message names the file and the key path (`targets[0].url`, `auth.bearer_token_env`). None
quotes an input value or a secret's contents: config errors end up in logs, CI output and bug reports.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError


class ConfigError(Exception):
    """A config that cannot be used; the message names the file and the key, never a secret's value."""


class StrictModel(BaseModel):
    """Base of every config model: an unknown key is an error, so a typo is never silently ignored."""

    model_config = ConfigDict(extra="forbid")


Model = TypeVar("Model", bound=BaseModel)


def _read_text(path: Path) -> str:
    # Raises OSError or UnicodeDecodeError; the callers word both without quoting the contents.
    return path.read_text(encoding="utf-8")


def _unreadable(exc: OSError | UnicodeDecodeError) -> str:
    # UnicodeDecodeError's own text quotes the offending byte, which may be part of a secret.
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    return exc.strerror or type(exc).__name__


def read_yaml(path: str | Path) -> object:
    """The YAML document in the file at `path`; a ConfigError names the file (and the line and column of bad YAML)."""
    try:
        text = _read_text(Path(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {_unreadable(exc)}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # The problem and its position only: str(exc) also quotes the offending line of the file.
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None


def _key_path(loc: tuple[int | str, ...], document: object, missing: bool = False) -> str:
    """The loc as the user's keys: `targets.gpu-a.argv`, `items[1].shell`.

    Pydantic's loc also holds parts the user never wrote: a tagged union's tag (`targets.gpu-a.command.argv`),
    a union member (`int`) or a validator (`function-after[...]`). A part is kept only where it is a
    key (or index) of the document at that point, and, for a `missing` error, the last part: the key
    to add.
    """
    parts: list[str | int] = []
    node: Any = document
    found = False
    for part in loc:
        found = (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node))
        if found:
            parts.append(part)
            node = node[part]
    if missing and loc and not found:
        parts.append(loc[-1])
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in parts).lstrip(".")


def _members(annotation: Any) -> list[Any]:
    """The types an annotation admits: Annotated, Optional and unions unwrapped, None left out."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [member for arg in typing.get_args(annotation) for member in _members(arg)]
    return [] if annotation is type(None) else [annotation]


def _tag_values(model: type[BaseModel]) -> set[str]:
    """The Literal values of a model's fields: a tagged union's tag, as pydantic's loc names it."""
    return {value for field in model.model_fields.values() for member in _members(field.annotation)
            if typing.get_origin(member) is typing.Literal for value in typing.get_args(member)
            if isinstance(value, str)}


def _models_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[type[BaseModel]]:
    """The config models that can stand at `loc` (the parent of a key a ValidationError names).

    Follows fields, list items and mapping values; a part that is no key (a tagged union's tag, a
    validator's name) narrows a union to the members it tags, or is passed over.
    """
    current: list[Any] = [model]
    for part in loc:
        following: list[Any] = []
        for annotation in current:
            for member in _members(annotation):
                origin = typing.get_origin(member)
                if isinstance(member, type) and issubclass(member, BaseModel):
                    if isinstance(part, str) and part in member.model_fields:
                        following.append(member.model_fields[part].annotation)
                    elif isinstance(part, str) and part in _tag_values(member):
                        following.append(member)
                elif origin in (list, tuple, set, frozenset) and isinstance(part, int):
                    following.extend(typing.get_args(member)[:1])
                elif origin in (dict, Mapping) and len(typing.get_args(member)) == 2:
                    following.append(typing.get_args(member)[1])
        current = following or current
    return [m for annotation in current for m in _members(annotation)
            if isinstance(m, type) and issubclass(m, BaseModel)]


def _keys_of(models: list[type[BaseModel]]) -> list[str]:
    return sorted({field.alias or name for model in models for name, field in model.model_fields.items()})


def _problem(error: Any, model: type[BaseModel] | None) -> str:
    """One kind of problem, one wording, whichever tool's config it is: the choices where there are choices."""
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "extra_forbidden":
        if model is None:
            return "unknown key"
        key = error["loc"][-1]
        close = difflib.get_close_matches(str(key), _keys_of(_models_at(model, error["loc"][:-1])), n=1, cutoff=0.6)
        return f"unknown key (did you mean {close[0]}?)" if close else "unknown key"
    if kind == "union_tag_invalid":
        choices = ", ".join(tag.strip("'") for tag in str(ctx.get("expected_tags", "")).split(", "))
        return f"{str(ctx.get('discriminator', 'tag')).strip(chr(39))} {ctx.get('tag')!r} is not one of: {choices}"
    if kind == "union_tag_not_found":
        return f"{str(ctx.get('discriminator', 'tag')).strip(chr(39))}: missing (it says which kind this is)"
    if kind == "missing":
        below = _keys_of(_models_at(model, error["loc"])) if model is not None else []
        return f"missing (it takes: {', '.join(below)})" if below else "missing"
    return str(error["msg"]).removeprefix("Value error, ")


def describe_validation_error(exc: ValidationError, source: str, document: object,
                              model: type[BaseModel] | None = None) -> str:
    """One `source: key.path: problem` line per problem, with input values left out: they may be secrets.

    `document` is what was validated: key paths hold only the keys written in it (see _key_path).
    With the `model` it was validated as, a misspelt key gets a "did you mean" and a missing section
    the keys it takes.
    """
    lines = []
    for error in exc.errors(include_input=False, include_url=False):
        problem = _problem(error, model)
        key_path = _key_path(error["loc"], document, missing=error["type"] == "missing")
        lines.append(f"{source}: {key_path}: {problem}" if key_path else f"{source}: {problem}")
    return "\n".join(lines)


def validate_document(model: type[Model], document: object, source: str) -> Model:
    """`document` (a parsed YAML file) validated as `model`; ConfigError worded as describe_validation_error."""
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, source, document, model)) from None


# Blank secrets are refused, never read as "no secret": an empty bearer token would let a bare
# `Bearer ` through. Values are stripped, so a trailing newline in a secret file is not part of it.


def secret_from_env(key_path: str, name: str, environ: Mapping[str, str]) -> SecretStr:
    """The stripped value of environment variable `name`; ConfigError naming `key_path` when unset or blank."""
    if not name.strip():
        # `api_key_env: ""` must not read as "no secret": for the drain token that would mean no auth.
        raise ConfigError(f"{key_path}: names no environment variable")
    value = environ.get(name)
    if value is None:
        raise ConfigError(f"{key_path}: environment variable {name} is not set")
    if not value.strip():
        raise ConfigError(f"{key_path}: environment variable {name} is empty")
    return SecretStr(value.strip())


def secret_from_file(key_path: str, path: Path) -> SecretStr:
    """The stripped contents of the file at `path`; ConfigError naming `key_path` when unreadable or blank."""
    try:
        value = _read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{key_path}: cannot read {path}: {_unreadable(exc)}") from None
    if not value.strip():
        raise ConfigError(f"{key_path}: {path} is empty")
    return SecretStr(value.strip())


def secret_from_env_or_file(
    key: str, env_name: str | None, file: Path | None, environ: Mapping[str, str]
) -> SecretStr | None:
    """The secret that the config keys `<key>_env` or `<key>_file` point at (env first); None when neither is set."""
    if env_name is not None:
        return secret_from_env(f"{key}_env", env_name, environ)
    if file is not None:
        return secret_from_file(f"{key}_file", file)
    return None
