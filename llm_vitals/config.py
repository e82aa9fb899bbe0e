"""Config-file plumbing shared by the exporter and the remediator, so both word a problem the same way.

Every message names the file and the key path (`targets[0].url`, `auth.bearer_token_env`). None
quotes an input value or a secret's contents: config errors end up in logs, CI output and bug reports.
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Self, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, ValidationError, model_validator

from llm_vitals.durations import Duration


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


def keys_set(section: BaseModel, *names: str) -> list[str]:
    """Which of the keys `names` a section sets (not None), in that order: for "exactly one of" rules."""
    return [name for name in names if getattr(section, name) is not None]


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


class SecretRef(StrictModel):
    """Where one secret is read: the environment variable or the file that the keys `<key>_env` / `<key>_file` name.

    `key` is the key path without the suffix (`auth.bearer_token`, `targets[0].api_key`): every
    message names the key the user wrote. Never holds the secret itself.
    """

    model_config = ConfigDict(frozen=True)

    key: str
    env: str | None = None
    file: Path | None = None
    required: bool = False

    def problem(self) -> str | None:
        """Why the pair cannot be used as written (both keys set; neither, when one is required), else None."""
        name, given = self.key.rpartition(".")[2], (self.env is not None) + (self.file is not None)
        if self.required and given != 1:
            return f"set exactly one of {name}_env or {name}_file"
        if given == 2:
            return f"set at most one of {name}_env and {name}_file"
        return None

    def resolve(self, environ: Mapping[str, str]) -> SecretStr | None:
        """The secret the pair points at (read now); None when neither key is set; ConfigError naming the key."""
        if self.env is not None:
            return secret_from_env(f"{self.key}_env", self.env, environ)
        if self.file is not None:
            return secret_from_file(f"{self.key}_file", self.file)
        return None


class WithSecrets(StrictModel):
    """A config section whose secrets are each named by a pair of keys, `<name>_env` or `<name>_file`.

    A subclass declares the two fields of each pair (they are keys users write, so they stay plain
    fields) and lists the names in `secrets` (True: one of the pair is required). One validator
    checks every pair, one method reads them all at load time (so --check-config finds a missing
    variable or file), and `secret(name)` gives what was read.
    """

    secrets: ClassVar[dict[str, bool]] = {}
    _resolved: dict[str, SecretStr | None] = PrivateAttr(default_factory=dict)

    def secret_ref(self, name: str, prefix: str = "") -> SecretRef:
        """The pair `<name>_env` / `<name>_file` of this section; `prefix` is the section's key path (`auth.`)."""
        return SecretRef(key=f"{prefix}{name}", env=getattr(self, f"{name}_env"), file=getattr(self, f"{name}_file"),
                         required=self.secrets[name])

    @model_validator(mode="after")
    def _one_source_per_secret(self) -> Self:
        for name in self.secrets:
            if problem := self.secret_ref(name).problem():
                raise ValueError(problem)
        return self

    def read_secrets(self, environ: Mapping[str, str], prefix: str = "") -> None:
        """Read every secret of this section now; ConfigError names the key (with `prefix`, the section's path)."""
        self._resolved = {name: self.secret_ref(name, prefix).resolve(environ) for name in self.secrets}

    def secret(self, name: str) -> SecretStr | None:
        """The secret `name` as read by read_secrets; None when the config names none."""
        return self._resolved.get(name)


# ---------------------------------------------------------------------------------------------
# Kubernetes access: one definition for every client the tools build (llm_vitals/kube/connect.py opens it).

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def in_cluster_url(environ: Mapping[str, str] = os.environ) -> str:
    """The API server as a pod sees it: $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, else kubernetes.default.svc."""
    host = environ.get("KUBERNETES_SERVICE_HOST")
    if not host:
        return "https://kubernetes.default.svc"
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{environ.get('KUBERNETES_SERVICE_PORT', '443')}"


def _https_api_url(url: str) -> str:
    if not url.startswith("https://"):
        raise ValueError("the Kubernetes API is reached over https:// only")
    return url.rstrip("/")


class KubeAccess(StrictModel):
    """How to reach the API server: a kubeconfig (its current context), else the pod's service account.

    A config section that reaches the API server is a KubeAccess (with its own `timeout` default);
    one that names only a kubeconfig builds one with `KubeAccess(kubeconfig=...)`.
    """

    kubeconfig: Path | None = None
    # Without a kubeconfig: the API server (https only, no trailing `/`), the token (re-read for
    # each request: projected tokens rotate) and the CA of the pod's service account.
    api_url: Annotated[str, AfterValidator(_https_api_url)] = Field(default_factory=in_cluster_url)
    token_path: Path = SERVICE_ACCOUNT / "token"
    ca_path: Path = SERVICE_ACCOUNT / "ca.crt"
    timeout: Duration = 30.0  # each request's limit (a watch: for its first answer)

    def describe(self) -> str:
        """What these credentials are, for an error sentence."""
        return f"the kubeconfig {self.kubeconfig}" if self.kubeconfig is not None else "the in-cluster service account"
