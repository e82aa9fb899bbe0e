"""Engine adapters: each turns what a server kind exposes into one engine-neutral `Snapshot`."""

from __future__ import annotations

from dataclasses import dataclass

from llm_vitals.targets import PollErrorReason


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One read of an engine's own counters, summed over its engines (data parallel ranks).

    Counters are None when the page does not carry them; gauges running/waiting are always present.
    """

    running: float
    waiting: float
    steps: float | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    finished: float | None = None
    kv_usage: float | None = None
    process_start_time: float | None = None

    # The counters that only ever grow within one process lifetime.
    MONOTONE = ("steps", "generation_tokens", "prompt_tokens", "finished")
    # Every signal whose movement counts as progress (KV usage moves during a long chunked prefill).
    PROGRESS = ("steps", "generation_tokens", "prompt_tokens", "finished", "kv_usage")

    @property
    def pending(self) -> bool:
        return self.running > 0 or self.waiting > 0

    def counters(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in self.PROGRESS}


class PageError(Exception):
    """A page that cannot be turned into a snapshot. `reason` is the poll-error label."""

    def __init__(self, reason: PollErrorReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
