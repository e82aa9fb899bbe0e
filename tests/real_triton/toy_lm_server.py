#!/usr/bin/env python3
"""The real-Triton tier's model server: PyTriton (Triton 2.51) serving a CPU-only toy "language model".

Each request asks for N "tokens" in its INT32 input `max_tokens`; every token is a fixed chunk of
numpy matmul work (TOY_DIM wide) plus a fixed wait (TOY_TOKEN_SECONDS), so a request takes time in
proportion to N, as a generation does. The wait is what makes a request last about as long on a
fast idle box as on a loaded one: matmul work alone finished so fast on a quiet box that requests
never queued. Two model instances are two parallel slots: a third request waits in Triton's
scheduler queue, which is all `nv_inference_pending_request_count` counts. It is not an LLM:
Triton's metrics do not care.

Processes: this Python process runs the infer functions (the real work) -> child `tritonserver`
(HTTP, gRPC, metrics, scheduler) -> one `triton_python_backend_stub` per model instance.

usage: python toy_lm_server.py --http-port P --grpc-port P --metrics-port P
Run it with the Python of the tier's venv (tools/real-triton-setup.sh), made from the system python3.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

MODEL = "toy_lm"
INSTANCES = 2
DIM = int(os.environ.get("TOY_DIM", "256"))
TOKEN_SECONDS = float(os.environ.get("TOY_TOKEN_SECONDS", "0"))


def one_token(state: np.ndarray) -> np.ndarray:
    """One "token": a few float32 matmuls and the fixed wait (both drop the GIL: the two instances run in parallel)."""
    for _ in range(4):
        state = np.tanh(state @ state * 0.05)
    if TOKEN_SECONDS:
        time.sleep(TOKEN_SECONDS)
    return state


def make_infer():
    """One instance's infer function: N tokens of work, answers N."""

    @batch
    def infer(max_tokens: np.ndarray) -> dict[str, np.ndarray]:
        n = int(max_tokens.reshape(-1)[0])
        state = np.random.default_rng(0).standard_normal((DIM, DIM)).astype(np.float32)
        for _ in range(n):
            state = one_token(state)
        return {"generated": np.full((max_tokens.shape[0], 1), n, dtype=np.int32)}

    return infer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    args = parser.parse_args()
    config = TritonConfig(
        http_address="127.0.0.1",
        grpc_address="127.0.0.1",
        metrics_address="127.0.0.1",
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        allow_cpu_metrics=True,
        metrics_interval_ms=1000,
    )
    with Triton(config=config) as triton:
        triton.bind(
            model_name=MODEL,
            infer_func=[make_infer() for _ in range(INSTANCES)],
            inputs=[Tensor(name="max_tokens", dtype=np.int32, shape=(1,))],
            outputs=[Tensor(name="generated", dtype=np.int32, shape=(1,))],
            config=ModelConfig(max_batch_size=1),
            strict=True,
        )
        print("toy_lm_server: serving", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
