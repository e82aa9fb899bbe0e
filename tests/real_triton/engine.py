"""The real-Triton tier's engine for the shared drills: Triton 2.51 (nvidia-pytriton 0.7.0) serving the toy model.

Its launcher is triton_server.py; its fault hooks freeze the PyTriton Python process (the worker:
it runs the infer functions, so HTTP stays alive) and freeze or kill `tritonserver` itself; its
facts are below. Triton's metrics live on a port of their own, and count only *queued* requests.
"""

from __future__ import annotations

import httpx
import psutil
from real_engine.engine import Counted, Engine, Kit, Probe, sigstopped
from real_engine.harness import ExporterSettings
from real_engine.launcher import ServerProcess, free_port
from real_engine.load import Load, sample_sum
from real_tier import RealTier

from .triton_server import INSTANCES, MODEL, VERSION, TritonServer, infer_body, setup_missing

INFER = f"/v2/models/{MODEL}/infer"
# 8 clients in flight on 2 instances (max_batch_size 1): 6 queued as long as the load lasts. A
# 50-"token" request lasts ~1 s on any box (20 ms of wait a token, triton_server.TOY_TOKEN_SECONDS)
# and a few seconds when the niced server is starved, far below stuck_after, so completions keep
# coming while the queue is long: the saturation load lasts ~12 s (24 requests / 2 instances), a
# fault drill's up to ~20 s.
LOAD_TOKENS = 50
SATURATION_REQUESTS = 24
FAULT_REQUESTS = 40
CONCURRENCY = 8
# prometheus-client's parser names Triton's suffix-less counter samples `..._total`.
PENDING = "nv_inference_pending_request_count"

EXPORTER = ExporterSettings(
    target="real-triton",
    engine="triton",
    # Triton's counters move only when a request completes: stuck_after must exceed the longest
    # request. The drills' requests take well under a second alone and a few seconds at most on the
    # loaded 2-core box with the server niced; 10 s leaves room.
    stuck_after=10.0,
    # Shorter than the default 2 x stuck_after, to keep the worker's freeze short: a PyTriton worker
    # SIGSTOPped for ~30 s and resumed crashed tritonserver a minute later (boost::interprocess::
    # lock_exception); the recipe's 20 s freeze recovered cleanly.
    liveness_budget=15.0,
    # Triton's metrics port answered in milliseconds even while saturated (its own threads, apart
    # from inference); 5 s is room for a starved box. It also bounds each poll of a frozen
    # tritonserver, whose metrics port accepts and never answers.
    metrics_timeout=5.0,
    canary_request=infer_body(1),  # the smallest request the toy model takes
)


class TritonEngine(Engine):
    key = "triton"
    name = "Triton"
    tier = RealTier("Triton", enable="LLM_VITALS_REAL_TRITON", require="LLM_VITALS_REQUIRE_REAL_TRITON")
    drills = ("smoke", "idle", "saturation", "frozen_worker", "frozen_tritonserver", "kill", "restart", "models",
              "unit_frozen", "decoupled")
    exporter = EXPORTER
    families = (PENDING, "nv_inference_exec_count", "nv_inference_request_success", "nv_inference_request_failure",
                "nv_inference_compute_infer_duration_us")
    openai_model = None  # no /v1/models: KServe v2 routes only
    answered = Counted("nv_inference_request_success_total", "request_success_delta", exact=True)
    saturation_requests = SATURATION_REQUESTS
    # Triton has no queue-time histogram: the exporter must have read requests waiting.
    min_waiting_seen = 1
    # The last INSTANCES requests run with nothing queued, which Triton's counters cannot tell from
    # idle: the exporter may send a canary to each of them.
    canaries_after_load = 1 + INSTANCES
    # SIGSTOP of the worker: /v2/health/* and the model's ready route answer 200 with frozen counters.
    frozen_probe = Probe(("/v2/health/live", f"/v2/models/{MODEL}/ready"), 200)
    fault_outcomes_ok = True

    def facts(self) -> dict:
        return {"version": VERSION, "model": MODEL, "instances": INSTANCES}

    def setup_missing(self) -> str | None:
        return setup_missing()

    def launcher(self) -> TritonServer:
        return TritonServer(port=free_port(), log_dir=self.log_dir)

    def target_keys(self, server: ServerProcess) -> dict:
        return {"metrics_url": server.metrics_url, "model": MODEL}

    def smoke(self, kit: Kit) -> dict:
        """v2 health and infer answer; the toy model echoes the work it was asked for."""
        with httpx.Client(timeout=20) as client:
            for path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{MODEL}/ready"):
                assert client.get(kit.server.url + path).status_code == 200, path
            answer = client.post(kit.server.url + INFER, json=infer_body(3))
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [3], answer.text
        return {}

    def working(self, page: str) -> bool:
        return sample_sum(page, PENDING) > 0

    def saturation_load(self, server: ServerProcess) -> Load:
        return Load.batch(server.url, INFER, [infer_body(LOAD_TOKENS)] * SATURATION_REQUESTS, CONCURRENCY)

    def fault_load(self, server: ServerProcess) -> Load:
        return Load.batch(server.url, INFER, [infer_body(LOAD_TOKENS)] * FAULT_REQUESTS, CONCURRENCY)

    def freeze_engine(self, kit: Kit, load: Load):
        """SIGSTOP of the PyTriton Python process running the infer functions; tritonserver answers on."""
        return sigstopped(kit.server.main_process())

    def freeze_server(self, kit: Kit, load: Load):
        """SIGSTOP of tritonserver itself with requests queued: every port accepts and never answers."""
        return sigstopped(kit.server.find("tritonserver"))

    def kill_target(self, server: ServerProcess) -> psutil.Process:
        """tritonserver: in-flight requests fail at once, and the PyTriton process exits by itself."""
        return server.find("tritonserver")

    def crash(self, server: ServerProcess) -> str | None:
        assert isinstance(server, TritonServer)
        return server.crash()


ENGINE = TritonEngine()
