"""The remediator's validated config: one YAML file, unknown keys are errors, secrets are SecretStr.

What runs for a target is decided here and only here: the webhook payload names a target, and the
executor config below is looked up by that name. Nothing from a payload is ever executed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, SecretStr, field_validator, model_validator

# ConfigError is re-exported: the CLI and callers catch it as remediator.settings.ConfigError.
from llm_vitals.config import ConfigError, KubeAccess, StrictModel, WithSecrets, keys_set, read_yaml, validate_document
from llm_vitals.durations import Duration
from llm_vitals.remediator.fleet_limit import parse_max_unhealthy, percent_of, unhealthy_limit
from llm_vitals.validators import HttpUrl, ListenAddress, parse_listen, target_name

# ---------------------------------------------------------------------------------------------
# Auth


class BasicAuth(WithSecrets):
    secrets = {"password": True}

    username: str = Field(min_length=1)
    password_env: str | None = None
    password_file: Path | None = None


class AuthSettings(WithSecrets):
    """How callers authenticate. Exactly one method for the act token (the webhook, pause, reset,
    release, re-initialise; it reads too), or `none: true`. An optional read token (bearer) reads
    only: the status, the journal, the pause, circuits and nodes. Give the exporter's status page
    the read token, never the act token. A config without one keeps working: the act token reads."""

    secrets = {"bearer_token": False, "read_token": False}

    bearer_token_env: str | None = None
    bearer_token_file: Path | None = None
    basic_auth: BasicAuth | None = None
    none: bool = False
    read_token_env: str | None = None
    read_token_file: Path | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> AuthSettings:
        chosen = keys_set(self, "bearer_token_env", "bearer_token_file", "basic_auth")
        if self.none and chosen:
            raise ValueError(f"`none: true` contradicts {chosen[0]}")
        if self.none and (self.read_token_env or self.read_token_file):
            raise ValueError("`none: true` contradicts a read token: without auth every route is open")
        if not self.none and len(chosen) != 1:
            if not chosen:
                raise ValueError(
                    "set one of bearer_token_env, bearer_token_file or basic_auth "
                    "(or `none: true` to run without auth, explicitly)"
                )
            raise ValueError(f"set only one auth method, not {' and '.join(chosen)}")
        return self

    def resolve(self, environ: Mapping[str, str]) -> None:
        """Read the secrets from the environment or files now (--check-config finds a missing one); ConfigError names the key."""
        self.read_secrets(environ, "auth.")
        if self.basic_auth is not None:
            self.basic_auth.read_secrets(environ, "auth.basic_auth.")
        read, bearer = self.read_token, self.bearer_token
        if read is not None and bearer is not None and read.get_secret_value() == bearer.get_secret_value():
            raise ConfigError("auth.read_token: the read token must differ from the act token (bearer_token),"
                              " else whoever reads may also restart")

    @property
    def bearer_token(self) -> SecretStr | None:
        return self.secret("bearer_token")

    @property
    def basic_password(self) -> SecretStr | None:
        return self.basic_auth.secret("password") if self.basic_auth is not None else None

    @property
    def read_token(self) -> SecretStr | None:
        return self.secret("read_token")


# ---------------------------------------------------------------------------------------------
# Evidence: an optional command run before a restart, its output kept in the journal.


class PreRestart(StrictModel):
    """A fixed argv (no shell) run before the restart; `{name}`, `{namespace}`, `{pod}`, `{node}` are
    replaced by what the exporter reports for the target, never by anything from the alert."""

    argv: list[str] = Field(min_length=1)
    timeout: Duration = 20.0
    output_limit: int = Field(default=65536, ge=0, description="bytes of output kept in the journal")


# ---------------------------------------------------------------------------------------------
# Executors: one config model per restart method, discriminated by `executor`.


class CommandTarget(StrictModel):
    executor: Literal["command"]
    argv: list[str] = Field(min_length=1)
    timeout: Duration = 120.0
    output_limit: int = Field(default=4096, ge=0, description="bytes of output kept in the journal")
    pre_restart: PreRestart | None = None


class HttpTarget(StrictModel):
    executor: Literal["http"]
    url: HttpUrl
    timeout: Duration = 30.0
    pre_restart: PreRestart | None = None


# Docker's own rule for container names (plus 64-hex ids, which it also matches).
_CONTAINER_NAME = re.compile(r"^/?[a-zA-Z0-9][a-zA-Z0-9_.-]*$")


class DockerTarget(StrictModel):
    executor: Literal["docker"]
    container: str
    socket_path: Path = Path("/var/run/docker.sock")
    # None = unversioned path (the daemon's current API); e.g. "1.43" pins `/v1.43/...`.
    api_version: str | None = None
    # Seconds Docker waits for the container to stop before killing it (`?t=`).
    stop_timeout: int = Field(default=30, ge=0)
    timeout: Duration = 120.0
    pre_restart: PreRestart | None = None

    @field_validator("container")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _CONTAINER_NAME.match(name):
            raise ValueError("not a valid Docker container name")
        return name.lstrip("/")

    @field_validator("api_version")
    @classmethod
    def _version(cls, version: str | None) -> str | None:
        if version is not None and not re.match(r"^v?\d+\.\d+$", version):
            raise ValueError("must look like 1.43")
        return version.lstrip("v") if version else None


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _namespace(ns: str) -> str:
    if not _DNS_LABEL.match(ns) or len(ns) > 63:
        raise ValueError("not a valid Kubernetes namespace name")
    return ns


# A Kubernetes namespace (a DNS label).
Namespace = Annotated[str, AfterValidator(_namespace)]


class KubernetesTarget(KubeAccess):
    """Pods deleted (or evicted) by a label selector, through the API server this target's own keys reach."""

    executor: Literal["kubernetes"]
    namespace: Namespace
    pod_selector: str = Field(min_length=1)
    # A selector that matches more pods than this is refused: deleting a whole deployment's pods
    # at once is exactly the cascade the remediator exists to prevent.
    max_pods: int = Field(default=1, ge=1)
    pre_restart: PreRestart | None = None


TargetConfig = Annotated[
    CommandTarget | HttpTarget | DockerTarget | KubernetesTarget,
    Field(discriminator="executor"),
]


# ---------------------------------------------------------------------------------------------
# Kubernetes: the API client, the Lease holding the shared state, and targets learnt from the exporter.


class LeaseRef(StrictModel):
    namespace: Namespace
    name: str = "llm-vitals-remediator"
    # The lock's Lease duration when no restart runs; a restart holds it for its executor's timeout.
    duration: Duration = 15.0

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", name) or len(name) > 253:
            raise ValueError("not a valid Kubernetes object name")
        return name


class KubernetesSettings(KubeAccess):
    """The client for the shared state and the pod executor; in-cluster service account by default."""

    timeout: Duration = 10.0  # an API server that does not answer means no restart (the webhook answers 503)
    # None: the single-replica SQLite mode. Set, the replicas share their state in this Lease.
    lease: LeaseRef | None = None
    # This replica's name in the Lease and in Events; default: $POD_NAME, else the host name.
    identity: str | None = None


class TemplateMatchConfig(StrictModel):
    engine: str | None = None
    namespace: str | None = None
    name: str | None = Field(default=None, description="a glob over the exporter's target name")

    @model_validator(mode="after")
    def _something(self) -> TemplateMatchConfig:
        if self.engine is None and self.namespace is None and self.name is None:
            raise ValueError("set at least one of engine, namespace or name")
        return self


class TargetTemplate(StrictModel):
    """Targets the exporter discovered in Kubernetes: the restart deletes the target's own pod."""

    match: TemplateMatchConfig
    executor: Literal["kubernetes"]
    timeout: Duration = 30.0
    pre_restart: PreRestart | None = None


# ---------------------------------------------------------------------------------------------


class Backoff(StrictModel):
    """The per-workload backoff: each restart of a streak makes the next wait longer (slow loops)."""

    # After the n-th restart of a streak the next waits min(initial * 2**(n-1), max); 0s: off.
    initial: Duration = 900.0
    max: Duration = 4 * 3600.0
    # This long without a restart ends the streak (the next restart waits nothing).
    reset_after: Duration = 12 * 3600.0

    @model_validator(mode="after")
    def _ordered(self) -> Backoff:
        # The shared state keeps a streak for 7 days (remediator/shared.py: BACKOFF_MEMORY_SECONDS).
        if self.reset_after > 7 * 86400:
            raise ValueError("reset_after must be at most 7d")
        if self.initial > self.max:
            raise ValueError("initial must not be more than max")
        if self.initial > 0 and self.reset_after <= self.max:
            raise ValueError("reset_after must be more than max (else a loop at the cap never stays capped)")
        return self


class Budget(StrictModel):
    max_restarts: int = Field(default=3, ge=1)
    window: Duration = 3600.0
    backoff: Backoff = Backoff()


class Settings(StrictModel):
    listen: ListenAddress = "127.0.0.1:9472"
    exporter_url: HttpUrl = "http://127.0.0.1:9471"
    # One URL per exporter shard (`shard: {index, count}`); instead of `exporter_url`, never beside it.
    exporter_urls: list[HttpUrl] | None = None
    exporter_timeout: Duration = 5.0
    # A successful exporter read is reused this long (the exporter polls every few seconds).
    exporter_max_age: Duration = 1.0
    auth: AuthSettings
    state_path: Path = Path("./remediator.db")
    # Refusals and resolutions older than this are pruned at start; restarts and circuits are kept.
    journal_retention: Duration = 30 * 86400.0
    global_cooldown: Duration = 900.0
    budget: Budget = Budget()
    # A count ("2", 2) or a percentage ("40%") of the configured targets.
    max_unhealthy: int | str = "40%"
    # After a fleet_gate refusal, no restart until the fleet has been healthy this long.
    storm_cooldown: Duration = 0.0
    # The remediator's own look (redecide.py): how often it decides again the stuck targets it held,
    # and counts the restarts it did not make. 0: off (a hold then ends only at Alertmanager's re-send).
    redecide_interval: Duration = 10.0
    gpu_fault_action: Literal["refuse", "cordon_and_move"] = "refuse"
    # How a pod is restarted or moved: the Eviction API (PodDisruptionBudgets are respected), or a delete.
    pod_action: Literal["evict", "delete"] = "evict"
    # The escalation ladder: a workload stuck again within this long of its last step takes the next
    # (restart -> cordon_and_move -> page). None: off (every allowed alert is a restart).
    escalate_within: Duration | None = None
    # Nodes llm-vitals may hold cordoned (a GPU fault or the ladder), not yet released, fleet-wide;
    # a further cordon is refused `cordon_limit`. 0: never cordon.
    max_cordoned_nodes: int = Field(default=1, ge=0, le=10_000)
    dry_run: bool = False
    body_limit: int = Field(default=1024 * 1024, ge=1024)
    # Alerts named here may be acted on in state `down` (when a user labelled them for restart).
    down_alertnames: list[str] = ["LLMServerDown"]
    targets: dict[str, TargetConfig] = {}
    target_templates: list[TargetTemplate] = []
    kubernetes: KubernetesSettings | None = None

    @model_validator(mode="after")
    def _some_target(self) -> Settings:
        if not self.targets and not self.target_templates:
            raise ValueError("set targets, target_templates or both")
        return self

    @field_validator("escalate_within")
    @classmethod
    def _escalate_within(cls, value: float | None) -> float | None:
        # The shared state keeps a ladder step for a day (remediator/shared.py: LADDER_MEMORY_SECONDS).
        if value is not None and not 0 < value <= 86400:
            raise ValueError("must be more than 0s and at most 24h (or left out: no ladder)")
        return value

    @field_validator("exporter_url")
    @classmethod
    def _exporter_url(cls, url: str) -> str:
        return url.rstrip("/")

    @field_validator("exporter_urls")
    @classmethod
    def _exporter_urls(cls, urls: list[str] | None) -> list[str] | None:
        if urls is None:
            return None
        if not urls:
            raise ValueError("list at least one exporter URL (one per exporter shard)")
        urls = [url.rstrip("/") for url in urls]
        # The same exporter twice would report every target twice, and a target reported twice is never acted on.
        if seen := sorted({url for url in urls if urls.count(url) > 1}):
            raise ValueError(f"{seen[0]} is listed twice")
        return urls

    @model_validator(mode="after")
    def _one_exporter_key(self) -> Settings:
        if self.exporter_urls is not None and "exporter_url" in self.model_fields_set:
            raise ValueError("set exporter_url (one exporter) or exporter_urls (one per shard), not both")
        return self

    def exporters(self) -> list[str]:
        """The base URL of every exporter to re-check through: every shard, or the one exporter."""
        return list(self.exporter_urls) if self.exporter_urls is not None else [self.exporter_url]

    @field_validator("max_unhealthy")
    @classmethod
    def _max_unhealthy(cls, value: int | str) -> int | str:
        return parse_max_unhealthy(value)

    @field_validator("targets")
    @classmethod
    def _target_names(cls, targets: dict[str, TargetConfig]) -> dict[str, TargetConfig]:
        for name in targets:
            target_name(name)  # the exporter's `target` label: the same rule
        return targets

    def max_unhealthy_count(self) -> int:
        """How many configured targets may be unhealthy at once and still get a restart (llm_vitals/remediator/fleet_limit.py)."""
        count = self.max_unhealthy if isinstance(self.max_unhealthy, int) else 0  # a checked str is a percentage
        return unhealthy_limit(count, percent_of(self.max_unhealthy), len(self.targets))

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_listen(self.listen)


def build_settings(data: object, environ: Mapping[str, str] | None = None, source: str = "config") -> Settings:
    """Validate a parsed config and resolve its secrets. Raises ConfigError naming `source`."""
    settings = validate_document(Settings, data, source)
    try:
        settings.auth.resolve(os.environ if environ is None else environ)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return settings


def load_settings(path: str | Path, environ: Mapping[str, str] | None = None) -> Settings:
    """Read, validate and resolve a YAML config file. Raises ConfigError."""
    return build_settings(read_yaml(path), environ, str(path))
