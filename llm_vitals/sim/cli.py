"""`llm-vitals-sim`: run a fleet of simulated LLM servers (vLLM 0.32 by default, `--engine`) until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from pydantic import ValidationError

from llm_vitals.config_cli import add_version_option
from llm_vitals.logs import log_event, setup_logging
from llm_vitals.sim.config import SimConfig
from llm_vitals.sim.engines.table import SIM_ENGINES
from llm_vitals.sim.fleet import Fleet

log = logging.getLogger("llm_vitals.sim")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm-vitals-sim",
        description="Simulate a fleet of vLLM 0.32 OpenAI-compatible servers: continuous batching, chunked "
                    "prefill, the real /metrics page, and faults on command (hang, freeze, die, restart, slow).",
        epilog="Faults: POST /admin/fault {\"fault\": \"hang\"} on a backend, or POST /backends/{i}/fault on the "
               "control server (which also brings a dead backend back with POST /backends/{i}/restart).",
    )
    add_version_option(parser)
    defaults = SimConfig()
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8101, help="port of backend 0; backend i listens on port + i "
                                                               "(default: %(default)s)")
    parser.add_argument("--engine", default="vllm", choices=sorted(SIM_ENGINES),
                        help="which server kind to simulate: its /metrics page, health routes and API "
                             "(default: %(default)s)")
    parser.add_argument("--backends", type=int, default=1, help="number of servers (default: %(default)s)")
    parser.add_argument("--proxy", type=int, metavar="PORT", help="also run a least-connection proxy on PORT")
    parser.add_argument("--control-port", type=int, metavar="PORT",
                        help="fleet control server port (default: the port after the last backend)")
    parser.add_argument("--no-control", action="store_true", help="run no control server")
    parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs,
                        help="running slots per server (default: %(default)s)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens,
                        help="token budget per engine step, the prefill chunk (default: %(default)s)")
    parser.add_argument("--tokens-per-second", type=float, default=defaults.tokens_per_second,
                        help="decode steps per second (default: %(default)s)")
    parser.add_argument("--prefill-tokens-per-second", type=float, default=defaults.prefill_tokens_per_second,
                        help="prompt tokens computed per second (default: %(default)s)")
    parser.add_argument("--startup-seconds", type=float, default=defaults.startup_seconds,
                        help="loading period after a restart (default: %(default)s)")
    parser.add_argument("--model", default=defaults.model, help="served model name (default: %(default)s)")
    parser.add_argument("--max-model-len", type=int, default=defaults.max_model_len,
                        help="context length in tokens (default: %(default)s)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def config_from_args(args: argparse.Namespace) -> SimConfig:
    return SimConfig(
        engine=args.engine, model=args.model, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, tokens_per_second=args.tokens_per_second,
        prefill_tokens_per_second=args.prefill_tokens_per_second, startup_seconds=args.startup_seconds,
        kv_cache_tokens=max(SimConfig().kv_cache_tokens, args.max_model_len),
    )


async def run(args: argparse.Namespace, config: SimConfig) -> int:
    control = not args.no_control
    control_port = args.control_port if args.control_port is not None else args.port + args.backends
    fleet = Fleet(config, backends=args.backends, proxy=args.proxy is not None, control=control, host=args.host,
                  port=args.port, proxy_port=args.proxy or 0, control_port=control_port)
    try:
        await fleet.start()
    except OSError as exc:
        print(f"llm-vitals-sim: cannot listen: {exc}", file=sys.stderr)
        return 2
    for backend in fleet.backends:
        print(f"backend {backend.index}: {backend.url}  ({config.engine}, model {config.model!r}, "
              f"max_num_seqs {config.max_num_seqs})")
    if fleet.proxy_url:
        print(f"proxy:     {fleet.proxy_url}  (least-connection over /v1/* and /metrics)")
    if fleet.control_url:
        print(f"control:   {fleet.control_url}/backends  (POST /backends/{{i}}/fault, /backends/{{i}}/restart)")
    print("Ctrl-C to stop.", flush=True)
    log_event(log, "fleet up", backends=fleet.backend_urls, proxy=fleet.proxy_url, control=fleet.control_url)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    waiters = [asyncio.create_task(stop.wait())]
    if not control and fleet.proxy_url is None:
        # Nothing could bring a dead server back: exit with status 0, as vLLM's API server does.
        waiters.append(asyncio.create_task(fleet.all_dead.wait()))
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for waiter in waiters:
        waiter.cancel()
    await fleet.stop()
    log_event(log, "fleet stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    if args.backends < 1:
        print("llm-vitals-sim: --backends must be at least 1", file=sys.stderr)
        return 2
    try:
        config = config_from_args(args)
    except ValidationError as exc:
        problems = "; ".join(f"--{'-'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}"
                             for e in exc.errors())
        print(f"llm-vitals-sim: bad option: {problems}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run(args, config))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
