"""Engine adapters: each turns what a server kind exposes into one engine-neutral `PageReading`.

One module per engine, each defining `ENGINE`, an `Engine` entry; `llm_vitals/exporter/engines/table.py`
gathers them into `ENGINES`, the one table the poller and the verdict look an engine up in (as
blackbox_exporter's `Probers` map). Nothing outside this package says `if engine == ...`.

    vllm.py      vLLM (real pages: tests/fixtures/vllm/)
    llamacpp.py  llama.cpp's native llama-server --metrics        (adapter: i12-llamacpp)
    sglang.py    SGLang                                           (adapter: i12-sglang)
    triton.py    NVIDIA Triton, metrics on their own port         (adapter: i12-triton)
    tgi.py       Hugging Face TGI, from its source (never checked against a live server)
    openai.py    no /metrics: judged by /v1/models and the canary
    scan.py      the format-correct targeted scanner every adapter reads its samples with
    table.py     ENGINES, gathered from each module's ENGINE; read_page() checks the signature

Until an engine's helper lands its adapter, its module is a stub whose parse raises PageError
(the target reads `down`), with the table facts already filled in from its RECIPE.

An adapter's `parse(page)` returns a PageReading or raises PageError; `table.read_page` wraps it so
that another engine's page on a target is `wrong_engine`, never a crash and never idle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from pydantic import AnyHttpUrl

from llm_vitals.targets import PollErrorReason

Signals = tuple[tuple[str, float], ...]


def signals(**values: float | None) -> Signals:
    """Named signals for a PageReading's `more_counters` or `more_gauges`: one the page lacks (None) is left out."""
    return tuple((name, value) for name, value in values.items() if value is not None)


class Unjudged(NamedTuple):
    """A part of the server whose work no signal of the page shows (a Triton decoupled model with no
    in-flight signal): nothing pending and nothing moving then says nothing about it, either way."""

    unit: str  # as a Unit is named: `model="m",version=""`
    why: str  # the words a verdict's detail gives


class Unit(NamedTuple):
    """One part of a server that can hang alone (a vLLM engine, a Triton model and version, an SGLang
    data-parallel rank), as one read shows it: its own load and its own progress signals.

    `counters` and `gauges` are in an order fixed by the adapter, so two reads of one unit compare
    position by position (None: the page lacks that signal for this unit). Only successes, steps and
    tokens are progress: failure counters are never in a unit.
    """

    name: str  # its labels as the page writes them: `engine="1"`, `model="m",version="1"`, `dp_rank="0"`
    running: float
    waiting: float
    deferred: float  # waiting on a peer (a remote KV transfer), as the engine itself marks it
    counters: tuple[float | None, ...]  # grow with work; a fall is the unit started again
    gauges: tuple[float | None, ...] = ()  # move with work (KV usage during a long prefill)
    # (seconds, work): the unit's own pace counters, as PageReading.pace.
    pace: tuple[float, float] | None = None

    @property
    def pending(self) -> bool:
        return self.running > 0 or self.waiting > 0 or self.deferred > 0


@dataclass(frozen=True, slots=True)
class PageReading:
    """One read of an engine's own counters, summed over its units (data parallel engines, models).

    Counters are None when the page does not carry them; gauges running/waiting are always present.
    The last three fields carry what only some engines have, named by the adapter.
    """

    running: float
    waiting: float
    steps: float | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    finished: float | None = None
    kv_usage: float | None = None
    process_start_time: float | None = None
    # An opaque token that changes when the process restarts (llama.cpp's Process-Start-Time-Unix
    # header is monotonic microseconds since boot, not Unix time): compared for inequality only.
    restart_token: str | None = None
    # More engine counters that only grow within one lifetime: movement is progress, a fall a restart.
    more_counters: Signals = ()
    # More engine gauges whose movement is progress (never read as a restart when they fall).
    more_gauges: Signals = ()
    # Gauges that, above 0, mean work is owed even while running and waiting read 0 (SGLang's long
    # chunked prefill): the server is busy, never idle, and never gets a canary.
    busy_signs: Signals = ()
    # The engine says it was put to sleep (vLLM's sleep mode): 0 awake, else its sleep level
    # (vLLM: 1 weights offloaded to CPU memory, 2 weights discarded). A sleeping engine is `asleep`.
    sleep_level: int = 0
    # Monotone counters per labelled series (`family{labels}` as written), for engines whose series
    # come and go within one process (Triton: one per loaded model and version). When given, they,
    # not the sums above, say whether work moved and whether the process restarted: each series is
    # compared only with itself, so a model loaded, unloaded or given a new version is neither
    # progress nor a counter reset. The sums stay for the rates and the API.
    series: Signals = ()
    # Requests the engine itself marks deferred, waiting on a peer (vLLM's
    # `num_requests_waiting_by_reason{reason="deferred"}`: a KV transfer, the LoRA budget; SGLang's
    # disaggregation transfer queues). Pending work; with nothing moving and nothing running it is
    # `waiting_on_peer`, which no restart of this server fixes.
    deferred: float = 0.0
    # The page's units, when it has more than one (a single unit is the sums above): each is judged
    # on its own signals, so one hung unit is not hidden by a busy one.
    units: tuple[Unit, ...] = ()
    # Requests the engine itself paused on purpose (SGLang's `num_paused_reqs`, paused for a weight
    # sync): pending work, owed once the pause ends; with nothing moving the target is `paused`.
    paused: float = 0.0
    # Engine operations in flight, by name (vLLM's `rl_weight_update_operations_in_flight` and
    # `sleep_mode_operations_in_flight`, by `operation`): a pause on purpose while within the
    # target's `pause_budget`, and the engine wedged inside it (`stuck`) once past it.
    operations: Signals = ()
    # Set by the poller from the engine's own model config (exporter/decoupled.py), never by a parse:
    # the target's model answers in streams that none of the page's signals follows.
    unjudged: Unjudged | None = None
    # (seconds, work): two counters that only grow, whose quotient over a window is the engine's pace,
    # seconds of decode per unit of work (vLLM's inter-token latency sum and count, llama.cpp's
    # tokens_predicted_seconds_total and tokens_predicted_total): compared with the workload's
    # peers (llm_vitals/exporter/pace.py). None: the page has no such counters.
    pace: tuple[float, float] | None = None

    # The counters that only ever grow within one process lifetime.
    MONOTONE = ("steps", "generation_tokens", "prompt_tokens", "finished")
    # Every signal whose movement counts as progress (KV usage moves during a long chunked prefill).
    PROGRESS = ("steps", "generation_tokens", "prompt_tokens", "finished", "kv_usage")

    # Views derived from the fields above, computed once when the reading is built (`__post_init__`,
    # again by `replace`), never passed: each poll compares two readings' views and shows one's load,
    # and a reading is built once and read many times. Read-only by convention (plain dicts, as fast
    # as a lookup gets); tests/test_engine_table.py holds them to PROGRESS and MONOTONE.
    # True when work is owed: running, waiting, deferred or paused requests, or a busy sign above 0.
    pending: bool = field(init=False, repr=False, compare=False)
    # The counters a restart resets, by name: per series where the adapter gives them, else MONOTONE
    # (in order) then the engine's own.
    monotone: dict[str, float | None] = field(init=False, repr=False, compare=False)
    # The gauges whose movement, either way, is progress.
    gauges: dict[str, float | None] = field(init=False, repr=False, compare=False)
    # Running and waiting, plus any busy sign above 0: the words a verdict's detail starts with.
    load: str = field(init=False, repr=False, compare=False)
    # The names of the engine operations in flight now (a weight update, a wake-up).
    in_flight: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Written out, not looked up name by name by getattr (a third of the time).
        setter = object.__setattr__  # the class is frozen: its own views are set once, here
        setter(self, "pending", self.running > 0 or self.waiting > 0 or self.deferred > 0 or self.paused > 0
               or any(value > 0 for _, value in self.busy_signs))
        if self.series:
            monotone: dict[str, float | None] = dict(self.series)
        else:
            monotone = {"steps": self.steps, "generation_tokens": self.generation_tokens,
                        "prompt_tokens": self.prompt_tokens, "finished": self.finished}
            if self.more_counters:
                monotone.update(self.more_counters)
        setter(self, "monotone", monotone)
        gauges: dict[str, float | None] = {"kv_usage": self.kv_usage}
        if self.more_gauges:
            gauges.update(self.more_gauges)
        setter(self, "gauges", gauges)
        text = f"running {self.running:g}, waiting {self.waiting:g}"
        if self.deferred:
            text += f" ({self.deferred:g} deferred by the engine)"
        if self.paused:
            text += f" ({self.paused:g} paused by the engine)"
        if self.busy_signs:
            signs = [f"{name} {value:g}" for name, value in self.busy_signs if value > 0]
            text += f" ({', '.join(signs)})" if signs else ""
        setter(self, "load", text)
        setter(self, "in_flight", tuple(name for name, value in self.operations if value > 0) if self.operations else ())

    def counters(self) -> dict[str, float | None]:
        """Every progress signal by name: the fixed ones (PROGRESS, in order), then the engine's own."""
        named: dict[str, float | None] = {
            "steps": self.steps, "generation_tokens": self.generation_tokens, "prompt_tokens": self.prompt_tokens,
            "finished": self.finished, "kv_usage": self.kv_usage,
        }
        if self.more_counters:
            named.update(self.more_counters)
        if self.more_gauges:
            named.update(self.more_gauges)
        return named


class PageError(Exception):
    """A page that cannot be turned into a snapshot. `reason` is the poll-error label."""

    def __init__(self, reason: PollErrorReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Page:
    """One `/metrics` answer: its body and response headers (llama.cpp's restart token is a header)."""

    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """What the pure verdict must know about an engine kind beyond one snapshot."""

    # /metrics accepted and never answered, repeatedly while work was last seen pending, is `stuck`
    # (reason metrics_unanswered): true where an unanswered /metrics means the engine is frozen, not
    # loaded: llama.cpp (its engine loop serves /metrics) and Triton (its own metrics threads, apart
    # from inference, answer in ms under load); false where /metrics only gets slow under load (vLLM).
    metrics_unanswered_is_stuck: bool = False
    # The least `stuck_after` this engine's own refresh allows, and why (empty: no floor). An engine
    # whose pending gauges lag the work (SGLang refreshes them at its log points) can read work
    # pending with nothing moving for that long after the work ended: a shorter stuck_after reads
    # such a server stuck. Settings validation warns about a target below it at load.
    stuck_after_floor: float = 0.0
    stuck_after_floor_reason: str = ""


class CanaryInput(Protocol):
    """What a canary body is built from: a target's `canary:` settings (exporter/settings.py's CanarySettings)."""

    @property
    def prompt(self) -> str: ...

    @property
    def request(self) -> dict[str, Any] | None: ...


class WatchedTarget(Protocol):
    """What an engine entry reads of a target: its settings (exporter/settings.py's TargetSettings).

    A protocol, not that class: the settings validate against the engine table, so the table
    must not import them.
    """

    @property
    def url(self) -> AnyHttpUrl: ...

    @property
    def metrics_url(self) -> AnyHttpUrl | None: ...

    @property
    def base_url(self) -> str: ...

    @property
    def canary(self) -> CanaryInput: ...


@dataclass(frozen=True, slots=True)
class Canary:
    """How an engine's idle canary is asked and its answer judged (pure: the poller does the I/O)."""

    # POSTed to the target's url + path; "{model}" is replaced by the model's name.
    path: str
    # (target, model) -> the JSON body.
    body: Callable[[WatchedTarget, str], object]
    # The parsed JSON answer -> None when it is a real answer, else what is wrong with it.
    wrong: Callable[[object], str | None]
    # The body comes from the operator (`canary.request`): the target must configure it, and a model.
    needs_request: bool = False
    # The answer is a server-sent event stream: its first `data:` event, read within the canary's
    # timeout, is the answer (the rest is not waited for).
    stream: bool = False


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """What an engine's own config of the target's model says, as far as the verdict needs it."""

    # The model answers each request with a stream of responses (Triton's
    # `model_transaction_policy.decoupled`): Triton's plain infer route refuses it (HTTP 501), and
    # counts its requests when they are handed to the model, not as their responses go out.
    decoupled: bool = False


@dataclass(frozen=True, slots=True)
class Engine:
    """One row of the engine table: where an engine's signals live and how they read."""

    name: str
    # Page -> PageReading, raising PageError; None for an engine with no /metrics worth reading.
    parse: Callable[[Page], PageReading] | None
    # A metric name prefix that only this engine's pages carry: how another engine's page is told apart.
    signature: str | None = None
    metrics_path: str = "/metrics"
    # Metrics on their own port of the url's host (Triton: 8002); None: on the url itself.
    # A target's `metrics_url` overrides either.
    metrics_port: int | None = None
    # Routes whose 503 is the engine's word that it is dead (read when work is pending and nothing moved).
    health_paths: tuple[str, ...] = ()
    # A route that must answer 200 before an idle-looking server counts as idle (and gets a canary);
    # "{model}" is the target's model, and the route is read only when one is configured. Triton's
    # page and /v2/health/ready are up before the model is loaded: its /v2/models/<m>/ready is not.
    ready_path: str | None = None
    # Where the served models are listed (canary model lookup, and `openai`'s whole judgement).
    models_path: str | None = "/v1/models"
    # A route that says whether the engine paused itself on purpose (vLLM's GET /is_paused, SGLang's
    # GET /ready), and how its answer reads ((status, body) -> True paused, False not, None unreadable). Asked in the background, only
    # when the next read could be stuck, or an idle-looking server's canary failed (verdict.pause_ask_due).
    pause_path: str | None = None
    pause_answer: Callable[[int, bytes], bool | None] | None = None
    # The pause route says the pause alone, so it is asked a poll before each idle canary too (vLLM's
    # /is_paused: a paused vLLM's page can read nothing pending). Not SGLang's /ready: 0.5.23 answers
    # 503 as well after a /health_generate timed out, until one succeeds, and an idle SGLang so
    # marked would read `paused` and get no canary (its real tier, after the hang drill).
    pause_before_canary: bool = False
    # A response header of /metrics whose value is an opaque restart token (compared for inequality).
    restart_header: str | None = None
    # Seconds the server keeps an idle connection open, where each connection holds one thread of a
    # pool its clients can fill: the poller keeps its connection open between polls (exporter/keep_warm.py)
    # with a request to its first health route. None: no need.
    keep_alive: float | None = None
    facts: EngineFacts = EngineFacts()
    # The idle canary; None: a 1-token OpenAI completion (llm_vitals/exporter/canary.py).
    canary: Canary | None = None
    # Where the target model's own config is read ("{model}": its name) and how; None: never read.
    model_config_path: str | None = None
    model_config: Callable[[bytes], ModelConfig] | None = None
    # The canary of a model whose config says decoupled (Triton: its generate-stream route).
    decoupled_canary: Canary | None = None
    # (snapshot, unit) -> True when the page carries a signal of that unit's that moves with its
    # responses or iterations (TensorRT-LLM's iteration counter, the vLLM backend's tokens).
    in_flight_signal: Callable[[PageReading, str], bool] | None = None

    def metrics_url(self, target: WatchedTarget) -> str:
        """Where this target's page is read: its `metrics_url`, else the engine's port or its url."""
        if target.metrics_url is not None:
            return str(target.metrics_url)
        if self.metrics_port is not None:
            url = target.url
            # pydantic gives an IPv6 host with its brackets already.
            return f"{url.scheme}://{url.host or ''}:{self.metrics_port}{self.metrics_path}"
        return target.base_url + self.metrics_path


def header(headers: Mapping[str, str], name: str) -> str | None:
    """A response header's value (case-insensitive name), stripped and capped; None when absent or blank."""
    value = headers.get(name)
    if value is None:  # a plain dict in tests; aiohttp's CIMultiDict already ignores case
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    value = value.strip()[:200] if value is not None else None
    return value or None
