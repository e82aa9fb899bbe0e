"""The rule for a model that answers in streams (Triton's decoupled models): which canary, and whether it can be judged.

Pure: the poller reads the model's own config (`Engine.model_config_path`) and the page, and asks
here once per read. docs/engines.md ("Triton: decoupled models") says why:

- its canary goes to the route the model serves: the engine's decoupled canary (Triton: the
  generate-stream route, its first event read within the canary's timeout); the plain infer route
  answers such a model 501, which no restart changes. A model whose config could not be read yet
  keeps the plain canary: a 501 from it is a rejection (canary_rejected), never a failure;
- Triton counts a decoupled model's request when it is handed to the model, not as its responses
  go out, and never counts it pending while it streams. Only a signal of the model's own that moves
  per iteration or token (TensorRT-LLM's iteration counter, the vLLM backend's tokens) shows it
  working or hung. Without one the model is *unjudged*: nothing pending and nothing moving says
  nothing about it, so its canary, which may wait behind streams no counter shows, vouches when it
  answers and is never counted toward `unresponsive` (a restart) when it does not.
"""

from __future__ import annotations

from llm_vitals.exporter.engines import Canary, Engine, ModelConfig, PageReading, Unjudged

# A model config that could not be read is asked again after this long (PyTriton's locked APIs answer 403).
CONFIG_RETRY_SECONDS = 30.0


def canary_for(entry: Engine, config: ModelConfig | None) -> Canary | None:
    """The engine's canary for a model with this config (None: the engine has none of its own)."""
    if config is not None and config.decoupled and entry.decoupled_canary is not None:
        return entry.decoupled_canary
    return entry.canary


def config_due(entry: Engine, model: str | None, config: ModelConfig | None, last_tried: float | None,
               now: float, retry_after: float) -> bool:
    """Whether this poll should read the model's config: not known yet, and not tried within `retry_after`."""
    if entry.model_config_path is None or not model or config is not None:
        return False
    return last_tried is None or now - last_tried >= retry_after


def unjudged(entry: Engine, model: str | None, config: ModelConfig | None, snapshot: PageReading) -> Unjudged | None:
    """The target's model when it is decoupled and the page has no signal of its own that moves mid-stream."""
    if not model or config is None or not config.decoupled:
        return None
    if entry.in_flight_signal is not None and entry.in_flight_signal(snapshot, model):
        return None
    return Unjudged(f'model="{model}"', (
        f"model {model} is decoupled (it answers in streams): {entry.name} counts its requests when they are handed "
        f"to it, not its responses, and none while they stream, and the page has no signal of its own that moves "
        f"per iteration or token; its canary vouches when it answers, and a failed one is never a restart"))
