"""The exporter's settings for the llama.cpp drills, and the one config file they run with.

poll 1 s and stuck_after 6 s, as the vLLM drills. stuck_after must cover one prefill batch: a long
prompt moves llamacpp:n_decode_total once per `-b` tokens. The recipe's 86M model prefilled ~140
tokens/s on the 2-core box (~15 s per 2048-token batch, which would need stuck_after >= 30 s); the
tier's 3.4M model is far faster, and the server runs with -b 256 besides, so that one batch stays
well under stuck_after even on a box loaded by other work.
metrics_timeout 2 s: llama-server answers /metrics in under 40 ms even while busy, and a read it
accepts but never answers (the process stopped, or its loop wedged outside a decode) is the fact the
verdict judges as `metrics_unanswered`; a short timeout keeps each such poll short.
"""

from __future__ import annotations

TARGET = "real-llamacpp"
POLL_INTERVAL_S = 1.0
STUCK_AFTER_S = 6.0
METRICS_TIMEOUT_S = 2.0
CANARY_INTERVAL_S = 3.0
CANARY_TIMEOUT_S = 10.0


def exporter_config(listen_port: int, url: str) -> str:
    """The exporter config (YAML) for one llama.cpp target at `url`."""
    return f"""\
listen: "127.0.0.1:{listen_port}"
poll_interval: {POLL_INTERVAL_S:g}s
metrics_timeout: {METRICS_TIMEOUT_S:g}s
targets:
  - name: {TARGET}
    url: {url}
    engine: llamacpp
    role: backend
    stuck_after: {STUCK_AFTER_S:g}s
    startup_grace: 5m
    canary: {{interval: {CANARY_INTERVAL_S:g}s, timeout: {CANARY_TIMEOUT_S:g}s}}
"""
