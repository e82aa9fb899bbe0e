"""The exporter's validated configuration: one YAML file, unknown keys rejected, secrets kept secret."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, SecretStr, field_validator, model_validator

# ConfigError is re-exported: the CLI and callers catch it as exporter.settings.ConfigError.
from llm_vitals.config import ConfigError, KubeAccess, StrictModel, WithSecrets, keys_set, read_yaml, validate_document
from llm_vitals.durations import Duration, PositiveDuration
from llm_vitals.exporter.engines.table import engine_of
from llm_vitals.exporter.gpu_faults import NVSENTINEL_CONDITIONS, READY_CONDITIONS, NodeRules, Taint
from llm_vitals.exporter.gpu_faults.xids import Bucket, XidRules
from llm_vitals.exporter.pace import PaceRules
from llm_vitals.validators import ListenAddress, ParsedHttpUrl, TargetName, WorkloadName, parse_listen

# The engines of llm_vitals/exporter/engines/table.py; a test keeps the two lists equal.
EngineName = Literal["vllm", "llamacpp", "triton", "sglang", "tgi", "openai"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


class _FrozenStrict(StrictModel):
    # Frozen: one settings object is shared by the poller, collector and routes, and none may change it.
    model_config = ConfigDict(frozen=True)


class CanarySettings(_FrozenStrict):
    """The idle canary: one tiny completion, only ever sent to a server with nothing running or waiting."""

    enabled: bool = True
    interval: PositiveDuration = 30.0
    timeout: PositiveDuration = 10.0
    # Consecutive failures (errors or timeouts) on an idle-looking server before it is `unresponsive`.
    failures_before_unresponsive: int = Field(3, ge=1)
    # Readiness of an idle server needs evidence it serves (a canary or counters that moved) this recent;
    # default 3 x interval, so one lost canary does not flap readiness.
    fresh_for: PositiveDuration | None = None
    prompt: str = "ping"
    # The request body itself, for engines whose canary the operator must describe (Triton: a KServe
    # v2 infer body, `{inputs: [{name, shape, datatype, data}]}`, of the smallest request the model takes).
    request: dict[str, Any] | None = None
    # Where an OpenAI-compatible server's canary goes. auto: a completion, else (while each is
    # rejected with a 4xx) a chat completion, else an embedding; the first that answers is kept.
    endpoint: Literal["auto", "completions", "chat", "embeddings"] = "auto"

    @property
    def freshness(self) -> float:
        return self.fresh_for if self.fresh_for is not None else 3 * self.interval


class DcgmSettings(_FrozenStrict):
    """Where a target's GPU is read on a dcgm-exporter page: its `/metrics` URL and the GPU, by pod or by UUID."""

    url: ParsedHttpUrl
    # The GPU(s) whose `pod` label (dcgm-exporter's Kubernetes pod mapping) is this pod; with
    # `namespace`, only in that namespace. Every GPU of the pod counts (tensor parallel: several).
    pod: str | None = None
    namespace: str | None = None
    # Or the GPU by its UUID label (`GPU-...`), for hosts without the pod mapping.
    uuid: str | None = None

    @model_validator(mode="after")
    def _one_gpu(self) -> DcgmSettings:
        if len(keys_set(self, "pod", "uuid")) != 1:
            raise ValueError("name the GPU by exactly one of pod and uuid")
        if self.namespace is not None and self.pod is None:
            raise ValueError("namespace goes with pod")
        return self


def _gpu_ref(value: int | str) -> int | str:
    """A `gpus:` entry: an NVML index (0, or "0") or a GPU UUID (`GPU-...`, as nvidia-smi -L shows it)."""
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str) and (value.isdigit() or (value.startswith("GPU-") and len(value) > 4)):
        return value
    raise ValueError(f"a GPU is named by its index (0, 1, ...) or its UUID (GPU-...), not {value!r}")


class TargetSettings(_FrozenStrict, WithSecrets):
    """One LLM server (or proxy) to watch."""

    secrets = {"api_key": False}

    name: TargetName
    url: ParsedHttpUrl
    # Which row of the engine table (llm_vitals/exporter/engines/table.py) reads this server.
    engine: EngineName = "vllm"
    role: Literal["backend", "proxy"] = "backend"
    model: str | None = None
    # Where the engine's /metrics page is, when not on `url` (Triton's default: url's host, port 8002).
    metrics_url: ParsedHttpUrl | None = None
    api_key_env: str | None = None
    api_key_file: Path | None = None
    stuck_after: PositiveDuration = 60.0
    # Failed reads (timeouts, refused connections, HTTP errors, unreadable pages) make the target
    # `down` only once no good read has come for this long; until then it keeps its state and its
    # evidence (docs/states.md). 30 s: longer than the slowest /metrics seen under load (a real vLLM
    # took 9 s) plus a poll, three timed-out reads at the default 5 s poll and 10 s metrics_timeout,
    # and no longer than Kubernetes' default readiness window (3 x 10 s) or a liveness window.
    down_after: PositiveDuration = 30.0
    # 0: no grace (a target that fails its first read is `down` at once).
    startup_grace: Duration = 900.0
    # Liveness fails only when stuck for longer than this (default 2 x stuck_after): a wrong liveness
    # verdict costs minutes of weight loading.
    liveness_budget: PositiveDuration | None = None
    # How long a pause on purpose (vLLM's /pause, a weight update, a sleep with requests kept,
    # SGLang's paused requests) may last: a longer one pages (LLMServerPausedTooLong) and is never a
    # restart; a weight update or wake-up still in flight after it is `stuck` (wedged inside it).
    # 30 min: longer than an RL weight sync or a sleep/wake cycle of a large model.
    pause_budget: PositiveDuration = 1800.0
    canary: CanarySettings = CanarySettings()
    # A file a node agent (DCGM health, an Xid log watcher) writes when this target's GPU is faulty:
    # present and non-empty means `gpu_fault`, and a restart will not help. Read once per poll.
    gpu_fault_file: Path | None = None
    # The target's GPU on a dcgm-exporter page, read once per poll (docs/gpu-faults.md).
    dcgm: DcgmSettings | None = None
    # The target's GPUs on this host, by NVML index or UUID, read through NVML (gpu_faults.nvml).
    gpus: list[int | str] | None = Field(None, min_length=1)
    # The Kubernetes node this target runs on, whose conditions and taints are watched for a GPU
    # fault. A discovered pod's node is filled in from the pod; a static target may name its own.
    node: str | None = None
    # `engine: openai` only. Its load cannot be read, so its canary goes out whatever the load and
    # may time out behind it: by default its canary failures page (LLMServerUnresponsiveLoadUnknown,
    # remediation none) and never restart it. True accepts that risk: a busy server may be restarted.
    restart_risking_busy_server: bool = False
    # What the operator owns and a restart does not replace: the remediator's budget, circuit and
    # restart-loop alert key on it. Given here, by a discovery template or a file_sd label
    # (`__llm_vitals_workload`), or read from a pod's owners (discovery/workload.py); none means
    # the target's own name (`effective_workload`).
    workload: WorkloadName | None = None

    @field_validator("gpus")
    @classmethod
    def _gpus_named(cls, value: list[int | str] | None) -> list[int | str] | None:
        return None if value is None else [_gpu_ref(ref) for ref in value]

    @model_validator(mode="after")
    def _canary_request_fits_the_engine(self) -> TargetSettings:
        entry = engine_of(self.engine)
        takes_request = entry.canary is not None and entry.canary.needs_request
        if self.canary.request is not None and not takes_request:
            raise ValueError(f"canary.request is for engines whose canary is a request you describe (triton), "
                             f"not {self.engine}: its canary is a 1-token completion")
        if self.canary.endpoint != "auto" and entry.canary is not None:
            raise ValueError(f"canary.endpoint is for OpenAI-compatible servers, not {self.engine}: "
                             f"its canary is the engine's own")
        if self.canary.request is not None and entry.models_path is None and not self.model:
            raise ValueError(f"engine {self.engine} lists no models at /v1/models: set model, which the canary.request is for")
        return self

    @model_validator(mode="after")
    def _restart_risk_only_where_load_is_unknown(self) -> TargetSettings:
        if self.restart_risking_busy_server and engine_of(self.engine).parse is not None:
            raise ValueError(f"restart_risking_busy_server is for engine openai, whose load cannot be read; "
                             f"a {self.engine} target's canary never goes to a busy server")
        return self

    @property
    def restart_on_unresponsive(self) -> bool:
        """Whether failed canaries may restart it (LLMServerUnresponsive with remediation restart).

        Only where the exporter reads the load, so the canary went to a server it saw idle; an
        engine with no /metrics (openai) only when the target accepts the risk.
        """
        return engine_of(self.engine).parse is not None or self.restart_risking_busy_server

    @property
    def sends_canary(self) -> bool:
        """Whether this target gets idle canaries at all: enabled, a backend, and its engine's canary can be built.

        Triton's canary is the operator's request: without `canary.request` (and `model`) none is sent,
        and an idle-looking wedged Triton then stays idle (docs/engines.md).
        """
        entry = engine_of(self.engine)
        if not self.canary.enabled or self.role != "backend":
            return False
        if entry.canary is not None and entry.canary.needs_request and self.canary.request is None:
            return False
        return entry.models_path is not None or bool(self.model)

    @property
    def stuck_after_warning(self) -> str | None:
        """Why `stuck_after` is below the floor its engine's own refresh imposes (the engine table's
        facts), or None: such a target may read stuck after its work has ended."""
        facts = engine_of(self.engine).facts
        if self.stuck_after >= facts.stuck_after_floor:
            return None
        return (f"stuck_after: {self.stuck_after:g}s is below the {facts.stuck_after_floor:g}s that engine {self.engine} "
                f"needs ({facts.stuck_after_floor_reason}): it may read stuck after its work has ended; "
                f"use {facts.stuck_after_floor:g}s or more")

    @property
    def effective_workload(self) -> str:
        """The workload as given or discovered, else the target's own name: never empty."""
        return self.workload or self.name

    @property
    def base_url(self) -> str:
        return str(self.url).rstrip("/")

    @property
    def public_url(self) -> str:
        """The URL as shown in labels and API answers: any user:password@ in it is dropped."""
        url = self.url
        # Decided from the port itself, not by searching str(url), which also holds the password.
        port = f":{url.port}" if url.port and url.port != _DEFAULT_PORTS.get(url.scheme) else ""
        return f"{url.scheme}://{url.host or ''}{port}{url.path or ''}".rstrip("/")

    @property
    def liveness(self) -> float:
        return self.liveness_budget if self.liveness_budget is not None else 2 * self.stuck_after

    @property
    def api_key(self) -> SecretStr | None:
        """Read at load time from api_key_env / api_key_file (`read_secrets`); never part of a dump."""
        return self.secret("api_key")


# Keys a discovery template may not set: the source fills them from what it discovered.
_DISCOVERED_KEYS = frozenset({"name", "url", "node"})


def _check_template(template: dict[str, Any]) -> dict[str, Any]:
    """A discovery `template` is any target key but name/url/node, checked now so a typo fails at load."""
    refused = sorted(_DISCOVERED_KEYS & template.keys())
    if refused:
        raise ValueError(f"a template may not set {', '.join(refused)}: discovery fills them in")
    TargetSettings.model_validate({**template, "name": "template", "url": "http://template.invalid"})
    return template


class KubernetesDiscovery(_FrozenStrict):
    """Pods listed and then watched through the API server (llm_vitals/exporter/discovery/kubernetes.py)."""

    # Default: the exporter's own namespace (the service account's), one watch per namespace.
    namespaces: list[str] = []
    selector: str = Field(min_length=1)  # a label selector, required: never "every pod in the namespace"
    port: str | int  # the container port, by name or by number
    scheme: Literal["http", "https"] = "http"
    template: dict[str, Any] = {}
    # Default: the in-cluster service account.
    kubeconfig: Path | None = None

    @property
    def access(self) -> KubeAccess:
        """The API server these pods are listed from: the kubeconfig, else the in-cluster service account."""
        return KubeAccess(kubeconfig=self.kubeconfig)

    @field_validator("template")
    @classmethod
    def _template_checked(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_template(value)

    @field_validator("port")
    @classmethod
    def _port_sane(cls, value: str | int) -> str | int:
        if isinstance(value, int) and not 1 <= value <= 65535:
            raise ValueError("port must be 1-65535 or a container port name")
        if isinstance(value, str) and not value:
            raise ValueError("port must be 1-65535 or a container port name")
        return value


class FileDiscovery(_FrozenStrict):
    """Prometheus file_sd files (JSON or YAML), re-read when they change (llm_vitals/exporter/discovery/file_sd.py)."""

    paths: list[str] = Field(min_length=1)  # file paths or globs (`*` in the last part)
    # How often the files' size and modification time are looked at; a change re-reads them.
    refresh_interval: PositiveDuration = 5.0
    template: dict[str, Any] = {}

    @field_validator("template")
    @classmethod
    def _template_checked(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_template(value)


class DiscoverySource(_FrozenStrict):
    """One entry of `discovery:`: exactly one of `kubernetes` and `file`."""

    kubernetes: KubernetesDiscovery | None = None
    file: FileDiscovery | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> DiscoverySource:
        if len(keys_set(self, "kubernetes", "file")) != 1:
            raise ValueError("each discovery entry has exactly one of kubernetes and file")
        return self


class ShardSettings(_FrozenStrict):
    """This replica keeps the targets whose name hashes to `index` of `count` (llm_vitals/exporter/discovery/targetset.py)."""

    index: int = Field(ge=0)
    count: int = Field(ge=1)

    @model_validator(mode="after")
    def _index_below_count(self) -> ShardSettings:
        if self.index >= self.count:
            raise ValueError(f"shard.index must be below shard.count ({self.count})")
        return self


class BackstopSettings(_FrozenStrict):
    """The kubelet's liveness backstop obeys the remediator's gate (llm_vitals/exporter/backstop_rule.py):
    the shim asks `remediator_url` for its targets' workloads' word every `interval`."""

    # Not heard from the remediator for this long: the alerting chain is down, and the backstop acts
    # alone, as without this section. 10 min: many missed asks (a remediator's rolling restart, a
    # slow API server) never arm it, and a dead chain still ends in a restart within about
    # after + liveness_budget + the probe's failures (10 + 4 + 2 min with the shipped manifests).
    after: PositiveDuration = 600.0
    interval: PositiveDuration = 15.0
    timeout: PositiveDuration = 5.0


class NvmlSettings(_FrozenStrict):
    """The NVML source (llm_vitals/exporter/gpu_faults/nvml_source.py), for targets that name their `gpus`."""

    # Xids taken as `reset_gpu` on this source besides NVIDIA's catalog (gpu_faults.xid_buckets is
    # the one table for both sources; this list is kept for configs written before it).
    xids: list[int] = []
    # Each GPU's health fields are read this often, in a thread of the GPU's own.
    interval: PositiveDuration = 5.0
    # An NVML call that has not returned within this is `nvml_timeout` in gpu_fault_errors, never a fault.
    call_timeout: PositiveDuration = 1.0
    # The same for starting NVML: nvmlInit, enumerating the GPUs, registering for Xid events.
    init_timeout: PositiveDuration = 10.0


class GpuFaultSettings(_FrozenStrict):
    """What counts as a GPU fault on a node, a dcgm-exporter page or through NVML (llm_vitals/exporter/gpu_faults/)."""

    # Node conditions that are a GPU fault when True (default: NVSentinel's).
    node_conditions: list[str] = list(NVSENTINEL_CONDITIONS)
    # Node conditions that are a GPU fault when False (default: the EKS node monitoring agent's).
    node_ready_conditions: list[str] = list(READY_CONDITIONS)
    # Taints that are a GPU fault: `key`, `key=value`, `key:Effect` or `key=value:Effect`.
    node_taints: list[str] = []
    # Xid number -> bucket (follow, ignore, restart_app, reset_gpu, reboot_node), over NVIDIA's Xid catalog
    # (llm_vitals/exporter/gpu_faults/xids.py): reset_gpu and reboot_node are a fault.
    xid_buckets: dict[int, Bucket] = {}
    # Xids taken as `reset_gpu` on the dcgm source besides the catalog (kept for older configs).
    dcgm_xids: list[int] = []
    # A dcgm-exporter that does not answer within this is an error kept, never a fault.
    dcgm_timeout: PositiveDuration = 2.0
    # The API server for the node watch; default: the in-cluster service account.
    kubeconfig: Path | None = None
    # The NVML source: started when a target names `gpus`.
    nvml: NvmlSettings = NvmlSettings()

    @field_validator("node_taints")
    @classmethod
    def _taints_parse(cls, value: list[str]) -> list[str]:
        for text in value:
            Taint.parse(text)
        return value

    @property
    def dcgm_xid_rules(self) -> XidRules:
        return XidRules.of(self.xid_buckets, self.dcgm_xids)

    @property
    def nvml_xid_rules(self) -> XidRules:
        return XidRules.of(self.xid_buckets, self.nvml.xids)

    @property
    def node_rules(self) -> NodeRules:
        return NodeRules(frozenset(self.node_conditions), frozenset(self.node_ready_conditions),
                         tuple(Taint.parse(text) for text in self.node_taints))


class PaceSettings(_FrozenStrict):
    """A replica against its workload's peers (llm_vitals/exporter/pace.py): when its pace reads `degraded`."""

    # Degraded: seconds per unit of work this many times the median of its peers' ...
    ratio: float = Field(2.0, gt=1.0, allow_inf_nan=False)
    # ... without a break for this long.
    degraded_after: PositiveDuration = 600.0
    # Judged only beside this many other replicas (or data-parallel units) with enough work in the window.
    min_peers: int = Field(2, ge=1)
    # The pace is measured over this much of the latest reads.
    window: PositiveDuration = 120.0
    # Work (tokens; Triton: requests) a replica must have done within the window to be judged, or to count as a peer.
    min_work: float = Field(100.0, gt=0, allow_inf_nan=False)

    @functools.cached_property
    def rules(self) -> PaceRules:
        """The rule's own copy of these settings (pace.py takes no settings object); made once, read every poll."""
        return PaceRules(ratio=self.ratio, degraded_after=self.degraded_after, min_peers=self.min_peers,
                         window=self.window, min_work=self.min_work)


class ExporterSettings(_FrozenStrict, WithSecrets):
    """The whole exporter config file."""

    secrets = {"drain_token": False, "remediator_token": False}

    listen: ListenAddress = "127.0.0.1:9471"
    poll_interval: PositiveDuration = 5.0
    # Fraction of poll_interval added at random to each wait, so 1,000 targets do not poll in lockstep.
    poll_jitter: float = Field(0.1, ge=0.0, le=1.0, allow_inf_nan=False)
    connect_timeout: PositiveDuration = 3.0
    # A real vLLM on a saturated CPU once took 9 s to answer /metrics: be patient by default.
    metrics_timeout: PositiveDuration = 10.0
    models_timeout: PositiveDuration = 5.0
    health_timeout: PositiveDuration = 3.0
    max_page_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    history_seconds: PositiveDuration = 600.0
    drain_token_env: str | None = None
    drain_token_file: Path | None = None
    # The status page reads the remediator's decisions from it; with `backstop`, liveness asks it for its word.
    remediator_url: ParsedHttpUrl | None = None
    # The remediator's read token (its auth.read_token_env), the bearer token the status page sends:
    # it reads the journal and can never restart (the remediator's act token still works, but holds too much).
    remediator_token_env: str | None = None
    remediator_token_file: Path | None = None
    # The liveness backstop asks the remediator (remediator_url, with the read token) before it fails:
    # one actor decides a restart. None: liveness alone, as before.
    backstop: BackstopSettings | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    gpu_faults: GpuFaultSettings = GpuFaultSettings()
    # Each replica's pace against its workload's peers: `degraded` (docs/states.md).
    pace: PaceSettings = PaceSettings()
    targets: list[TargetSettings] = []
    # Sources of targets that come and go (docs/states.md): pods in Kubernetes, file_sd files.
    discovery: list[DiscoverySource] = []
    # Split the targets (static and discovered) between `count` replicas by a stable hash of the name.
    shard: ShardSettings | None = None

    @model_validator(mode="after")
    def _unique_names(self) -> ExporterSettings:
        if not self.targets and not self.discovery:
            raise ValueError("give at least one target, or a discovery source")
        seen: set[str] = set()
        for target in self.targets:
            if target.name in seen:
                raise ValueError(f"duplicate target name {target.name!r}")
            seen.add(target.name)
        if self.backstop is not None and self.remediator_url is None:
            raise ValueError("backstop asks the remediator for its word: set remediator_url too")
        return self

    @property
    def host(self) -> str:
        return parse_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return parse_listen(self.listen)[1]

    @property
    def drain_token(self) -> SecretStr | None:
        """The token that /drain and /reload ask for; None: trusted to the listen address."""
        return self.secret("drain_token")

    @property
    def remediator_token(self) -> SecretStr | None:
        """The bearer token for the remediator's `/api/v1/actions`; None sends no auth."""
        return self.secret("remediator_token")

    def warnings(self) -> list[str]:
        """What loads but is likely wrong, each naming its key: a `stuck_after` below its engine's floor,
        in a target or a discovery template. Said at `--check-config` and logged at start."""
        found = []
        for index, target in enumerate(self.targets):
            if (warning := target.stuck_after_warning) is not None:
                found.append(f"targets[{index}].{warning}")
        for index, source in enumerate(self.discovery):
            kind, spec = ("kubernetes", source.kubernetes) if source.kubernetes is not None else ("file", source.file)
            if spec is None or not spec.template:
                continue
            template = TargetSettings.model_validate({**spec.template, "name": "template", "url": "http://template.invalid"})
            if (warning := template.stuck_after_warning) is not None:
                found.append(f"discovery[{index}].{kind}.template.{warning}")
        return found

    def node_watch_access(self) -> KubeAccess | None:
        """The node watch's API server (gpu_faults.kubeconfig, else pod discovery's, else in-cluster), when the
        config needs the watch: a static target names a node, or pods are discovered. None: no watch."""
        discovered = [entry.kubernetes for entry in self.discovery if entry.kubernetes is not None]
        if not discovered and not any(target.node for target in self.targets):
            return None
        return KubeAccess(kubeconfig=self.gpu_faults.kubeconfig or next((d.kubeconfig for d in discovered), None))

    def target(self, name: str) -> TargetSettings | None:
        for target in self.targets:
            if target.name == name:
                return target
        return None

    def resolve_secrets(self, environ: Mapping[str, str]) -> ExporterSettings:
        """Resolve every secret source now, so a missing key fails at start, not at the first canary."""
        for index, target in enumerate(self.targets):
            target.read_secrets(environ, f"targets[{index}].")
        self.read_secrets(environ)
        return self


def parse_settings(data: object, source: str = "config", environ: Mapping[str, str] | None = None) -> ExporterSettings:
    """Validate an already-loaded YAML document; errors name the source and each offending key."""
    settings = validate_document(ExporterSettings, data, source)
    try:
        return settings.resolve_secrets(os.environ if environ is None else environ)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_settings(path: str | Path, environ: Mapping[str, str] | None = None) -> ExporterSettings:
    """Read and validate the YAML config file at `path`."""
    return parse_settings(read_yaml(path), str(path), environ)
