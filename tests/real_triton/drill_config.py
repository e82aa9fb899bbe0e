"""The exporter settings the Triton drills run with, and the load they send."""

from __future__ import annotations

from .triton_server import MODEL, infer_body

TARGET = "real-triton"
POLL_INTERVAL_S = 1.0
# Triton's counters move only when a request completes: stuck_after must exceed the longest request.
# The drills' requests take well under a second alone and a few seconds at most on the loaded 2-core
# box with the server niced; 10 s leaves room.
STUCK_AFTER_S = 10.0
# Shorter than the default 2 x stuck_after, to keep the worker's freeze short: a PyTriton worker
# SIGSTOPped for ~30 s and resumed crashed tritonserver a minute later (boost::interprocess::
# lock_exception); the recipe's 20 s freeze recovered cleanly.
LIVENESS_BUDGET_S = STUCK_AFTER_S + 5.0
CANARY_INTERVAL_S = 3.0
CANARY_TIMEOUT_S = 10.0
CANARY_TOKENS = 1  # the smallest request the toy model takes
# Triton's metrics port answered in milliseconds even while saturated (its own threads, apart from
# inference); 5 s is room for a starved box. It also bounds each poll of a frozen tritonserver,
# whose metrics port accepts and never answers: `stuck` comes after stuck_after + 2 such polls.
METRICS_TIMEOUT_S = 5.0


def exporter_config(listen_port: int, url: str, metrics_url: str) -> str:
    """The exporter config (YAML) for one Triton target: its own metrics port, model and v2 canary."""
    body = infer_body(CANARY_TOKENS)["inputs"][0]
    return f"""\
listen: "127.0.0.1:{listen_port}"
poll_interval: {POLL_INTERVAL_S:g}s
metrics_timeout: {METRICS_TIMEOUT_S:g}s
targets:
  - name: {TARGET}
    url: {url}
    metrics_url: {metrics_url}
    engine: triton
    model: {MODEL}
    role: backend
    stuck_after: {STUCK_AFTER_S:g}s
    liveness_budget: {LIVENESS_BUDGET_S:g}s
    startup_grace: 5m
    canary:
      interval: {CANARY_INTERVAL_S:g}s
      timeout: {CANARY_TIMEOUT_S:g}s
      request:
        inputs:
          - {{name: {body['name']}, shape: {body['shape']}, datatype: {body['datatype']}, data: {body['data']}}}
"""
