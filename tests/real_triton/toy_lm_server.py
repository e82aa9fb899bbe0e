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

Model control, for the drill that loads and unloads models (issue 23, part 7): SIGUSR1 loads the
next extra model (`toy_lm_b`, then `toy_lm_c`, ...), SIGUSR2 unloads the last one loaded. Both go
through PyTriton (bind, and its own registry kept in step with an unload), so its monitor never
reads the unloaded model as a dead server. The extra models have one instance each (EXTRA_INSTANCES:
PyTriton's second-instance handshake races the first instance's listen() under load). A second version of one name cannot be loaded:
PyTriton 0.7.0 binds every version of a model to the same data socket ("Address already in use"),
and a name loaded again after an unload fails its handshake; version changes are table-tested on
real pages instead (tests/test_engine_triton.py).

A model wedged in its own code, for the drill that freezes one unit (issue 29): SIGRTMIN holds
toy_lm's infer functions before their next token, SIGRTMIN+1 lets them go on. Its requests then stay
queued in Triton and its stubs stay healthy, while the extra models serve. (SIGSTOP of toy_lm's
stubs shows no such thing: Triton's Python backend finds a stopped stub unhealthy within ~2 s and
fails its requests with HTTP 500, "Stub process 'toy_lm_0_0' is not healthy", leaving none queued.)

A decoupled (streaming) model, for the drill of issue 38: SIGRTMIN+2 binds `toy_lm_stream`
(`decoupled=True`, one instance: a generator yielding one response per token, as the vLLM backend
and TensorRT-LLM streaming answer), SIGRTMIN+3 holds its generators before their next token (a hung
streaming model: its requests accepted, no response ever), SIGRTMIN+4 lets them go on.

usage: python toy_lm_server.py --http-port P --grpc-port P --metrics-port P
Run it with the Python of the tier's venv (tools/real-triton-setup.sh), made from the system python3.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import signal
import threading
import time

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

MODEL = "toy_lm"
EXTRA = ("toy_lm_b", "toy_lm_c", "toy_lm_d")  # loaded in turn on SIGUSR1, the last one unloaded on SIGUSR2
INSTANCES = 2
# The extra models, bound on a running (and, in the drill, saturated) server, have one instance each.
# PyTriton 0.7.0's stub for a model's second instance connects to the first instance's handshake and
# data sockets as soon as their files exist (proxy/model.py polls `exists()`, then connects), which is
# between the first instance's bind() and listen(): a Unix socket bound but not yet listening refuses.
# On a busy 2-core box that window was wide enough to be hit (a cold CI run: `ConnectionRefusedError`
# in toy_lm_d's initialize, "toy_lm_d never ready"). One instance has no second handshake; the
# PyTriton side connects only after Triton reports the model loaded, when both sockets listen.
EXTRA_INSTANCES = 1
HOLD_SIGNAL = signal.SIGRTMIN  # toy_lm's infer functions wait before their next token
RELEASE_SIGNAL = signal.SIGRTMIN + 1  # and go on
# Set while toy_lm may run; cleared by HOLD_SIGNAL. Only toy_lm waits on it: the extra models serve on.
TOY_LM_RUNS = threading.Event()
TOY_LM_RUNS.set()
STREAM = "toy_lm_stream"
STREAM_BIND_SIGNAL = signal.SIGRTMIN + 2
STREAM_HOLD_SIGNAL = signal.SIGRTMIN + 3
STREAM_RELEASE_SIGNAL = signal.SIGRTMIN + 4
STREAM_RUNS = threading.Event()
STREAM_RUNS.set()
DIM = int(os.environ.get("TOY_DIM", "256"))
TOKEN_SECONDS = float(os.environ.get("TOY_TOKEN_SECONDS", "0"))


def one_token(state: np.ndarray) -> np.ndarray:
    """One "token": a few float32 matmuls and the fixed wait (both drop the GIL: the two instances run in parallel)."""
    for _ in range(4):
        state = np.tanh(state @ state * 0.05)
    if TOKEN_SECONDS:
        time.sleep(TOKEN_SECONDS)
    return state


def make_infer(name: str):
    """One instance's infer function for the model `name`: N tokens of work, answers N (toy_lm's may be held)."""

    @batch
    def infer(max_tokens: np.ndarray) -> dict[str, np.ndarray]:
        n = int(max_tokens.reshape(-1)[0])
        state = np.random.default_rng(0).standard_normal((DIM, DIM)).astype(np.float32)
        for _ in range(n):
            if name == MODEL:
                TOY_LM_RUNS.wait()
            state = one_token(state)
        return {"generated": np.full((max_tokens.shape[0], 1), n, dtype=np.int32)}

    return infer


def wait_alive(triton: Triton, name: str, within_s: float = 60.0) -> None:
    """Until the handlers of the model just bound answer (or `within_s` passed)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and not all(
            m.is_alive() for m in list(triton._model_manager.models) if m.model_name == name):
        time.sleep(0.2)


def stream_infer(requests):
    """toy_lm_stream's infer function: one response per token, as they are made (it may be held)."""
    for request in requests:
        n = int(request["max_tokens"].reshape(-1)[0])
        state = np.random.default_rng(0).standard_normal((DIM, DIM)).astype(np.float32)
        for i in range(n):
            STREAM_RUNS.wait()
            state = one_token(state)
            yield [{"generated": np.array([i + 1], dtype=np.int32)}]


def bind_stream(triton: Triton, settling: set[str]) -> None:
    """Bind the decoupled model on the running server (in a thread: never in a signal handler)."""
    settling.add(STREAM)
    try:
        triton.bind(
            model_name=STREAM,
            infer_func=stream_infer,
            inputs=[Tensor(name="max_tokens", dtype=np.int32, shape=(1,))],
            outputs=[Tensor(name="generated", dtype=np.int32, shape=(1,))],
            config=ModelConfig(batching=False, decoupled=True),
            strict=True,
        )
        print(f"toy_lm_server: loaded {STREAM}", flush=True)
        wait_alive(triton, STREAM)
    except Exception:
        logging.exception("toy_lm_server: load of %s failed", STREAM)
    settling.discard(STREAM)


def bind_toy(triton: Triton, name: str, version: int = 1, instances: int = INSTANCES) -> None:
    """Bind (and, on a running server, load) the toy model under `name` and `version`, with `instances` instances."""
    triton.bind(
        model_name=name,
        model_version=version,
        infer_func=[make_infer(name) for _ in range(instances)],
        inputs=[Tensor(name="max_tokens", dtype=np.int32, shape=(1,))],
        outputs=[Tensor(name="generated", dtype=np.int32, shape=(1,))],
        config=ModelConfig(max_batch_size=1),
        strict=True,
    )


def unload(triton: Triton, name: str, http_port: int) -> None:
    """Unload `name` from Triton and drop it from PyTriton's registry (PyTriton 0.7.0 has no unbind)."""
    from tritonclient.http import InferenceServerClient

    client = InferenceServerClient(f"127.0.0.1:{http_port}")
    try:
        # PyTriton restricts the repository API to its own token.
        client.unload_model(name, headers={"triton-access-token": triton.get_access_token()})
    finally:
        client.close()
    # PyTriton's monitor (Triton.serve) stops the whole server when a registered model's handlers
    # are gone, which an unloaded model's are: drop it from the registry too.
    models = triton._model_manager._models  # (name, version) -> Model
    for key in [key for key in models if key[0] == name]:
        models.pop(key).clean()


def control(triton: Triton, http_port: int, orders: queue.Queue[str], settling: set[str]) -> None:
    """Carry out the signals' orders in a thread (never in a signal handler): load the next extra model, or unload.

    A model is in `settling` while it is loaded or unloaded, and until its handlers answer."""
    loaded: list[str] = []
    for name in EXTRA:
        order = orders.get()
        while order == "unload":
            if loaded:
                settling.add(loaded[-1])
                try:
                    unload(triton, loaded[-1], http_port)
                    print(f"toy_lm_server: unloaded {loaded[-1]}", flush=True)
                except Exception:
                    logging.exception("toy_lm_server: unload failed")
                settling.discard(loaded.pop())
            order = orders.get()
        settling.add(name)
        try:
            bind_toy(triton, name, instances=EXTRA_INSTANCES)
            loaded.append(name)
            print(f"toy_lm_server: loaded {name}", flush=True)
            wait_alive(triton, name)
        except Exception:
            logging.exception("toy_lm_server: load of %s failed", name)
        settling.discard(name)


def watch_settled(triton: Triton, settling: set[str]) -> None:
    """PyTriton's own monitor (Triton.serve) stops the server when any registered model's handlers are
    not alive, which they are not for a moment while a model is bound on a running server: that killed
    the drill's server at random loads. Judge the server and the settled models only."""

    def alive() -> bool:
        return triton._is_alive_impl() and all(
            m.is_alive() for m in list(triton._model_manager.models) if m.model_name not in settling)

    triton.is_alive = alive  # type: ignore[method-assign]


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
    # The orders are taken before the model is bound: the launcher calls the server ready once toy_lm
    # is, and a SIGUSR1 sent then, before its handler, killed the process (the signal's default action).
    orders: queue.Queue[str] = queue.Queue()
    signal.signal(signal.SIGUSR1, lambda *_: orders.put("load"))
    signal.signal(signal.SIGUSR2, lambda *_: orders.put("unload"))
    signal.signal(HOLD_SIGNAL, lambda *_: TOY_LM_RUNS.clear())
    signal.signal(RELEASE_SIGNAL, lambda *_: TOY_LM_RUNS.set())
    signal.signal(STREAM_HOLD_SIGNAL, lambda *_: STREAM_RUNS.clear())
    signal.signal(STREAM_RELEASE_SIGNAL, lambda *_: STREAM_RUNS.set())
    settling: set[str] = set()
    triton_box: list[Triton] = []
    signal.signal(STREAM_BIND_SIGNAL, lambda *_: threading.Thread(
        target=bind_stream, args=(triton_box[0], settling), name="stream", daemon=True).start() if triton_box else None)
    with Triton(config=config) as triton:
        bind_toy(triton, MODEL)
        watch_settled(triton, settling)
        triton_box.append(triton)
        threading.Thread(target=control, args=(triton, args.http_port, orders, settling), name="models", daemon=True).start()
        print("toy_lm_server: serving", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
