"""Quick checks of the real-Triton tier's own tools; these run in the normal suite (no Triton needed).

The kit's checks (load, report, the exporter config, setup scripts' skips) are in tests/real_engine/.
"""

from __future__ import annotations

from .triton_server import TritonServer


def test_a_tritonserver_that_died_by_itself_is_named_with_its_crash_lines(tmp_path):
    """The frozen worker's drill relaunches a Triton that crashed (its Python backend's own fault) and says why."""
    log = tmp_path / "triton.log"
    log.write_text(
        'I1203 23:08:35.005321 1428 model_lifecycle.cc:839] "successfully loaded \'toy_lm\'"\n'
        "Signal (11) received.\n"
        " 6# TRITONBACKEND_ModelInstanceExecute in libtriton_python.so\n"
        "terminate called after throwing an instance of 'boost::interprocess::lock_exception'\n"
        "  what():  boost::interprocess::lock_exception\n"
        "Triton Inference Server exited with failure. Please wait.\n"
    )
    server = TritonServer(port=1, log_dir=tmp_path, grpc_port=2, metrics_port=3, starts=[{"seconds": 1.0, "pid": 0, "log": str(log)}])
    assert server.crash() == (
        "Signal (11) received.; terminate called after throwing an instance of 'boost::interprocess::lock_exception'; "
        "what():  boost::interprocess::lock_exception; Triton Inference Server exited with failure. Please wait."
    )
