"""The simulator's settings: one validated object shared by the CLI, the fleet and the engine."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

VLLM_VERSION = "0.32.0"


class SimConfig(BaseModel):
    """How every simulated server in a fleet behaves (all backends share it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # A key of llm_vitals/sim/engines/table.py's SIM_ENGINES (checked by the Fleet and the CLI's choices).
    engine: str = Field("vllm", description="which server kind to simulate: its page, health and routes")
    model: str = Field("tiny", min_length=1, description="served model name (the model_name label)")
    max_model_len: int = Field(2048, ge=16, description="longest prompt + completion, in tokens")
    max_num_seqs: int = Field(4, ge=1, description="continuous-batching slots (requests running at once)")
    max_num_batched_tokens: int = Field(512, ge=1, description="token budget of one engine step (prefill chunk size)")
    tokens_per_second: float = Field(200.0, gt=0, description="decode steps per second (each running request gets one token per step)")
    # Prefill is far faster per token than decode on a real server (~80x on the captured CPU box);
    # a chunk of N prompt tokens adds N / prefill_tokens_per_second to the step time.
    prefill_tokens_per_second: float = Field(8000.0, gt=0, description="prompt tokens computed per second during prefill")
    startup_seconds: float = Field(2.0, ge=0, description="loading period after a restart, connections refused meanwhile")
    block_size: int = Field(16, ge=1, description="KV-cache block size in tokens")
    kv_cache_tokens: int = Field(65536, ge=16, description="KV-cache capacity in tokens (kv_cache_usage_perc denominator)")
    die_close_delay: float = Field(0.1, ge=0, description="seconds /health answers 503 after `die` before the port closes")

    @model_validator(mode="after")
    def _kv_fits_one_request(self) -> SimConfig:
        if self.kv_cache_tokens < self.max_model_len:
            raise ValueError(
                f"kv_cache_tokens ({self.kv_cache_tokens}) must hold at least one full request "
                f"(max_model_len {self.max_model_len})"
            )
        return self

    @property
    def num_gpu_blocks(self) -> int:
        return self.kv_cache_tokens // self.block_size
